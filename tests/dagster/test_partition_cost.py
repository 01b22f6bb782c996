"""The cost of each partition: per-endpoint prices through Dagster config, and the metadata's
per-partition cost equal to the sum of the ledger's per-row costs."""

import re

import dagster as dg
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, ManagedEndpoint, Price

MODEL = "sim-model"


def test_the_resource_takes_prices_per_endpoint_in_code_and_in_config():
    llm = BatchInferenceResource(
        endpoints=[Endpoint(name="a", base_url="http://127.0.0.1:9/v1", models=[MODEL],
                            prices={MODEL: Price(0.1, 0.2, cached_input_per_mtok=0.05)}),
                   Endpoint(name="b", base_url="http://127.0.0.1:9/v1", models=[MODEL, "x"],
                            prices=Price(1.0, 2.0))],
        prices={"x": Price(3.0, 4.0)},
        store_url=None)
    settings = llm.to_settings()
    assert settings.price_at(MODEL, "a") == Price(0.1, 0.2, cached_input_per_mtok=0.05)
    assert settings.price_at("x", "b") == Price(1.0, 2.0)  # the endpoint's own wins

    seen = {}

    @dg.asset
    def prices_seen(llm: BatchInferenceResource) -> None:
        seen["b"] = llm.to_settings().price_at(MODEL, "b")

    # Run config (YAML's form): a mapping of the Price's fields, '*' for every model.
    run_config = {"resources": {"llm": {"config": {"endpoints": [
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [MODEL, "x"],
         "prices": {"*": {"input_per_mtok": 5.0, "output_per_mtok": 6.0}}}]}}}}
    assert dg.materialize([prices_seen], resources={"llm": llm}, run_config=run_config).success
    assert seen["b"] == Price(5.0, 6.0)


def test_resource_wide_prices_are_prices_in_code_and_in_yaml():
    """One price type: the resource's prices take Prices in code and the Price's own fields in
    config, the same mapping model -> price as an endpoint's ('*': every model)."""
    endpoint = Endpoint(name="a", base_url="http://127.0.0.1:9/v1", models=[MODEL, "x"])
    in_code = BatchInferenceResource(endpoints=[endpoint], store_url=None, prices={
        MODEL: Price(1.0, 2.0, batch_discount=0.25), "*": Price(3.0, 4.0)})
    in_yaml = BatchInferenceResource(endpoints=[endpoint], store_url=None, prices={
        MODEL: {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "batch_discount": 0.25},
        "*": {"input_per_mtok": 3.0, "output_per_mtok": 4.0}})
    for llm in (in_code, in_yaml):
        settings = llm.to_settings()
        assert settings.price_at(MODEL, "a") == Price(1.0, 2.0, batch_discount=0.25)
        assert settings.price_at("x", "a") == Price(3.0, 4.0)  # the resource's '*'
        assert settings.batch_price_for(MODEL) == (0.25, 0.5)


@pytest.mark.parametrize("price, says", [
    ({"input_per_mtok": -1.0, "output_per_mtok": 2.0},
     r"input_per_mtok is USD per million tokens, a number >= 0 .*got -1\.0"),
    ({"input_per_mtok": 1.0, "output_per_mtok": 2.0, "batch_discount": -1},
     r"batch_discount is the share of the online price the batch API charges, from 0 to 1"),
    ({"input_per_mtok": 1.0, "output_per_mtok": 2.0, "batch_discount": 2},
     r"got 2(\.0)?\. For batch prices that are no share of the online ones, set "
     r"batch_input_per_mtok"),
])
def test_a_wrong_price_is_refused_where_it_is_built(price, says):
    """In code (Price), in the resource's config and in an endpoint's: at construction, never
    at the first call."""
    with pytest.raises(ValueError, match=says):
        Price(**price)
    with pytest.raises(ValueError, match=says):
        BatchInferenceResource(endpoints=[Endpoint(name="a", base_url="http://127.0.0.1:9/v1",
                                                   models=[MODEL])], prices={MODEL: price})
    with pytest.raises(ValueError, match=says):
        Endpoint(name="a", base_url="http://127.0.0.1:9/v1", models=[MODEL],
                 prices={MODEL: price})


def test_a_price_of_a_model_no_endpoint_serves_is_refused_naming_it_and_the_served():
    endpoints = [Endpoint(name="a", base_url="http://127.0.0.1:9/v1", models=[MODEL],
                          embedding_models=["embedder"])]
    llm = BatchInferenceResource(endpoints=endpoints, store_url=None,
                                 prices={"sim-modle": Price(1.0, 2.0)})
    says = (r"Resource-wide prices name \['sim-modle'\], which no endpoint serves \(served: "
            r"\['embedder', 'sim-model'\]\)")
    with pytest.raises(ValueError, match=says):
        llm.to_settings()

    @dg.asset
    def nothing(llm: BatchInferenceResource) -> None:
        raise AssertionError("the resource cannot be built: the asset does not run")

    with pytest.raises(dg.DagsterResourceFunctionError) as built:  # as the run builds it
        dg.materialize([nothing], resources={"llm": llm})
    assert re.search(says, str(built.value.__cause__))
    # The embedded endpoint's models are served once it starts: priced before, no error.
    managed = BatchInferenceResource(
        endpoints=endpoints, managed_endpoints=[ManagedEndpoint(name="embedded")],
        store_url=None, prices={"local": Price(0.0, 0.0), MODEL: Price(1.0, 2.0)})
    # not started: no endpoint serves "local" yet, so its price waits
    assert managed.to_settings().prices == ((MODEL, Price(1.0, 2.0)),)


