"""ai_query and the AI functions on DuckDB, against the simulated endpoint."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.sql import FUNCTIONS, AIQueryError, register_ai_functions
from dagster_batchllm.testing import EchoResponder, SimulatedEndpoint
from dagster_batchllm.testing.databricks.examples import CALL_CENTER_PIPELINE

DATASET = Path(__file__).resolve().parents[2] / "assets" / "data" / "call_center_transcripts.csv.gz"


def _edited(query: str, *edits: tuple[str, str]) -> str:
    """``query`` with each (old, new) edit made, each ``old`` found exactly once."""
    for old, new in edits:
        assert query.count(old) == 1, f"the example no longer holds {old!r} once"
        query = query.replace(old, new)
    return query


# The Databricks example (dagster_batchllm.testing.databricks.examples) written by hand in DuckDB's
# dialect, no translation: regexp_replace needs 'g' to replace every match, '\s' is written
# without Spark's doubled backslash (issue 8 translates); it asks the simulated model, its rows in
# call_id order.
DATABRICKS_PIPELINE = _edited(
    CALL_CENTER_PIPELINE,
    (r"regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', '')",
     r"regexp_replace(transcript_raw_text, '[^a-zA-Z\s]', '', 'g')"),
    ("ai_query('llama-70b', transcript_text)", "ai_query('sim-model', transcript_text)"),
    ("WHERE risk_level IN ('High Risk', 'Medium Risk');",
     "WHERE risk_level IN ('High Risk', 'Medium Risk')\nORDER BY call_id;"),
)


class Recorder(EchoResponder):
    """The echo responder, remembering each request's messages and parameters."""

    def __init__(self, models=("sim-model",)):
        super().__init__(models)
        self.requests: list[tuple[list[dict], dict]] = []
        self._lock = threading.Lock()

    def respond(self, model, messages, params):
        with self._lock:
            self.requests.append((messages, params))
        return super().respond(model, messages, params)


class Verbatim(EchoResponder):
    """Replies with the prompt itself, so a test chooses the reply."""

    def respond(self, model, messages, params):
        return messages[-1]["content"]


@pytest.fixture
def transcripts() -> pd.DataFrame:
    calls = pd.read_csv(DATASET, dtype=str, nrows=60)
    return calls.dropna(subset=["transcript_raw_text"]).reset_index(drop=True)


@pytest.fixture
def con():
    connection = duckdb.connect()
    yield connection
    connection.close()


def _expected_label(summary: str, rules: list[tuple[str, str]], default: str) -> str:
    return next((label for word, label in rules if word in summary), default)


def test_databricks_pipeline_runs_on_duckdb(sim, make_client, con, transcripts):
    con.register("call_center_transcripts", transcripts)
    register_ai_functions(con, make_client(sim))

    result = con.sql(DATABRICKS_PIPELINE).df()

    cleaned = {row.call_id: re.sub(r"[^a-zA-Z\s]", "", row.transcript_raw_text).lower()
               for row in transcripts.itertuples()}
    expected = []
    for call_id, text in sorted(cleaned.items()):
        summary = "[sim] " + " ".join(text.split())  # the echo collapses whitespace
        risk = _expected_label(summary, [("angry", "High Risk"), ("upset", "Medium Risk")],
                               "Low Risk")
        action = _expected_label(summary, [("refund", "Refund Request"),
                                           ("complaint", "Complaint")], "General Inquiry")
        if risk != "Low Risk":
            expected.append((call_id, summary, risk, action))
    assert expected, "the sample should hold some angry or upset calls"
    assert list(result[["call_id", "summary_analysis", "risk_level", "action_required"]]
                .itertuples(index=False, name=None)) == expected
    assert sim.stats()["requests"] == len(set(cleaned.values()))


def test_rerun_of_the_same_query_sends_nothing(sim, make_client, con, transcripts):
    con.register("call_center_transcripts", transcripts)
    register_ai_functions(con, make_client(sim))
    first = con.sql(DATABRICKS_PIPELINE).df()
    sent = sim.stats()["requests"]

    again = con.sql(DATABRICKS_PIPELINE).df()

    assert sim.stats()["requests"] == sent
    pd.testing.assert_frame_equal(first, again)


