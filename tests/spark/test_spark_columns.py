"""ai_query_col: the DataFrame API, batches sent concurrently, what executors import."""

from __future__ import annotations

import json
import pickle

import pandas as pd
import pytest

import dagster_batchllm.spark
import dagster_batchllm.sql
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.spark import SparkAI, ai_query_col, register_ai_functions
from dagster_batchllm.spark.job import MODEL_COLUMN, PROMPT_COLUMN
from dagster_batchllm.spark.worker import client_for, run_scalar
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


class _Recorder:
    """A responder that keeps each request's messages and parameters."""

    def __init__(self):
        self.requests: list[tuple[list[dict], dict]] = []

    def respond(self, model, messages, params) -> str:
        self.requests.append((list(messages), dict(params)))
        return f"{model}: {messages[-1]['content']}"


def test_a_job_carries_one_checked_call_to_the_executors(make_settings):
    recorder = _Recorder()
    with SimulatedEndpoint(models=("sim-model",), responder=recorder) as sim:
        ai = SparkAI(None, make_settings(sim), task_slots=2, partition_key="2024-06-01",
                     scope="calls")
        job = ai.job(fail_on_error=False, max_tokens=32, seed=7, system="Reply as {json}")
        shipped = pickle.loads(pickle.dumps(job))  # what travels in the UDF's closure
        out = run_scalar(shipped, True, pd.Series(["sim-model", "sim-model"]),
                         pd.Series(["Hi", None]))

    assert shipped == job
    call = job.call
    assert isinstance(call, InferenceCall)
    assert (call.prompt_column, call.model_column) == (PROMPT_COLUMN, MODEL_COLUMN)
    assert call.system == "Reply as {{json}}"  # the Spark API's system prompt is literal text
    assert call.request_params == {"seed": 7, "max_tokens": 32}
    assert (call.partition_key, call.scope) == ("2024-06-01", "calls")
    assert out.to_dict("records") == [{"result": "sim-model: Hi", "errorMessage": None},
                                      {"result": None, "errorMessage": None}]
    [(messages, params)] = recorder.requests
    assert messages[0] == {"role": "system", "content": "Reply as {json}"}
    assert params["seed"] == 7 and params["max_tokens"] == 32


def test_call_mistakes_are_raised_on_the_driver(make_settings, sim):
    ai = SparkAI(None, make_settings(sim), task_slots=1)
    with pytest.raises(InferenceConfigError, match="max_tokens must be at least 1"):
        ai.job(fail_on_error=True, max_tokens=0)
    with pytest.raises(InferenceConfigError, match="not a valid JSON schema"):
        ai.job(fail_on_error=True, response_format={"type": "object", "properties": 3})


def test_one_ai_query_error_for_sql_and_spark(make_settings):
    assert dagster_batchllm.spark.AIQueryError is dagster_batchllm.sql.AIQueryError
    with SimulatedEndpoint(models=("sim-model",)) as sim:
        job = SparkAI(None, make_settings(sim, max_attempts=1), task_slots=1).job(
            fail_on_error=True)
        sim.script(500)
        with pytest.raises(dagster_batchllm.sql.AIQueryError,
                           match="ai_query failed for 1 of 2 rows.*server_error"):
            run_scalar(job, False, pd.Series(["sim-model"] * 2), pd.Series(["a", "b"]))