def _ledger_cost(ledger, partition: str, scope: str) -> float:
    """The SQL sum of the ledger's per-row costs of one partition of one asset."""
    import sqlalchemy as sa

    t = ledger.table
    with ledger.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.sum(t.c.cost_usd)).where(
            t.c.partition_key == partition, t.c.scope == scope)).scalar()


@pytest.mark.slow
def test_each_partitions_cost_in_the_metadata_is_the_sum_of_its_rows_costs_in_the_ledger(
        sim, make_llm_resource, instance):
    import pandas as pd

    from dagster_batchllm import build_inference_asset

    days = dg.StaticPartitionsDefinition(["a", "b"])

    @dg.asset(partitions_def=days)
    def tickets(context: dg.AssetExecutionContext) -> pd.DataFrame:
        n = 12 if context.partition_key == "a" else 7
        return pd.DataFrame({"text": [f"{context.partition_key} ticket {i}" for i in range(n)]})

    asset = build_inference_asset(name="triage", source=tickets, partitions_def=days,
                                  prompt="Triage: {text}", model=MODEL, output_column="label",
                                  max_tokens=12)
    # The endpoint's own price of the model, and a resource-wide price it overrides.
    llm = make_llm_resource(sim, endpoint_kwargs={"prices": {MODEL: Price(
        input_per_mtok=2.0, output_per_mtok=7.0, cached_input_per_mtok=0.5)}},
        prices={MODEL: Price(input_per_mtok=100.0, output_per_mtok=100.0)})
    for day in ("a", "b"):
        result = dg.materialize([tickets, asset], resources={"llm": llm}, instance=instance,
                                partition_key=day)
        assert result.success
        [materialized] = result.asset_materializations_for_node("triage")
        metadata = {k: v.value for k, v in materialized.metadata.items()}
        paid = _ledger_cost(llm.ledger, day, "triage")
        assert paid > 0
        assert metadata["batchllm/run/cost_usd"] == pytest.approx(paid, abs=1e-6)
        assert metadata["batchllm/answers/cost_usd"] == pytest.approx(paid, abs=1e-6)
        records = llm.ledger.records(day, "triage")
        assert records["cost_usd"].tolist() == pytest.approx(
            [(p * 2.0 + c * 7.0) / 1e6 for p, c in zip(
                records["prompt_tokens"], records["completion_tokens"], strict=True)])
    # A rerun of "a" is answered from the ledger: it pays nothing, its answers cost the same.
    again = dg.materialize([tickets, asset], resources={"llm": llm}, instance=instance,
                           partition_key="a")
    [materialized] = again.asset_materializations_for_node("triage")
    assert materialized.metadata["batchllm/run/cost_usd"].value == 0.0
    assert materialized.metadata["batchllm/answers/cost_usd"].value == pytest.approx(
        _ledger_cost(llm.ledger, "a", "triage"), abs=1e-6)


def test_the_asset_factory_and_the_component_take_a_budget_per_partition(
        sim, make_llm_resource, instance, tmp_path):
    import pandas as pd
    import yaml
    from dagster.components.testing import create_defs_folder_sandbox

    from dagster_batchllm import BatchInferenceComponent, build_inference_asset

    days = dg.StaticPartitionsDefinition(["a", "b"])

    @dg.asset(partitions_def=days)
    def tickets(context: dg.AssetExecutionContext) -> pd.DataFrame:
        n = 40 if context.partition_key == "a" else 2  # "a" may cost more than its budget
        return pd.DataFrame({"text": [f"{context.partition_key} ticket {i}" for i in range(n)]})

    price = Price(input_per_mtok=1_000.0, output_per_mtok=1_000.0)
    llm = make_llm_resource(sim, endpoint_kwargs={"prices": price})
    per_row = price.upper_bound(20, 12)  # about what one row's plan is
    asset = build_inference_asset(name="triage", source=tickets, partitions_def=days,
                                  prompt="Triage: {text}", model=MODEL, output_column="label",
                                  max_tokens=12, budget_usd=10 * per_row)
    refused = dg.materialize([tickets, asset], resources={"llm": llm}, instance=instance,
                             partition_key="a", raise_on_error=False)
    assert not refused.success
    assert "budget_usd" in str(refused.all_events) and sim.stats(log=False)["requests"] == 0
    paid = dg.materialize([tickets, asset], resources={"llm": llm}, instance=instance,
                          partition_key="b")
    assert paid.success and sim.stats(log=False)["requests"] == 2  # its own budget fits

    # The Component's YAML takes it as the call's other fields.
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / "budgeted"
        path.mkdir()
        (path / "defs.yaml").write_text(yaml.safe_dump({
            "type": "dagster_batchllm.BatchInferenceComponent",
            "attributes": {"name": "answers", "source": "questions", "prompt": "Q: {q}",
                           "model": "sim-model", "output_column": "answer",
                           "budget_usd": 0.25}}))
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, _defs):
            assert isinstance(component, BatchInferenceComponent)
            assert component.call_attributes()["budget_usd"] == 0.25
