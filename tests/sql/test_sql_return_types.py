"""ai_query's returnType on a chat model (issue 31): the model is asked for the type as
structured output (a JSON schema in response_format), and its reply is read into that type:
DuckDB's STRUCT, BOOLEAN and lists, SQLite's integers and JSON text. A reply that does not fit
is the row's error. On DuckDB and SQLite files, against the simulated endpoint."""

from __future__ import annotations

import json
import sqlite3
import threading

import duckdb
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.sql import execute, register_ai_functions
from dagster_batchllm.testing import EchoResponder, SimulatedEndpoint

CALLS = [("a", "an angry refund call"), ("b", "where is my order"), ("c", None)]
TYPED = """SELECT id,
       ai_query('sim-model', x, returnType := 'STRUCT<risk: STRING, score: INT>') AS s,
       ai_query('sim-model', x, returnType := 'BOOLEAN') AS b,
       ai_query('sim-model', x, returnType := 'ARRAY<STRING>') AS tags
FROM calls ORDER BY id"""
BOOLEAN_SCHEMA = {"type": "object", "properties": {"value": {"type": "boolean"}},
                  "required": ["value"], "additionalProperties": False}


class Replies(EchoResponder):
    """The echo responder (schema-valid JSON for a json_schema request), remembering each
    request's parameters; a prompt 'say: <text>' is answered <text>, whatever was asked."""

    def __init__(self):
        super().__init__(("sim-model",))
        self.params: list[dict] = []
        self._lock = threading.Lock()

    def respond(self, model, messages, params):
        with self._lock:
            self.params.append(dict(params))
        prompt = messages[-1]["content"]
        if prompt.startswith("say: "):
            return prompt.removeprefix("say: ")
        return super().respond(model, messages, params)

    def schemas(self) -> list[dict]:
        return [p["response_format"]["json_schema"]["schema"] for p in self.params]


@pytest.fixture
def replies():
    responder = Replies()
    with SimulatedEndpoint(responder=responder) as endpoint:
        yield responder, endpoint


@pytest.fixture
def duck(tmp_path):
    con = duckdb.connect(str(tmp_path / "calls.duckdb"))
    con.execute("CREATE TABLE calls (id VARCHAR, x VARCHAR)")
    con.executemany("INSERT INTO calls VALUES (?, ?)", CALLS)
    yield con
    con.close()


@pytest.fixture
def lite(tmp_path):
    con = sqlite3.connect(tmp_path / "calls.db")
    con.execute("CREATE TABLE calls (id TEXT, x TEXT)")
    con.executemany("INSERT INTO calls VALUES (?, ?)", CALLS)
    yield con
    con.close()


def test_duckdb_gives_typed_columns_and_sends_the_schema(replies, make_client, duck):
    responder, endpoint = replies
    register_ai_functions(duck, make_client(endpoint))

    rel = duck.sql(TYPED)
    rows = {r[0]: r[1:] for r in rel.fetchall()}

    assert [str(t) for t in rel.types[1:]] == ["STRUCT(risk VARCHAR, score INTEGER)", "BOOLEAN",
                                               "VARCHAR[]"]
    assert rows["a"] == ({"risk": "an angry refund call", "score": 4}, True,
                         ["an angry refund call"])
    assert rows["c"] == (None, None, None)  # NULL in, NULL out: not sent
    assert len(responder.params) == 6  # two rows, three calls
    assert BOOLEAN_SCHEMA in responder.schemas()
    struct = next(s for s in responder.schemas() if "risk" in s["properties"])
    assert struct["required"] == ["risk", "score"]
    assert struct["properties"]["score"]["type"] == ["integer", "null"]
    assert all(p["response_format"]["json_schema"]["strict"] for p in responder.params)


def test_sqlite_gives_integers_and_json_text_and_sends_the_schema(replies, make_client, lite):
    responder, endpoint = replies
    register_ai_functions(lite, make_client(endpoint))

    rows = {r[0]: r[1:] for r in execute(lite, """
        SELECT id, ai_query('sim-model', x, 'BOOLEAN') AS b, typeof(ai_query('sim-model', x,
               'BOOLEAN')), ai_query('sim-model', x, 'STRUCT<risk: STRING, score: INT>')
               ->> '$.score', ai_query('sim-model', x, 'ARRAY<STRING>')
        FROM calls ORDER BY id""").fetchall()}

    assert rows["a"][:3] == (1, "integer", 4)
    assert json.loads(rows["a"][3]) == ["an angry refund call"]
    assert rows["b"][0] == 1 and rows["c"] == (None, "null", None, None)
    assert BOOLEAN_SCHEMA in responder.schemas()
    assert len(responder.params) == 6  # the collect pass's requests, each sent once


@pytest.mark.parametrize("engine", ["duckdb", "sqlite"])
def test_a_reply_that_does_not_fit_is_null_with_its_reason(replies, make_client, duck, lite,
                                                           engine):
    _, endpoint = replies
    con = duck if engine == "duckdb" else lite
    register_ai_functions(con, make_client(endpoint))
    con.execute("DELETE FROM calls")
    con.executemany("INSERT INTO calls VALUES (?, ?)", [
        ("free", "say: Yes, the caller is angry."), ("wrong", 'say: {"value": "yes"}'),
        ("fits", "is the caller angry")])
    query = ("SELECT id, ai_query('sim-model', x, returnType => 'BOOLEAN', failOnError => "
             "false) AS b FROM calls")

    found = execute(con, query, dialect="databricks").fetchall()
    rows = {k: json.loads(v) if isinstance(v, str) else v for k, v in found}

    assert rows["fits"] == {"result": True, "errorMessage": None}
    assert rows["free"]["result"] is None
    assert rows["free"]["errorMessage"] == ("invalid_structured_output: the reply is not valid "
                                            "JSON: 'Yes, the caller is angry.'")
    assert rows["wrong"]["result"] is None
    assert rows["wrong"]["errorMessage"] == ("invalid_structured_output: the reply does not "
                                             "match the schema at value: 'yes' is not of type "
                                             "'boolean'")
    # failOnError true (the default, as in Databricks): the query fails, naming the reason.
    with pytest.raises(Exception, match="failOnError is true.*not valid JSON"):
        execute(con, query.replace(", failOnError => false", ""), dialect="databricks")