def test_identical_requests_are_sent_once(sim, make_client, con):
    con.execute("CREATE TABLE t AS SELECT 'ticket ' || (i % 5)::VARCHAR AS text "
                "FROM range(3000) r(i)")  # more than one 2048-row vector
    ai = register_ai_functions(con, make_client(sim))

    rows = con.sql("SELECT text, ai_query('sim-model', text) AS reply FROM t").fetchall()

    assert all(reply == f"[sim] {text}" for text, reply in rows)
    assert sim.stats()["requests"] == 5
    assert ai.stats.rows == 3000
    assert ai.stats.deduplicated + ai.stats.cached + ai.stats.requests == 3000


def test_nulls_give_null_without_a_request(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    row = con.sql("SELECT ai_query('sim-model', NULL::VARCHAR), ai_summarize(NULL), "
                  "ai_similarity('a', NULL), ai_query('sim-model', NULL, failOnError := false)"
                  ).fetchall()[0]
    assert row == (None, None, None, {"result": None, "errorMessage": None})
    assert sim.stats()["requests"] == 0


def test_fail_on_error_true_fails_the_query_and_the_rerun_sends_only_the_failed(
        sim, make_client, con):
    con.execute("CREATE TABLE t AS SELECT 'call ' || i::VARCHAR AS text FROM range(4) r(i)")
    register_ai_functions(con, make_client(sim, max_attempts=1))
    sim.script(500)

    with pytest.raises(duckdb.Error,
                       match=r"failed for 1 of the 4 rows in a batch.*server_error.*failOnError"):
        con.sql("SELECT ai_query('sim-model', text) FROM t").fetchall()
    assert sim.stats()["requests"] == 4

    rows = con.sql("SELECT ai_query('sim-model', text) FROM t ORDER BY 1").fetchall()
    assert rows == [(f"[sim] call {i}",) for i in range(4)]
    assert sim.stats()["requests"] == 5


def test_fail_on_error_false_returns_errors_as_data(sim, make_client, con):
    con.execute("CREATE TABLE t AS SELECT 'call ' || i::VARCHAR AS text FROM range(6) r(i)")
    register_ai_functions(con, make_client(sim, max_attempts=1))
    sim.script(500, 500)

    rows = con.sql("SELECT r.result, r.errorMessage FROM (SELECT ai_query('sim-model', text, "
                   "failOnError := false) AS r FROM t)").fetchall()

    failed = [error for result, error in rows if error is not None]
    assert len(failed) == 2 and all(e.startswith("server_error: HTTP 500") for e in failed)
    assert all(result is None for result, error in rows if error is not None)
    assert sum(1 for result, error in rows if result and result.startswith("[sim] call")) == 4


def test_response_format_type_string_returns_a_struct(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    rel = con.sql("SELECT ai_query('sim-model', 'an angry refund call', "
                  "responseFormat := 'STRUCT<risk: STRING, score: INT, tags: ARRAY<STRING>>') "
                  "AS r")
    assert str(rel.types[0]) == "STRUCT(risk VARCHAR, score INTEGER, tags VARCHAR[])"
    value = rel.fetchall()[0][0]
    assert value == {"risk": "an angry refund call", "score": 4,
                     "tags": ["an angry refund call"]}


def test_response_format_json_schema_returns_a_struct(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    schema = ('{"type": "object", "properties": {"risk": {"type": "string", "enum": '
              '["high", "low"]}, "score": {"type": "number"}}, "required": ["risk", "score"]}')
    rel = con.execute("SELECT ai_query('sim-model', 'risk is high', responseFormat := ?, "
                      "failOnError := false) AS r", [schema])
    value = rel.fetchone()[0]
    assert value == {"result": {"risk": "high", "score": 3.0}, "errorMessage": None}


def test_return_type_reads_the_reply(make_client, con):
    """A chat model is asked for {"value": <the type>}: a reply that fits is the value, free
    text is the row's error (tests/sql/test_sql_return_types.py has the rest)."""
    with SimulatedEndpoint(responder=Verbatim()) as verbatim:
        register_ai_functions(con, make_client(verbatim))
        rows = dict(con.sql("SELECT x, ai_query('sim-model', x, returnType := 'INT', "
                            "failOnError := false) FROM (VALUES ('{\"value\": 42}'), "
                            "('forty-two')) v(x)").fetchall())
    assert rows['{"value": 42}'] == {"result": 42, "errorMessage": None}
    assert rows["forty-two"]["result"] is None
    assert rows["forty-two"]["errorMessage"].startswith(
        "invalid_structured_output: the reply is not valid JSON: 'forty-two'")


def test_model_parameters_are_sent(make_client, con):
    recorder = Recorder()
    with SimulatedEndpoint(responder=recorder) as sim:
        register_ai_functions(con, make_client(sim))
        con.sql("SELECT ai_query('sim-model', 'hi', "
                "modelParameters := {'max_tokens': 7, 'temperature': 0.5})").fetchall()
    (messages, params), = recorder.requests
    assert messages == [{"role": "user", "content": "hi"}]
    assert params["max_tokens"] == 7 and params["temperature"] == 0.5


def test_every_ai_function(make_client, con):
    recorder = Recorder()
    with SimulatedEndpoint(responder=recorder) as sim:
        register_ai_functions(con, make_client(sim), default_model="sim-model")
        row = con.sql("""
            SELECT ai_summarize('The caller wants a refund', 20) AS summary,
                   ai_classify('I want a refund now', ['complaint', 'refund']) AS label,
                   ai_extract('John Smith called from Paris', ['person', 'city']) AS entities,
                   ai_analyze_sentiment('I am so happy, positive vibes') AS sentiment,
                   ai_translate('good morning', 'French') AS translated,
                   ai_fix_grammar('he go to school') AS fixed,
                   ai_mask('call me at 555-1234', ['phone']) AS masked,
                   ai_gen('Write a haiku about queues') AS generated,
                   ai_similarity('a cat', 'a kitten') AS similarity
        """).df().iloc[0].to_dict()
    assert row["summary"] == "[sim] The caller wants a refund"
    assert row["label"] == "refund"
    assert row["entities"] == {"person": "John Smith called from Paris",
                               "city": "John Smith called from Paris"}
    assert row["sentiment"] == "positive"
    assert row["translated"] == "[sim] good morning"
    assert row["fixed"] == "[sim] he go to school"
    assert row["masked"] == "[sim] call me at 555-1234"
    assert row["generated"] == "[sim] Write a haiku about queues"
    assert 0.0 <= row["similarity"] <= 1.0
    systems = {m[0]["content"].split(":")[0].split(" the ")[0]: (m, p)
               for m, p in recorder.requests if m[0]["role"] == "system"}
    assert len(recorder.requests) == 9 and len(systems) == 8  # ai_gen sends no system prompt
    summary_messages, summary_params = next(
        (m, p) for m, p in recorder.requests if "at most 20 words" in m[0]["content"])
    assert summary_messages[1] == {"role": "user", "content": "The caller wants a refund"}
    assert summary_params["max_tokens"] == 72
    similarity = next(m for m, _ in recorder.requests if "Text 2:" in m[-1]["content"])
    assert similarity[-1]["content"] == "Text 1:\na cat\n\nText 2:\na kitten"


def test_per_row_endpoints(make_client, con):
    with SimulatedEndpoint(models=("model-a", "model-b")) as sim:
        register_ai_functions(con, make_client(sim))
        rows = con.sql("SELECT m, ai_query(m, 'hi from ' || m) FROM "
                       "(VALUES ('model-a'), ('model-b'), ('model-a')) v(m)").fetchall()
        assert rows == [("model-a", "[sim] hi from model-a"), ("model-b", "[sim] hi from model-b"),
                        ("model-a", "[sim] hi from model-a")]
        assert sim.stats()["requests"] == 2
        with pytest.raises(duckdb.Error, match="no default model"):
            con.sql("SELECT ai_gen('hello')").fetchall()


class NamesModel(EchoResponder):
    """Says which model answered."""

    def respond(self, model, messages, params):
        return f"{model}: {messages[-1]['content']}"


def test_without_an_endpoint_the_default_model_else_the_only_served_one(make_client, con):
    with SimulatedEndpoint(models=("model-a",), responder=NamesModel()) as sim:
        register_ai_functions(con, make_client(sim))
        assert con.sql("SELECT ai_gen('hi')").fetchall() == [("model-a: hi",)]
    with SimulatedEndpoint(models=("model-a", "model-b"), responder=NamesModel()) as sim:
        register_ai_functions(con, make_client(sim, default_model="model-b"))
        assert con.sql("SELECT ai_gen('hi')").fetchall() == [("model-b: hi",)]
        register_ai_functions(con, make_client(sim, default_model="model-b"),
                              default_model="model-a")
        assert con.sql("SELECT ai_gen('hi')").fetchall() == [("model-a: hi",)]


@pytest.mark.parametrize("query, argument", [
    ("SELECT ai_query('no-such-model', 'hi')", r"argument 'endpoint' names 'no-such-model'.*"
                                               r"served models: \['sim-model'\]"),
    ("SELECT ai_query('sim-model', 42)", r"argument 'request' must be a STRING, got INTEGER"),
    ("SELECT ai_query('sim-model', 'hi', failOnError := 'no')",
     r"argument 'failOnError' must be a BOOLEAN, got VARCHAR"),
    ("SELECT ai_query('sim-model', 'hi', responseFormat := 'STRUCT<a STRING')",
     r"argument 'responseFormat': expected ',' or '>'"),
    ("SELECT ai_query('sim-model', 'hi', responseFormat := '{not json')",
     r"argument 'responseFormat' starts with '\{' but is not valid JSON"),
    ("SELECT ai_query('sim-model', 'hi', responseFormat := 'INT')",
     r"argument 'responseFormat' must be a STRUCT<...> type"),
    ("SELECT ai_query('sim-model', 'hi', returnType := 'STRUCT<>')",
     r"ai_query: argument 'returnType': a STRUCT needs at least one field"),
    ("SELECT ai_query('sim-model', 'hi', modelParameters := {'tokens': 5})",
     r"argument 'modelParameters' has unknown parameter\(s\) \['tokens'\]"),
    ("SELECT ai_classify('text', ['only-one'])", r"argument 'labels' needs at least 2 labels"),
    ("SELECT ai_classify('text', 'refund')", r"argument 'labels' must be an ARRAY<STRING>"),
    ("SELECT ai_summarize('text', 'ten')", r"argument 'max_words' must be an INTEGER"),
    ("SELECT ai_summarize('text', -1)", r"argument 'max_words' must be at least 0"),
])
def test_errors_name_the_argument_and_send_nothing(sim, make_client, con, query, argument):
    register_ai_functions(con, make_client(sim))
    with pytest.raises(duckdb.Error, match=argument):
        con.sql(query).fetchall()
    assert sim.stats()["requests"] == 0


def test_query_failure_is_an_ai_query_error_through_execute(sim, make_client, con):
    ai = register_ai_functions(con, make_client(sim, max_attempts=1))
    sim.script(500)
    with pytest.raises(duckdb.Error) as raised:
        ai.execute("SELECT ai_gen('hello')").fetchall()
    assert AIQueryError.__name__ in str(raised.value)


def test_batches_in_flight_at_once_share_identical_requests(sim, make_client, con):
    """DuckDB runs the UDF on several threads for big tables; a request is still sent once."""
    sim.configure(latency_s=0.2)
    ai = register_ai_functions(con, make_client(sim))
    call = FUNCTIONS["ai_query"].bind({})
    rows = [("sim-model", f"ticket {i % 4}") for i in range(40)]
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(ai.runtime.answer([(call, rows)])))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sim.stats()["requests"] == 4
    assert all(outcomes == [[(f"[sim] {text}", None) for _, text in rows]]
               for outcomes in results) and len(results) == 3
