"""ai_filter and its cascade in Spark SQL give the rows DuckDB gives, on the same endpoint."""

from __future__ import annotations

import random

import duckdb
import pandas as pd

from dagster_batchllm import spark as batchllm_spark
from dagster_batchllm.simulator.labelled import KeywordTruth, LabelledResponder
from dagster_batchllm.sql import execute, register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

ORACLE, PROXY = "llama-70b", "llama-8b"
PREDICATE = "The customer asks for a refund."
TRUTH = KeywordTruth({"refund": "refund", "broken": "complaint"}, default="question")


def _tickets(rows: int) -> pd.DataFrame:
    rng = random.Random(11)
    texts = ["I want a refund.", "It arrived broken.", "When do you open?"]
    return pd.DataFrame({"ticket_id": list(range(rows)),
                         "body": [f"Ticket {i}: {rng.choice(texts)}" for i in range(rows)]})


def test_the_same_ai_filter_sql_gives_the_same_rows_in_spark_and_duckdb(spark, make_settings,
                                                                        tmp_path):
    responder = LabelledResponder(TRUTH, oracle_models=[ORACLE], proxy_models=[PROXY])
    df = _tickets(600)
    with SimulatedEndpoint(models=None, responder=responder) as sim:
        # one partition: a Spark task's Arrow batch is then the whole call, as in DuckDB
        spark.createDataFrame(df).coalesce(1).createOrReplaceTempView("tickets")
        batchllm_spark.register_ai_functions(
            spark, make_settings(sim, store_url=f"sqlite:///{tmp_path / 'spark.db'}"))
        con = duckdb.connect()
        con.register("tickets", df)
        register_ai_functions(con, make_settings(
            sim, store_url=f"sqlite:///{tmp_path / 'duckdb.db'}"))
        plain = (f"SELECT ticket_id FROM tickets WHERE ai_filter('{PREDICATE}', body, "
                 f"'{ORACLE}') ORDER BY ticket_id")
        spark_rows = [r.ticket_id for r in spark.sql(plain).collect()]
        assert spark_rows == [r[0] for r in con.sql(plain).fetchall()]
        assert spark_rows == [i for i, t in enumerate(df["body"]) if TRUTH(t) == "refund"]
        cascaded = ("SELECT ticket_id, ai_classify(body, array('refund', 'complaint', "
                    "'question'), cascade => named_struct('proxy', '{p}', 'oracle', '{o}', "
                    "'sample', 150)) AS label FROM tickets WHERE ai_filter('{q}', body, "
                    "cascade => named_struct('proxy', '{p}', 'oracle', '{o}', 'sample', 150)) "
                    "ORDER BY ticket_id")
        in_spark = spark.sql(cascaded.format(p=PROXY, o=ORACLE, q=PREDICATE)).toPandas()
        in_duckdb = execute(con, cascaded.format(p=PROXY, o=ORACLE, q=PREDICATE),
                            dialect="databricks").df()
        assert in_spark["ticket_id"].tolist() == in_duckdb["ticket_id"].tolist()
        assert in_spark["label"].tolist() == in_duckdb["label"].tolist()
        sim.reset_stats()
        assert spark.sql(cascaded.format(p=PROXY, o=ORACLE, q=PREDICATE)).count() == len(in_spark)
        assert sim.stats()["requests"] == 0  # the rerun is answered by the ledger