def test_the_databricks_dialect_reads_both_forms(replies, make_client, duck, lite):
    _, endpoint = replies
    register_ai_functions(duck, make_client(endpoint))
    register_ai_functions(lite, make_client(endpoint))
    query = """SELECT id, ai_query('sim-model', x, returnType => 'BOOLEAN') AS b,
                      ai_query('sim-model', x, 'returnType', 'ARRAY<STRING>') AS tags
               FROM calls WHERE id = 'a'"""

    on_duckdb = execute(duck, query, dialect="databricks").fetchall()
    on_sqlite = execute(lite, query, dialect="databricks").fetchall()

    assert on_duckdb == [("a", True, ["an angry refund call"])]
    assert on_sqlite == [("a", 1, '["an angry refund call"]')]


def test_dates_and_numbers_are_asked_for_and_typed(replies, make_client, duck):
    responder, endpoint = replies
    register_ai_functions(duck, make_client(endpoint))

    rel = duck.sql("""SELECT ai_query('sim-model', x, returnType := 'DATE') AS d,
                             ai_query('sim-model', x, returnType := 'DOUBLE') AS n,
                             ai_query('sim-model', 'say: {"value": "soon"}', returnType := 'DATE',
                                      failOnError := false).errorMessage AS e
                      FROM calls WHERE id = 'a'""")
    [(day, number, error)] = rel.fetchall()

    assert [str(t) for t in rel.types] == ["DATE", "DOUBLE", "VARCHAR"]
    assert day.year == 2024 and number == 4.0
    assert error == "invalid_structured_output: the reply is not a DATE (returnType): 'soon'"
    assert {"type": "string", "format": "date"} in [
        s["properties"]["value"] for s in responder.schemas()]


def test_a_string_return_type_is_the_plain_reply(replies, make_client, duck):
    responder, endpoint = replies
    register_ai_functions(duck, make_client(endpoint))

    rows = duck.sql("SELECT ai_query('sim-model', x, returnType := 'STRING') FROM calls "
                    "WHERE id = 'a'").fetchall()

    assert rows == [("[sim] an angry refund call",)]
    assert "response_format" not in responder.params[0]


@pytest.mark.parametrize("engine, query", [
    ("duckdb", "SELECT ai_query('sim-model', x, returnType := 'BOOLEAN', "
               "responseFormat := 'STRUCT<ok: BOOLEAN>') FROM calls"),
    ("sqlite", "SELECT ai_query('sim-model', x, 'BOOLEAN', NULL, NULL, "
               "'STRUCT<ok: BOOLEAN>') FROM calls"),
])
def test_return_type_with_response_format_fails_before_sending(replies, make_client, duck,
                                                                lite, engine, query):
    _, endpoint = replies
    con = duck if engine == "duckdb" else lite
    register_ai_functions(con, make_client(endpoint))

    with pytest.raises(Exception, match="pass returnType or responseFormat, not both"):
        execute(con, query).fetchall()
    assert endpoint.stats(log=False)["requests"] == 0


def test_an_embedding_model_still_takes_array_float(embed_sim, make_client, lite):
    register_ai_functions(lite, make_client(embed_sim, endpoint_kwargs={
        "embedding_models": ("sim-embed",)}))

    [(vector,)] = execute(lite, "SELECT ai_query('sim-embed', x, 'ARRAY<FLOAT>') FROM calls "
                                "WHERE id = 'a'").fetchall()

    assert len(json.loads(vector)) == 16


def test_a_custom_model_reads_its_prediction_as_before(replies, mlflow_registry, tmp_path,
                                                       make_settings):
    """An MLflow model answers in its own type: returnType reads its prediction, nothing is
    asked of it; a chat call in the same query is asked for its type."""
    import dataclasses

    from dagster_batchllm.core.settings import MlflowModelSpec
    from dagster_batchllm.simulator.mlflow_registry import feature_frame, fit_risk_model

    responder, endpoint = replies
    settings = dataclasses.replace(
        make_settings(endpoint), mlflow_registry_uri=mlflow_registry.uri,
        mlflow_models=(MlflowModelSpec(name="risk", model_uri="models:/risk@champion"),))
    features = feature_frame(5, seed=3)
    con = duckdb.connect()
    con.register("features", features)
    with InferenceClient(settings) as client:
        register_ai_functions(con, client)
        rows = con.sql("""SELECT ai_query('risk', {'f1': f1, 'f2': f2}, returnType := 'DOUBLE')
                                 AS p, ai_query('sim-model', 'is it risky', returnType :=
                                 'BOOLEAN') AS b FROM features""").fetchall()

    assert [p for p, _ in rows] == [float(v) for v in
                                    fit_risk_model(1).predict(features[["f1", "f2"]])]
    assert {b for _, b in rows} == {True}
    assert responder.schemas() == [BOOLEAN_SCHEMA]  # one chat request; the model got none
