"""The cost of each partition: per-endpoint prices through Dagster config, and the metadata's
per-partition cost equal to the sum of the ledger's per-row costs."""

import dagster as dg

from dagster_batchllm import BatchInferenceResource, Endpoint, ModelPrice, Price

MODEL = "sim-model"


def test_the_resource_takes_prices_per_endpoint_in_code_and_in_config():
    llm = BatchInferenceResource(
        endpoints=[Endpoint(name="a", base_url="http://127.0.0.1:9/v1", models=[MODEL],
                            prices={MODEL: Price(0.1, 0.2, cached_input_per_mtok=0.05)}),
                   Endpoint(name="b", base_url="http://127.0.0.1:9/v1", models=[MODEL, "x"],
                            prices=Price(1.0, 2.0))],
        prices=[ModelPrice(model="x", usd_per_1m_prompt_tokens=3.0,
                           usd_per_1m_completion_tokens=4.0)],
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
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [MODEL],
         "prices": {"*": {"input_per_mtok": 5.0, "output_per_mtok": 6.0}}}]}}}}
    assert dg.materialize([prices_seen], resources={"llm": llm}, run_config=run_config).success
    assert seen["b"] == Price(5.0, 6.0)
