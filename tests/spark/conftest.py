"""One SparkSession for every Spark test (the JVM takes ~10 s to start), and shared helpers."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

if importlib.util.find_spec("pyspark") is None:  # pip install -e '.[spark]' to run these
    collect_ignore_glob = ["test_*.py"]

# tests/conftest.py sets these too; repeated so this file also works when collected alone.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dagster-batchllm-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def model_echo():
    """A responder for SimulatedEndpoint(responder=...) that names the answering model."""
    return ModelEcho()


class ModelEcho:
    """A responder that says which model answered and remembers the generation parameters."""

    def __init__(self, models=("m1", "m2", "m3")):
        self._models = list(models)
        self.params: list[dict] = []

    def models(self) -> list[str]:
        return self._models

    def respond(self, model, messages, params) -> str:
        self.params.append(dict(params))
        return f"{model} says: {messages[-1]['content']}"


@pytest.fixture
def engines_over(spark, make_settings, make_client, tmp_path):
    """Spark SQL and DuckDB over the same rows (the view ``call_center_transcripts``) and one
    simulated endpoint serving ``llama-70b``, each engine with its own ledger (so each really
    asks the endpoint): ``spark, con, sim = engines_over(rows, spark_schema)``."""
    import duckdb

    from dagster_batchllm import spark as batchllm_spark
    from dagster_batchllm.sql import register_ai_functions
    from dagster_batchllm.testing import SimulatedEndpoint

    opened = []

    def build(rows, spark_schema=None):
        spark.createDataFrame(rows, spark_schema).createOrReplaceTempView(
            "call_center_transcripts")
        con = duckdb.connect()
        con.register("call_center_transcripts", rows)
        sim = SimulatedEndpoint(models=("llama-70b",)).start()
        opened.append((con, sim))
        batchllm_spark.register_ai_functions(
            spark, make_settings(sim, store_url=f"sqlite:///{tmp_path / 'spark-ledger.db'}"))
        register_ai_functions(
            con, make_client(sim, store_url=f"sqlite:///{tmp_path / 'duckdb-ledger.db'}"))
        return spark, con, sim

    yield build
    for con, sim in opened:
        con.close()
        sim.stop()


@pytest.fixture
def records():
    """``records(frame, columns)``: a result's rows as tuples of plain values (None for NULL),
    in call_id order, so two engines' results compare with ==."""

    def as_tuples(frame, columns) -> list[tuple]:
        frame = frame[columns].sort_values("call_id", ignore_index=True).astype(object)
        return list(frame.where(frame.notna(), None).itertuples(index=False, name=None))

    return as_tuples


@pytest.fixture
def on_both(records):
    """``on_both(engines, query, columns)`` over ``engines_over``'s engines: the query's rows on
    Spark SQL and on DuckDB (``dialect="databricks"``) as ``records``, and the requests each
    engine sent for it: ``on_spark, on_duckdb, (sent_by_spark, sent_by_duckdb)``."""
    from dagster_batchllm.sql import execute

    def run(engines, query, columns):
        spark, con, sim = engines
        sent = sim.stats(log=False)["requests"]
        on_spark = records(spark.sql(query).toPandas(), columns)
        by_spark = sim.stats(log=False)["requests"] - sent
        on_duckdb = records(execute(con, query, dialect="databricks").df(), columns)
        by_duckdb = sim.stats(log=False)["requests"] - sent - by_spark
        return on_spark, on_duckdb, (by_spark, by_duckdb)

    return run


@pytest.fixture
def ai_spark(spark, make_settings):
    """The AI functions registered in Spark SQL over a simulated endpoint serving
    ``llama-70b``; the endpoint, to count what reached it."""
    from dagster_batchllm.spark import register_ai_functions
    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        yield sim


@pytest.fixture
def fails_before_sending(spark, ai_spark):
    """``fails_before_sending(query, message)``: the Spark SQL ``query`` fails with an error
    matching ``message`` (handed back) before any request reached ``ai_spark``'s endpoint."""

    def check(query: str, message: str) -> BaseException:
        with pytest.raises(Exception, match=message) as info:
            spark.sql(query).collect()
        assert ai_spark.stats(log=False)["requests"] == 0
        return info.value

    return check
