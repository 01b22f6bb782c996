"""Batch mode in Dagster: an asset with mode="batch_api", wait=False, the batch-collect sensor,
the retry-partitions sensor leaving batch rows alone, cost at the batch price."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
from batch_helpers import MODEL, batch_stats

from dagster_batchllm import (
    BatchInferenceComponent,
    BatchInferenceResource,
    Endpoint,
    Price,
    build_batch_collect_sensor,
    build_inference_asset,
    build_retry_partitions_sensor,
)

PARTS = dg.StaticPartitionsDefinition(["d1", "d2"])
ROWS = 20
pytestmark = pytest.mark.timeout(120)


@dg.asset(partitions_def=PARTS)
def calls(context) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{context.partition_key} call {i}" for i in range(ROWS)]})


summaries = build_inference_asset(
    name="summaries", source=calls, prompt="Summarize: {text}", model=MODEL,
    output_column="summary", partitions_def=PARTS, mode="batch_api", wait=False)


@pytest.fixture
def instance(tmp_path):
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    yield instance
    instance.dispose()


def resource_for(sim, store_url: str) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="openai", base_url=sim.base_url, models=[MODEL],
                            api_key=sim.settings.api_key, batch_api=True)],
        prices={MODEL: Price(input_per_mtok=2.0, output_per_mtok=8.0)},
        store_url=store_url, batch_poll_initial_s=0.02, progress_interval_s=60.0)


def materialize(instance, llm, partition: str, **kwargs) -> dg.ExecuteInProcessResult:
    result = dg.materialize([calls, summaries], partition_key=partition, instance=instance,
                            resources={"llm": llm}, **kwargs)
    assert result.success
    return result


def metadata_of(result: dg.ExecuteInProcessResult) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events()
                if e.asset_key == summaries.key]
    return {k: getattr(v, "value", v) for k, v in
            event.step_materialization_data.materialization.metadata.items()}


@pytest.mark.slow
def test_wait_false_run_ends_at_once_and_the_sensor_run_collects_without_submitting(
        held, store_url, instance):
    llm = resource_for(held, store_url)
    first = metadata_of(materialize(instance, llm, "d1"))
    assert first["batchllm/rows_deferred"] == ROWS and first["batchllm/rows_succeeded"] == 0
    assert batch_stats(held)["batches_created"] == 1

    sensor = build_batch_collect_sensor(summaries, resource=llm)
    waiting = sensor(dg.build_sensor_context(instance=instance))
    assert not waiting.run_requests
    batch_id = held.batches()[0]["id"]
    assert f"d1 ({batch_id} " in waiting.skip_reason.skip_message
    retry = build_retry_partitions_sensor(summaries, resource=llm, base_delay_s=0)
    assert not retry(dg.build_sensor_context(instance=instance)).run_requests  # not its job

    held.complete_batches()
    ready = sensor(dg.build_sensor_context(instance=instance))
    (request,) = ready.run_requests
    assert request.partition_key == "d1" and request.tags["batchllm/collect"] == "true"
    assert request.run_key == f"d1|{batch_id}"

    collected = metadata_of(materialize(instance, llm, request.partition_key,
                                        tags=request.tags))
    assert collected["batchllm/rows_succeeded"] == ROWS
    assert collected["batchllm/rows_deferred"] == 0
    stats = batch_stats(held)
    assert stats["batches_created"] == 1 and stats["files_uploaded"] == 1  # 0 resubmitted
    assert stats["line_duplicates"] == 0
    # Cost at the batch price (half by default), and what it saved against online.
    tokens_cost_online = (collected["batchllm/run/prompt_tokens"] * 2.0
                          + collected["batchllm/run/completion_tokens"] * 8.0) / 1e6
    assert collected["batchllm/run/online_cost_usd"] == pytest.approx(tokens_cost_online)
    assert collected["batchllm/run/cost_usd"] == pytest.approx(tokens_cost_online / 2)
    assert collected["batchllm/run/batch_saving_usd"] == pytest.approx(tokens_cost_online / 2)
    assert collected["batchllm/run/mode"] == "batch_api"

    done = sensor(dg.build_sensor_context(instance=instance))
    assert "No partition of summaries waits for a batch" in done.skip_reason.skip_message


def test_component_declares_a_batch_asset_and_its_sensor(held, store_url):
    component = BatchInferenceComponent.resolve_from_yaml(f"""
name: call_summaries
source: calls
prompt: "Summarize: {{text}}"
model: {MODEL}
output_column: summary
partitions_def: {{type: static, partition_keys: [d1, d2]}}
mode: batch_api
wait: false
batch_collect: {{minimum_interval_seconds: 30}}
resource:
  endpoints: [{{name: openai, base_url: "{held.base_url}", models: [{MODEL}],
               api_key: sk-batch, batch_api: true}}]
  store_url: "{store_url}"
""")
    defs = component.build_defs(None)
    (asset,) = defs.assets
    assert asset.metadata_by_key[asset.key]["batchllm/mode"] == "batch_api"
    (sensor,) = defs.sensors
    assert sensor.name == "call_summaries_batch_collect"
    assert sensor.minimum_interval_seconds == 30


def test_a_sensor_without_a_partitioned_asset_or_resource_is_refused(store_url, held):
    unpartitioned = build_inference_asset(name="one", source="calls", prompt="{text}",
                                          mode="batch_api", wait=False)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="has no partitions_def"):
        build_batch_collect_sensor(unpartitioned, resource=resource_for(held, store_url))
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="must be the BatchInference"):
        build_batch_collect_sensor(summaries, resource="sqlite:///x.db")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="mode must be one of"):
        build_inference_asset(name="x", source="calls", prompt="{text}", mode="later")


def test_an_embedding_asset_goes_through_the_batch_api_at_the_batch_price(store_url,
                                                                          instance):
    from dagster_batchllm import build_embedding_asset
    from dagster_batchllm.testing import SimulatedEndpoint

    vectors = build_embedding_asset(name="call_vectors", source=calls, input_column="text",
                                    model="bge", partitions_def=PARTS, mode="batch_api")
    assert next(iter(vectors.specs)).metadata["batchllm/mode"] == "batch_api"
    with SimulatedEndpoint(embedding_models=("bge",), embedding_dimensions=8,
                           api_key="sk-batch") as sim:
        llm = BatchInferenceResource(
            endpoints=[Endpoint(name="openai", base_url=sim.base_url, embedding_models=["bge"],
                                api_key=sim.settings.api_key, batch_api=True)],
            prices={"bge": Price(input_per_mtok=0.1, output_per_mtok=0.0)},
            store_url=store_url, batch_poll_initial_s=0.02, progress_interval_s=60.0)
        result = dg.materialize([calls, vectors], partition_key="d1", instance=instance,
                                resources={"llm": llm})
        assert result.success
        table = result.output_for_node("call_vectors")
        assert table["embedding"].map(len).eq(8).all() and table["embedding_error"].isna().all()
        stats = batch_stats(sim)
        assert stats["batches_created"] == 1 and sim.stats(log=False)["requests"] == 0
        (event,) = result.asset_materializations_for_node("call_vectors")
        figures = {k: getattr(v, "value", v) for k, v in event.metadata.items()}
        assert figures["batchllm/run/mode"] == "batch_api"
        assert figures["batchllm/rows_succeeded"] == ROWS
        # the batch price: half the online one (Price's default batch_discount)
        paid = figures["batchllm/run/cost_usd"]
        online = figures["batchllm/run/prompt_tokens"] * 0.1 / 1e6
        assert paid == pytest.approx(online / 2)
