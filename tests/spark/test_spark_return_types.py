"""ai_query's returnType on a chat model in Spark SQL (issue 31): the model is asked for the
type (the catalogue's JSON schema, as on DuckDB and SQLite) and the column has that type; with
failOnError => false it is STRUCT<result: T, errorMessage: STRING> and a reply that does not fit
is NULL with its reason. Spark in local mode, against the simulated endpoint."""

from __future__ import annotations

import threading

import pandas as pd
import pytest

from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import EchoResponder, SimulatedEndpoint

ROWS = [("a", "an angry refund call"), ("b", "where is my order"), ("c", None),
        ("free", "say: Yes, the caller is angry."), ("wrong", 'say: {"value": "yes"}')]


class Replies(EchoResponder):
    """The echo responder (schema-valid JSON for a json_schema request), remembering each
    request's parameters; a prompt 'say: <text>' is answered <text>, whatever was asked."""

    def __init__(self):
        super().__init__(("m1",))
        self.params: list[dict] = []
        self._lock = threading.Lock()

    def respond(self, model, messages, params):
        with self._lock:
            self.params.append(dict(params))
        prompt = messages[-1]["content"]
        if prompt.startswith("say: "):
            return prompt.removeprefix("say: ")
        return super().respond(model, messages, params)


@pytest.fixture
def replies(spark, make_settings):
    responder = Replies()
    with SimulatedEndpoint(models=("m1",), responder=responder) as endpoint:
        register_ai_functions(spark, make_settings(endpoint))
        spark.createDataFrame(pd.DataFrame(ROWS, columns=["id", "x"])).createOrReplaceTempView(
            "typed_calls")
        yield responder, endpoint


def test_struct_boolean_and_array_are_typed_columns(spark, replies):
    responder, _ = replies

    frame = spark.sql("""
        SELECT id, ai_query('m1', x, returnType => 'STRUCT<risk: STRING, score: INT>') AS s,
               ai_query('m1', x, returnType => 'BOOLEAN') AS b,
               ai_query('m1', x, 'ARRAY<STRING>') AS tags
        FROM typed_calls WHERE id IN ('a', 'b', 'c')""")
    rows = {r.id: r for r in frame.collect()}

    assert frame.schema.simpleString() == ("struct<id:string,s:struct<risk:string,score:int>,"
                                           "b:boolean,tags:array<string>>")
    assert rows["a"].s.asDict() == {"risk": "an angry refund call", "score": 4}
    assert rows["a"].b is True and rows["a"].tags == ["an angry refund call"]
    assert (rows["c"].s, rows["c"].b, rows["c"].tags) == (None, None, None)  # NULL: not sent
    schemas = [p["response_format"]["json_schema"]["schema"] for p in responder.params]
    assert len(schemas) == 6  # rows a and b, three calls
    assert {"type": "object", "properties": {"value": {"type": "boolean"}},
            "required": ["value"], "additionalProperties": False} in schemas
    assert {"type": "object", "properties": {"value": {"type": "array",
                                                       "items": {"type": "string"}}},
            "required": ["value"], "additionalProperties": False} in schemas
    assert any(s["required"] == ["risk", "score"] for s in schemas)


def test_a_reply_that_does_not_fit_is_null_with_its_reason(spark, replies):
    frame = spark.sql("SELECT id, ai_query('m1', x, returnType => 'BOOLEAN', failOnError => "
                      "false) AS b FROM typed_calls")
    rows = {r.id: r.b for r in frame.collect()}

    assert frame.schema["b"].dataType.simpleString() == "struct<result:boolean,errorMessage:string>"
    assert rows["a"].result is True and rows["a"].errorMessage is None
    assert rows["free"].result is None
    assert rows["free"].errorMessage == ("invalid_structured_output: the reply is not valid "
                                         "JSON: 'Yes, the caller is angry.'")
    assert rows["wrong"].result is None
    assert rows["wrong"].errorMessage == ("invalid_structured_output: the reply does not match "
                                          "the schema at value: 'yes' is not of type 'boolean'")
    assert rows["c"].result is None and rows["c"].errorMessage is None


def test_with_fail_on_error_an_unfit_reply_fails_the_query(spark, replies):
    with pytest.raises(Exception, match="failOnError is true.*not valid JSON"):
        spark.sql("SELECT ai_query('m1', x, returnType => 'INT') FROM typed_calls "
                  "WHERE id = 'free'").collect()


def test_the_older_name_value_form_and_model_parameters(spark, replies):
    responder, _ = replies

    rows = spark.sql("""SELECT ai_query('m1', x, 'returnType', 'INT', 'modelParameters',
                                        named_struct('max_tokens', 32)) AS n
                        FROM typed_calls WHERE id = 'b'""").collect()

    assert [r.n for r in rows] == [4]  # the simulator counts the words
    assert responder.params[-1]["max_tokens"] == 32
    assert responder.params[-1]["response_format"]["json_schema"]["schema"]["properties"] == {
        "value": {"type": "integer", "minimum": -2 ** 31, "maximum": 2 ** 31 - 1}}


@pytest.mark.parametrize("arguments, message", [
    ("returnType => 'BOOLEAN', responseFormat => 'STRUCT<ok: BOOLEAN>'",
     "pass returnType or responseFormat, not both"),
    ("returnType => 'STRUCT<>'", "a STRUCT needs at least one field"),
])
def test_mistakes_fail_before_any_request(texts_view, fails_before_sending, arguments,
                                          message):
    fails_before_sending(f"SELECT ai_query('llama-70b', x, {arguments}) FROM {texts_view}",
                         message)


@pytest.fixture
def texts_view(spark):
    spark.createDataFrame(pd.DataFrame({"x": ["hello"]})).createOrReplaceTempView("typed_texts")
    return "typed_texts"


def test_spark_and_duckdb_give_the_same_typed_rows(engines_over, on_both):
    rows = pd.DataFrame({"call_id": ["T-1", "T-2", "T-3"],
                         "transcript": ["I want a refund, I am angry", "where is my order",
                                        None]})
    query = """SELECT call_id, ai_query('llama-70b', transcript, returnType => 'BOOLEAN') AS b,
                      ai_query('llama-70b', transcript,
                               returnType => 'STRUCT<risk: STRING, score: INT>').score AS score
               FROM call_center_transcripts"""

    on_spark, on_duckdb, (by_spark, by_duckdb) = on_both(
        engines_over(rows, "call_id string, transcript string"), query,
        ["call_id", "b", "score"])

    assert on_spark == on_duckdb == [("T-1", True, 7), ("T-2", True, 4), ("T-3", None, None)]
    assert by_spark == by_duckdb == 4
