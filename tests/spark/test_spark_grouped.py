"""Many models: groupBy(model).applyInPandas, one client per model per worker."""

from __future__ import annotations

import pandas as pd
import pytest

from dagster_batchllm.spark import SparkAI
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark

MODELS = ("m1", "m2", "m3")


def _calls(spark, n_per_model: int = 8):
    rows = [{"call_id": f"{m}-{i}", "model": m, "transcript": f"call {i} for {m}"}
            for m in MODELS for i in range(n_per_model)]
    return spark.createDataFrame(pd.DataFrame(rows))


def test_three_models_each_row_answered_by_its_own_model(spark, make_settings, model_echo):
    with SimulatedEndpoint(models=MODELS, responder=model_echo) as sim:
        ai = SparkAI(spark, make_settings(sim))
        out = ai.infer_grouped(_calls(spark), model_column="model",
                               prompt="Summarize: {transcript}", output_column="summary",
                               max_tokens=64)
        rows = out.collect()
        first = sim.stats(log=False)
        # The same rows spread over two groups per model: all answered from the ledger.
        again = ai.infer_grouped(_calls(spark), model_column="model",
                                 prompt="Summarize: {transcript}", output_column="summary",
                                 max_tokens=64, buckets_per_model=2).collect()
        second = sim.stats(log=False)

    assert out.columns == ["call_id", "model", "transcript", "summary"]
    assert len(rows) == 24
    for row in rows:
        assert row.summary.errorMessage is None
        assert row.summary.result == f"{row.model} says: Summarize: {row.transcript}"
    assert first["requests"] == 24 and first["duplicates"] == 0
    assert {r.call_id: r.summary.result for r in again} == {
        r.call_id: r.summary.result for r in rows}
    assert second["requests"] == 24  # nothing sent again


def test_failures_and_unserved_models_are_per_row_errors(spark, make_settings, model_echo):
    calls = _calls(spark, 4).unionByName(spark.createDataFrame(pd.DataFrame(
        [{"call_id": "x-0", "model": "m9", "transcript": "no such model"}])))
    with SimulatedEndpoint(models=MODELS, responder=model_echo) as sim:
        ai = SparkAI(spark, make_settings(sim))
        sim.script(400)
        rows = ai.infer_grouped(calls, model_column="model", prompt_column="transcript").collect()

    errors = {r.call_id: r.output.errorMessage for r in rows if r.output.errorMessage}
    assert errors.pop("x-0").startswith("unsupported_model")
    assert len(errors) == 1 and next(iter(errors.values())).startswith("bad_request")
    assert sum(r.output.result is not None for r in rows) == 11


def test_fail_on_error_true_gives_a_string_column(spark, make_settings, model_echo):
    with SimulatedEndpoint(models=MODELS, responder=model_echo) as sim:
        ai = SparkAI(spark, make_settings(sim))
        out = ai.infer_grouped(_calls(spark, 1), model_column="model",
                               prompt_column="transcript", fail_on_error=True)
        assert dict(out.dtypes)["output"] == "string"
        assert sorted(r.output for r in out.collect()) == [
            f"{m} says: call 0 for {m}" for m in MODELS]
