"""ai_query in Spark SQL: the Databricks example unchanged, result types, argument checks."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint
from dagster_batchllm.testing.databricks.examples import CALL_CENTER_PIPELINE

pytestmark = pytest.mark.spark

TRANSCRIPTS = {
    "c1": "Customer was ANGRY!!! about order #4521; wants a refund.",
    "c2": "Caller seemed upset: a billing complaint (ref 99).",
    "c3": "Asked about store hours, 9-5?",
    "c4": None,
}


@pytest.fixture
def transcripts(spark):
    pdf = pd.DataFrame({
        "call_id": list(TRANSCRIPTS),
        "call_timestamp": pd.to_datetime(["2026-11-01 09:00", "2026-11-01 10:00",
                                          "2026-11-01 11:00", "2026-11-01 12:00"]),
        "transcript_raw_text": list(TRANSCRIPTS.values()),
    })
    frame = spark.createDataFrame(pdf).repartition(2)
    frame.createOrReplaceTempView("call_center_transcripts")
    return frame


def cleaned(text: str) -> str:
    return re.sub(r"[^a-zA-Z\s]", "", text).lower()


def test_the_databricks_example_query_runs_unchanged(spark, transcripts, make_settings):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        rows = spark.sql(CALL_CENTER_PIPELINE).orderBy("call_id").collect()
        stats = sim.stats(log=False)

    # Spark's regexp_replace with '[^a-zA-Z\\s]' cleans exactly as Python's [^a-zA-Z\s] does.
    assert cleaned(TRANSCRIPTS["c1"]) == "customer was angry about order  wants a refund"
    assert [(r.call_id, r.risk_level, r.action_required) for r in rows] == [
        ("c1", "High Risk", "Refund Request"),
        ("c2", "Medium Risk", "Complaint"),
    ]
    for row in rows:  # the simulator answers "[sim] <the prompt, whitespace collapsed>"
        prompt = cleaned(TRANSCRIPTS[row.call_id])
        assert row.summary_analysis == "[sim] " + " ".join(prompt.split())
    # Three non-null transcripts, each sent once; the NULL one is not sent and stays NULL.
    assert stats["requests"] == 3 and stats["duplicates"] == 0


def test_fail_on_error_false_gives_a_struct_with_per_row_errors(spark, transcripts,
                                                                 make_settings):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim))
        # Retried faults end in answers; the 400 is final and becomes that row's error.
        sim.script(500, 503, "drop", 429, 400)
        frame = spark.sql("""
            SELECT call_id, ai_query('llama-70b', transcript_raw_text, failOnError => false) AS s
            FROM call_center_transcripts
        """)
        schema = frame.schema["s"].dataType.simpleString()
        rows = {r.call_id: r.s for r in frame.collect()}
        stats = sim.stats(log=False)

    assert schema == "struct<result:string,errorMessage:string>"
    failed = {k: s.errorMessage for k, s in rows.items() if s.errorMessage}
    assert len(failed) == 1
    [(failed_id, message)] = failed.items()
    assert message.startswith("bad_request: HTTP 400")
    assert rows[failed_id].result is None
    answered = {k for k, s in rows.items() if s.result is not None}
    assert answered == {"c1", "c2", "c3"} - {failed_id}
    assert rows["c4"].result is None and rows["c4"].errorMessage is None  # NULL in, NULL out
    assert stats["by_status"]["500"] == 1 and stats["by_status"]["429"] == 1


def test_model_parameters_and_response_format_reach_the_endpoint(spark, transcripts,
                                                                 make_settings, model_echo):
    with SimulatedEndpoint(models=("m1",), responder=model_echo) as sim:
        register_ai_functions(spark, make_settings(sim))
        rows = spark.sql("""
            SELECT call_id, ai_query('m1', transcript_raw_text,
                                     modelParameters => named_struct('max_tokens', 40,
                                                                     'temperature', 0.7)) AS s
            FROM call_center_transcripts WHERE call_id = 'c3'
        """).collect()
    assert rows[0].s == "m1 says: " + TRANSCRIPTS["c3"]
    assert model_echo.params == [{"max_tokens": 40, "temperature": 0.7}]

    schema = json.dumps({"type": "object", "properties": {"risk": {"type": "string"}},
                         "required": ["risk"]})
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_ai_functions(spark, make_settings(sim, store_url="sqlite://"))
        rows = spark.sql(f"""
            SELECT from_json(ai_query('llama-70b', transcript_raw_text,
                                      responseFormat => '{schema}'), 'risk STRING') AS parsed
            FROM call_center_transcripts WHERE call_id = 'c1'
        """).collect()
    assert isinstance(rows[0].parsed.risk, str)


@pytest.mark.parametrize("query, message", [
    ("ai_query('gpt-unknown', transcript_raw_text)", "no configured endpoint serves"),
    ("ai_query('llama-70b', transcript_raw_text, returnType => 'INTEGRAL')",
     "unknown type 'INTEGRAL'"),
    ("ai_query('llama-70b', transcript_raw_text, failOnError => call_id = 'c1')",
     "must be a constant"),
    ("ai_query('llama-70b', transcript_raw_text, temperature => 0.1)", "has no parameter"),
])
def test_argument_mistakes_fail_the_query_before_any_request(transcripts, fails_before_sending,
                                                             query, message):
    fails_before_sending(f"SELECT {query} FROM call_center_transcripts", message)


def test_an_endpoint_name_serving_one_model_stands_for_it(spark, transcripts, make_settings):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        settings = make_settings(sim)  # its endpoint is named ep0
        register_ai_functions(spark, settings)
        [row] = spark.sql("SELECT ai_query('ep0', 'hello there') AS s").collect()
    assert row.s == "[sim] hello there"
