"""ai_query_col: the DataFrame API, batches sent concurrently, what executors import."""

from __future__ import annotations

import json
import pickle

import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.spark import SparkAI, ai_query_col, register_ai_functions
from dagster_batchllm.spark.worker import client_for
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark


def _frame(spark, n: int, partitions: int = 2):
    pdf = pd.DataFrame({"id": range(n), "text": [f"transcript number {i}" for i in range(n)]})
    return spark.createDataFrame(pdf).repartition(partitions, "id")


def _worker_probe():
    """A pandas UDF reporting, from the Python worker that ran the UDF it wraps, its imports."""
    from pyspark.sql.functions import pandas_udf

    def probe(values: pd.Series) -> pd.Series:
        import sys

        from dagster_batchllm.spark.worker import cache_info

        report = json.dumps({
            "dagster": sorted(m for m in sys.modules if m == "dagster" or m.startswith("dagster.")
                              or m == "dagster_batchllm.resource"),
            **cache_info(),
        })
        return pd.Series([report] * len(values))

    return pandas_udf(probe, "string")


def test_ai_query_col_as_a_string_and_as_a_struct(spark, make_settings):
    from pyspark.sql import functions as F

    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        df = _frame(spark, 6).withColumn(
            "summary", ai_query_col("llama-70b", F.concat(F.lit("Summarize: "), "text")))
        summaries = {r.id: r.summary for r in df.collect()}
        sim.script(400)
        checked = _frame(spark, 6).withColumn(
            "checked", ai_query_col("llama-70b", "text", fail_on_error=False, max_tokens=32))
        structs = {r.id: r.checked for r in checked.collect()}

    assert summaries == {i: f"[sim] Summarize: transcript number {i}" for i in range(6)}
    assert dict(checked.dtypes)["checked"] == "struct<result:string,errorMessage:string>"
    errors = [s.errorMessage for s in structs.values() if s.errorMessage]
    assert len(errors) == 1 and errors[0].startswith("bad_request")
    assert sum(s.result is not None for s in structs.values()) == 5


def test_a_batch_is_sent_concurrently_and_executors_never_import_dagster(spark, make_settings):
    import dagster  # noqa: F401 - the driver has it; the executors must not

    with SimulatedEndpoint(models=("llama-70b",), latency_s=0.05) as sim:
        ai = SparkAI(spark, make_settings(sim))
        answered = ai.ai_query_col("llama-70b", "text")
        # Chained Python UDFs run in one worker process, after the one they wrap.
        frame = _frame(spark, 40).select(_worker_probe()(answered).alias("report"))
        reports = [json.loads(r.report) for r in frame.distinct().collect()]
        stats = sim.stats(log=False)

    assert stats["requests"] == 40
    # 20 rows a task at 50 ms each: one at a time would never overlap requests.
    assert stats["max_concurrent"] >= 4
    for report in reports:
        assert report["dagster"] == []
        assert report["clients"] >= 1 and report["batches"] >= 1


def test_one_client_per_settings_per_worker_process(make_settings, sim):
    settings = make_settings(sim)
    shipped = pickle.loads(pickle.dumps(settings))  # what an executor unpickles, every task
    assert client_for(shipped) is client_for(settings)
    assert client_for(settings.replace(max_attempts=2)) is not client_for(settings)


def test_model_mistakes_are_raised_on_the_driver(spark, make_settings, sim):
    ai = SparkAI(spark, make_settings(sim))
    with pytest.raises(InferenceConfigError, match="no configured endpoint serves 'gpt-9'"):
        ai.ai_query_col("gpt-9", "text")
    with pytest.raises(InferenceConfigError, match="Unknown generation parameter"):
        ai.ai_query_col("sim-model", "text", temprature=0.2)
