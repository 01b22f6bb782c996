"""Databricks SQL in Spark as its docs write it (issue 19): unreadable replies are NULL, blank
requests are not sent, and the older ai_query(endpoint, request, 'returnType', 'STRING')."""

from __future__ import annotations

import pandas as pd
import pytest

from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark

TEXTS = {"a": "I love this blender", "b": "The toaster broke", "c": "It is a kettle",
         "d": "   ", "e": None}


@pytest.fixture
def texts(spark):
    frame = spark.createDataFrame(pd.DataFrame({"id": list(TEXTS), "x": list(TEXTS.values())}),
                                  "id string, x string")
    frame.createOrReplaceTempView("compat_texts")
    return frame


def _collect(spark, query):
    # No ORDER BY: a sort samples its input first, which would evaluate the UDF twice.
    return {r[0]: r[1] for r in spark.sql(query).collect()}


@pytest.mark.parametrize("call", ["ai_classify(x, array('good', 'bad'))",
                                  "ai_analyze_sentiment(x)",
                                  "ai_extract(x, array('product'))",
                                  "ai_similarity(x, 'a blender')"])
def test_an_unreadable_reply_is_null_in_spark_sql(spark, texts, make_settings, call):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        sim.script("bad_structured")
        rows = _collect(spark, f"SELECT id, {call} FROM compat_texts")
        sent = sim.stats(log=False)["requests"]

    assert sum(rows[k] is None for k in "abc") == 1
    assert rows["d"] is None and rows["e"] is None
    assert sent == 3  # the blank and the NULL row are not sent


def test_a_blank_request_is_null_in_spark_sql(spark, texts, make_settings):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        plain = _collect(spark, "SELECT id, ai_query('llama-70b', x) FROM compat_texts")
        struct = _collect(spark, "SELECT id, ai_query('llama-70b', x, failOnError => false) "
                                 "FROM compat_texts")
        sent = sim.stats(log=False)["requests"]

    assert plain["d"] is None and plain["a"] == "[sim] I love this blender"
    assert struct["d"].result is None and struct["d"].errorMessage is None
    assert sent == 3  # the second query is answered from the ledger


def test_the_older_name_value_form_runs_in_spark_sql(spark, texts, make_settings, model_echo):
    with SimulatedEndpoint(models=("m1",), responder=model_echo) as sim:
        register_ai_functions(spark, make_settings(sim))
        plain = _collect(spark, "SELECT id, ai_query('m1', x, 'returnType', 'STRING') "
                                "FROM compat_texts WHERE id = 'a'")
        frame = spark.sql("SELECT id, ai_query('m1', x, 'failOnError', false, 'modelParameters',"
                          " named_struct('max_tokens', 32)) AS r FROM compat_texts "
                          "WHERE id = 'b'")
        struct = {r.id: r.r for r in frame.collect()}

    assert plain == {"a": "m1 says: I love this blender"}
    assert frame.schema["r"].dataType.simpleString() == "struct<result:string,errorMessage:string>"
    assert struct["b"].result == "m1 says: The toaster broke"
    assert model_echo.params[-1] == {"max_tokens": 32}


@pytest.mark.parametrize("arguments, message", [
    ("'returnType'", "has no value"),
    ("'returntype', 'STRING'", "names are case-sensitive"),
    ("'returnType', 'NUMBER'", "unknown type 'NUMBER'"),
])
def test_malformed_name_value_pairs_fail_before_any_request(texts, fails_before_sending,
                                                            arguments, message):
    fails_before_sending(f"SELECT ai_query('llama-70b', x, {arguments}) FROM compat_texts",
                         message)
