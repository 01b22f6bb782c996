"""The same ai_agg / ai_summarize_agg SQL on DuckDB and real local Spark SQL: the same answers,
each engine with its own ledger (so each really asks the endpoint); a rerun in Spark sends
nothing."""

from __future__ import annotations

import importlib.util
import os
import sys

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.simulator.aggregation import answer_text, rows_digest
from dagster_batchllm.sql import register_ai_functions
from tests.semantic.aggregate_helpers import CONTEXT, aggregating_endpoint, complaints

pytestmark = [pytest.mark.spark, pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None, reason="pip install -e '.[spark]'")]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

QUERY = """SELECT product, ai_agg(body, 'What do they complain about?') AS verdict,
                  ai_summarize_agg(body) AS summary,
                  ai_agg(body, 'What do they want?', 'sim-model') AS wish
           FROM tickets GROUP BY product ORDER BY product"""


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("batchllm-aggregate-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session  # tests/spark's session fixture stops it at the end, if it shares it


@pytest.fixture
def agg_sim():
    yield from aggregating_endpoint()


@pytest.mark.slow
def test_the_same_sql_gives_the_same_answers_on_duckdb_and_spark(agg_sim, spark, make_settings,
                                                                 tmp_path):
    from dagster_batchllm.spark import register_ai_functions as register_spark

    bodies = complaints(240)
    df = pd.DataFrame({"product": [("lamp", "chair", "desk")[i % 3] for i in range(240)],
                       "body": bodies})
    df.loc[5, "body"] = None  # left out on both engines

    def settings(name):
        return make_settings(agg_sim, store_url=f"sqlite:///{tmp_path / name}",
                             endpoint_kwargs={"max_context_tokens": CONTEXT},
                             default_max_tokens=32)

    con = duckdb.connect()
    con.register("tickets", df)
    register_ai_functions(con, settings("duckdb.db"))
    on_duckdb = con.sql(QUERY).df()
    sent_by_duckdb = agg_sim.stats(log=False)["requests"]

    spark.createDataFrame(df).createOrReplaceTempView("tickets")
    register_spark(spark, settings("spark.db"))
    on_spark = spark.sql(QUERY).toPandas()

    pd.testing.assert_frame_equal(on_spark, on_duckdb)
    for product, group in df.dropna().groupby("product"):
        row = on_spark[on_spark["product"] == product].iloc[0]
        assert row["verdict"] == answer_text(len(group), rows_digest(group["body"]))
    assert agg_sim.stats(log=False)["requests"] == 2 * sent_by_duckdb  # the same requests
    pd.testing.assert_frame_equal(spark.sql(QUERY).toPandas(), on_duckdb)
    assert agg_sim.stats(log=False)["requests"] == 2 * sent_by_duckdb  # rerun: from the ledger
    for mistake, says in (("ai_agg(body)", "takes 2 to 3 arguments"),
                          ("ai_summarize_agg(body, 'gpt-9')", "no configured endpoint serves")):
        with pytest.raises(Exception, match=says):  # while Spark analyses it: no task runs
            spark.sql(f"SELECT {mistake} FROM tickets").collect()
    assert agg_sim.stats(log=False)["requests"] == 2 * sent_by_duckdb


@pytest.mark.slow
def test_no_rows_give_no_row_and_no_error(agg_sim, spark, make_settings, tmp_path):
    """Over no rows Spark never calls a pandas aggregate UDF: a global aggregate gives no row
    (where DuckDB and SQLite give one NULL), with no error about arguments no row carries and
    nothing sent; grouped, no rows are no groups, as on every engine."""
    from dagster_batchllm.spark import register_ai_functions as register_spark

    spark.createDataFrame([], "product STRING, body STRING").createOrReplaceTempView("none_yet")
    register_spark(spark, make_settings(agg_sim, store_url=f"sqlite:///{tmp_path / 'l.db'}"))

    for query in ("SELECT ai_agg(body, 'What?') FROM none_yet",
                  "SELECT ai_summarize_agg(body) FROM none_yet",
                  "SELECT ai_agg(body, 'What?', 'sim-model') FROM none_yet WHERE 1 = 0",
                  "SELECT product, ai_agg(body, 'What?') FROM none_yet GROUP BY product"):
        assert spark.sql(query).collect() == [], query
    assert spark.sql("SELECT max(body) FROM none_yet").collect()[0][0] is None  # Spark's own
    assert agg_sim.stats(log=False)["requests"] == 0
