"""An asset whose server reports usage that is no token count: its metadata's costs are never
negative, they equal the ledger's, and it says how many replies were counted at their bound."""

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import Price, build_inference_asset

MODEL = "sim-model"


@pytest.mark.slow
def test_metadata_of_a_run_whose_server_reported_negative_usage(sim, make_llm_resource,
                                                                instance):
    import sqlalchemy as sa

    @dg.asset
    def tickets() -> pd.DataFrame:
        return pd.DataFrame({"text": [f"ticket {i}" for i in range(9)]})

    asset = build_inference_asset(name="triage", source=tickets, prompt="Triage: {text}",
                                  model=MODEL, output_column="label", max_tokens=12)
    llm = make_llm_resource(sim, endpoint_kwargs={"prices": {MODEL: Price(2.0, 7.0)}})
    sim.configure(reported_usage={"prompt_tokens": -10**6, "completion_tokens": -10**6})
    result = dg.materialize([tickets, asset], resources={"llm": llm}, instance=instance)
    assert result.success
    [materialized] = result.asset_materializations_for_node("triage")
    metadata = {k: v.value for k, v in materialized.metadata.items()}
    assert metadata["batchllm/run/usage_corrected"] == 9
    assert metadata["batchllm/run/stats"]["usage_corrected"] == 9
    t = llm.ledger.table
    with llm.ledger.engine.connect() as conn:
        paid, lowest = conn.execute(sa.select(sa.func.sum(t.c.cost_usd),
                                              sa.func.min(t.c.cost_usd))).one()
    assert lowest > 0  # every row counted at its bound, none negative
    for key in ("batchllm/run/cost_usd", "batchllm/answers/cost_usd"):
        assert metadata[key] == pytest.approx(paid, abs=1e-6)
    assert metadata["batchllm/run/prompt_tokens"] > 0
    assert metadata["batchllm/run/completion_tokens"] == 9 * 12
