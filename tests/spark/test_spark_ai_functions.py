"""The Databricks AI functions in Spark SQL: every function, its type, NULLs, reruns, checks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark

TEXTS = {
    "c1": "Bob wants a refund for order 4521 shipped to Paris.",
    "c2": "The billing complaint was resolved, thanks!",
    "c3": None,
}

QUERY = """
    SELECT id,
           ai_summarize(t, 20) AS summary,
           ai_classify(t, array('refund', 'complaint')) AS topic,
           ai_extract(t, array('person', 'place')) AS entities,
           ai_analyze_sentiment(t) AS sentiment,
           ai_translate(t, 'French') AS french,
           ai_fix_grammar(t) AS fixed,
           ai_mask(t, array('person')) AS masked,
           ai_gen(t) AS generated,
           ai_similarity(t, other, endpoint => 'llama-70b') AS similarity
    FROM ai_function_texts
"""

TYPES = {
    "summary": "string", "topic": "string", "entities": "string", "sentiment": "string",
    "french": "string", "fixed": "string", "masked": "string", "generated": "string",
    "similarity": "double",
}


@pytest.fixture
def texts(spark):
    pdf = pd.DataFrame({"id": list(TEXTS), "t": list(TEXTS.values()),
                        "other": ["A refund for order 4521.", None, "anything"]})
    frame = spark.createDataFrame(pdf, "id string, t string, other string").repartition(2)
    frame.createOrReplaceTempView("ai_function_texts")
    return frame


def test_every_ai_function_runs_in_spark_sql_with_its_type(spark, texts, make_settings):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        frame = spark.sql(QUERY)
        rows = {r.id: r for r in frame.collect()}
        first = sim.stats(log=False)["requests"]
        again = {r.id: r for r in spark.sql(QUERY).collect()}
        second = sim.stats(log=False)["requests"]

    assert {f.name: f.dataType.simpleString() for f in frame.schema.fields[1:]} == TYPES
    c1, c2, c3 = rows["c1"], rows["c2"], rows["c3"]
    # NULL in, NULL out, for every function (ai_similarity: either text NULL).
    assert all(c3[name] is None for name in TYPES)
    assert c2.similarity is None
    assert c1.topic == "refund" and c2.topic == "complaint"
    assert c1.sentiment in {"positive", "negative", "neutral", "mixed"}
    assert set(json.loads(c1.entities)) == {"person", "place"}
    assert isinstance(c1.similarity, float) and 0.0 <= c1.similarity <= 1.0
    for name in ("summary", "french", "fixed", "masked", "generated"):
        assert c1[name] == "[sim] " + TEXTS["c1"], name  # the content is the user message
    # c1 sends 9 requests, c2 8 (no similarity); c3 none. A rerun is answered by the ledger.
    assert first == 17
    assert second == first
    assert again == rows


def test_the_same_requests_as_the_sql_module_share_the_ledger(spark, texts, make_settings):
    import duckdb

    from dagster_batchllm.sql import register_ai_functions as register_sql

    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        settings = make_settings(sim)
        con = duckdb.connect()
        with register_sql(con, settings):
            expected = con.sql(
                "SELECT ai_classify(t, ['refund', 'complaint']) FROM (VALUES "
                f"('{TEXTS['c1']}')) AS v(t)").fetchall()
        before = sim.stats(log=False)["requests"]
        register_ai_functions(spark, settings)
        got = spark.sql("SELECT ai_classify(t, array('refund', 'complaint')) AS topic "
                        "FROM ai_function_texts WHERE id = 'c1'").collect()
        after = sim.stats(log=False)["requests"]

    assert [r.topic for r in got] == [v for (v,) in expected] == ["refund"]
    assert after == before  # Spark found DuckDB's answer in the ledger


@pytest.mark.parametrize("query, message", [
    ("SELECT ai_classify(t, array('refund')) FROM ai_function_texts", "at least 2 labels"),
    ("SELECT ai_classify(t, array(t, 'x')) FROM ai_function_texts", "must be a constant"),
    ("SELECT ai_translate(t) FROM ai_function_texts", "needs 'to_lang'"),
    ("SELECT ai_gen(t, endpoint => 'nope') FROM ai_function_texts", "no configured endpoint"),
    ("SELECT ai_gen(t, colour => 'red') FROM ai_function_texts", "no parameter 'colour'"),
    ("SELECT ai_summarize(t, 'many') FROM ai_function_texts", "must be an INTEGER"),
])
def test_argument_mistakes_fail_the_query_before_any_request(texts, fails_before_sending,
                                                             query, message):
    error = fails_before_sending(query, message)
    assert isinstance(error, InferenceConfigError) or message in str(error)
