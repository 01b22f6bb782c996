"""Databricks SQL run as written on DuckDB and SQLite: ``dialect="databricks"`` (sqlglot)."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.sql import TranslationError, execute, register_ai_functions, translate
from dagster_batchllm.testing import EchoResponder, SimulatedEndpoint

ROOT = Path(__file__).resolve().parents[2]

from assets.sql_pipeline import DUCKDB_PIPELINE_SQL, PIPELINE_SQL  # noqa: E402

DATASET = ROOT / "assets" / "data" / "call_center_transcripts.csv.gz"

JSON_SCHEMA = json.dumps({
    "type": "object",
    "properties": {"risk": {"type": "string", "enum": ["high", "low"]},
                   "score": {"type": "integer"}},
    "required": ["risk", "score"],
})

# The forms of the Databricks ai_query documentation, with its named arguments.
DOCUMENTED_FORMS = f"""
SELECT id,
       ai_query('sim-model', text, failOnError => false) AS checked,
       ai_query('sim-model', text,
                modelParameters => named_struct('max_tokens', 100, 'temperature', 0.0))
           AS tuned,
       ai_query('sim-model', text, responseFormat => '{JSON_SCHEMA}') AS by_schema,
       ai_query(endpoint => 'sim-model', request => text,
                responseFormat => 'STRUCT<risk: STRING, score: INT>',
                failOnError => false) AS by_type
FROM tickets ORDER BY id
"""
TICKETS = ["a refund please", "an angry call about a complaint"]


class Recorder(EchoResponder):
    """The echo responder, remembering the generation parameters of each request."""

    def __init__(self):
        super().__init__(("sim-model",))
        self.params: list[dict] = []
        self._lock = threading.Lock()

    def respond(self, model, messages, params):
        with self._lock:
            self.params.append(dict(params))
        return super().respond(model, messages, params)


@pytest.fixture
def recorder():
    responder = Recorder()
    with SimulatedEndpoint(responder=responder) as sim:
        yield sim, responder


@pytest.fixture
def duck(tables_in):
    con = tables_in(duckdb.connect())
    con.execute("CREATE TABLE tickets AS SELECT * FROM (VALUES (1, ?), (2, ?)) t(id, text)",
                TICKETS)
    return con


@pytest.fixture
def lite(tables_in):
    return tables_in(sqlite3.connect(":memory:"),
                     "CREATE TABLE tickets (id INTEGER PRIMARY KEY, text TEXT)",
                     ("INSERT INTO tickets (text) VALUES (?)", [(t,) for t in TICKETS]))


def _sent_tuned(responder: Recorder) -> list[dict]:
    return [p for p in responder.params if p.get("max_tokens") == 100]


# -- the documented named-argument forms -------------------------------------------------------
def test_documented_named_arguments_on_duckdb(recorder, make_client, duck):
    sim, responder = recorder
    register_ai_functions(duck, make_client(sim))

    rows = execute(duck, DOCUMENTED_FORMS, dialect="databricks").fetchall()

    for (_, checked, tuned, by_schema, by_type), text in zip(rows, TICKETS, strict=True):
        assert checked == {"result": f"[sim] {text}", "errorMessage": None}
        assert tuned == f"[sim] {text}"
        assert by_schema["score"] == len(text.split()) and by_schema["risk"] in ("high", "low")
        assert by_type == {"result": {"risk": text, "score": len(text.split())},
                           "errorMessage": None}
    tuned = _sent_tuned(responder)
    assert len(tuned) == 2 and all(p["temperature"] == 0.0 for p in tuned)
    schemas = [p["response_format"] for p in responder.params if "response_format" in p]
    assert len(schemas) == 4  # two rows each for the JSON schema and the STRUCT type


def test_documented_named_arguments_on_sqlite(recorder, make_client, lite):
    sim, responder = recorder
    register_ai_functions(lite, make_client(sim))

    rows = execute(lite, DOCUMENTED_FORMS, dialect="databricks").fetchall()

    for (_, checked, tuned, by_schema, by_type), text in zip(rows, TICKETS, strict=True):
        # SQLite has no structs: structured results are JSON text.
        assert json.loads(checked) == {"result": f"[sim] {text}", "errorMessage": None}
        assert tuned == f"[sim] {text}"
        assert json.loads(by_schema)["score"] == len(text.split())
        assert json.loads(by_type) == {"result": {"risk": text, "score": len(text.split())},
                                       "errorMessage": None}
    tuned = _sent_tuned(responder)
    assert len(tuned) == 2 and all(p["temperature"] == 0.0 for p in tuned)


def test_named_arguments_take_the_engines_form():
    query = ("SELECT ai_query('m', t, failOnError => false, "
             "modelParameters => named_struct('max_tokens', 100, 'temperature', 0.0)), "
             "ai_classify(t, array('refund', 'complaint')), ai_summarize(t, max_words => 5) "
             "FROM x")
    assert translate(query, write="duckdb", pretty=False) == (
        "SELECT AI_QUERY('m', t, failOnError := FALSE, modelParameters := {'max_tokens': 100, "
        "'temperature': 0.0}), AI_CLASSIFY(t, ['refund', 'complaint']), "
        "AI_SUMMARIZE(t, max_words := 5) FROM x")
    assert translate(query, write="sqlite", pretty=False) == (
        "SELECT AI_QUERY('m', t, NULL, FALSE, JSON_OBJECT('max_tokens', 100, 'temperature', "
        "0.0)), AI_CLASSIFY(t, JSON_ARRAY('refund', 'complaint')), AI_SUMMARIZE(t, 5) FROM x")


def test_databricks_parameter_markers_are_bound(sim, make_client, duck, lite):
    query = "SELECT ai_query(:model, 'Summarize: ' || text) FROM tickets ORDER BY id"
    for con in (duck, lite):
        register_ai_functions(con, make_client(sim))
        rows = execute(con, query, {"model": "sim-model"}, dialect="databricks").fetchall()
        assert rows == [(f"[sim] Summarize: {t}",) for t in TICKETS]


# -- regexp_replace and LIKE keep Databricks' meaning ------------------------------------------
def test_regexp_replace_replaces_every_match_with_databricks_escapes(duck):
    text = "Hi!! Order #4521,\tREFUND?\x0bnow\r\nok"
    query = r"SELECT LOWER(regexp_replace(?, '[^a-zA-Z\\s]', '')) AS cleaned"

    (as_written,) = duck.execute(query, [text]).fetchone()
    (translated,) = duck.execute(translate(query), [text]).fetchone()

    # Java's \s includes the vertical tab, so Databricks keeps it; Python's \s does too.
    assert translated == re.sub(r"[^a-zA-Z\s]", "", text).lower()
    assert translated == "hi order \trefund\x0bnow\r\nok"
    # As written, DuckDB reads '\\s' as a backslash and 's', and replaces only the first match.
    assert as_written == "hi! order #4521,\trefund?\x0bnow\r\nok"


@pytest.mark.parametrize(("call", "expected"), [
    (r"regexp_replace('ann-bob', '(\\w+)-(\\w+)', '$2 & $1')", "bob & ann"),
    (r"regexp_replace('costs 5', '(\\d)', '\\$$1')", "costs $5"),
    (r"regexp_replace('a.b.c', '\\.', '/')", "a/b/c"),
    # Java's '.' stops at '\r' as it does at '\n'; RE2's does not.
    ("regexp_replace('keep\\rthis', 'k.*', 'X')", "X\rthis"),
    (r"regexp_replace('aXbXc', 'X', '-', 3)", "aXb-c"),
    (r"regexp_extract('call 4521 at 9', '(\\d+)', 1)", "4521"),
    (r"'ABC' RLIKE '^[A-Z]+$'", True),
])
def test_regexps_keep_java_semantics(duck, call, expected):
    (value,) = duck.execute(translate(f"SELECT {call}")).fetchone()
    assert value == expected


@pytest.mark.parametrize(("pattern", "subject", "expected"), [
    (r"'50\\%'", "50%", True),
    (r"'50\\%'", "50x", False),
    ("'%angry%'", "so ANGRY", False),
    ("'%angry%'", "so angry!", True),
    ("'a_c'", "abc", True),
    ("'[x]*'", "[x]*", True),
])
def test_like_keeps_databricks_semantics(duck, pattern, subject, expected):
    query = f"SELECT ? LIKE {pattern}"
    (on_duckdb,) = duck.execute(translate(query, write="duckdb"), [subject]).fetchone()
    lite = sqlite3.connect(":memory:")
    (on_sqlite,) = lite.execute(translate(query, write="sqlite"), [subject]).fetchone()
    lite.close()
    assert bool(on_duckdb) is expected and bool(on_sqlite) is expected


# -- refused before anything is sent -----------------------------------------------------------
UNTRANSLATABLE = """SELECT id,
       ai_query('sim-model', text) AS summary,
       weekday(text) AS day,
       regexp_replace(text, '(?<word>\\\\w+)', '${word}!') AS shout
FROM tickets"""


def test_untranslatable_constructs_are_refused_with_their_line(sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))

    with pytest.raises(TranslationError) as raised:
        execute(duck, UNTRANSLATABLE, dialect="databricks")

    message = str(raised.value)
    assert "cannot be translated to DuckDB faithfully; it was not run" in message
    assert ("line 3: weekday(text): sqlglot does not know the Databricks function weekday(), "
            "so it would pass the call on unchanged, and DuckDB has a weekday() of its own"
            ) in message
    assert re.search(r"line 4: REGEXP_REPLACE\(text, .*\): the replacement: named group "
                     r"references \(\$\{name\}\) have no DuckDB equivalent", message)
    assert [p.line for p in raised.value.problems] == [3, 4]
    assert sim.stats()["requests"] == 0


def test_sqlite_refuses_what_it_does_differently(sim, make_client, lite):
    register_ai_functions(lite, make_client(sim))
    query = ("SELECT ai_query('sim-model', text),\n"
             "       LOWER(regexp_replace(text, '[^a-z]', '')),\n"
             "       text ILIKE '%refund%'\n"
             "FROM tickets")

    with pytest.raises(TranslationError) as raised:
        execute(lite, query, dialect="databricks")

    assert {(p.line, p.reason.split(";")[0]) for p in raised.value.problems} == {
        (2, "SQLite's lower() changes only ASCII letters"),
        (2, "SQLite has no regular expression functions"),
        (3, "SQLite compares case only for ASCII letters"),
    }
    assert sim.stats()["requests"] == 0


def test_what_sqlglot_reports_unsupported_is_refused(sim, make_client, lite):
    register_ai_functions(lite, make_client(sim))

    with pytest.raises(TranslationError, match=r"line 2: TABLESAMPLE \(50 PERCENT\): "
                                               r"sqlglot: TABLESAMPLE unsupported"):
        execute(lite, "SELECT ai_query('sim-model', text)\nFROM tickets TABLESAMPLE (50 PERCENT)",
                dialect="databricks")
    assert sim.stats()["requests"] == 0


@pytest.mark.parametrize(("query", "line", "reason"), [
    ("SELECT\n ai_query('m', t, temperature => 0.2) FROM x", 2,
     "ai_query has no parameter 'temperature'"),
    ("SELECT ai_query('m', t, failOnError => false, 'STRING') FROM x", 1,
     "a positional argument follows a named one"),
    ("SELECT ai_query('m') FROM x", 1, "ai_query needs 'request'"),
    ("SELECT regexp_replace(t, pattern_column, '') FROM x", 1,
     "the pattern must be a string literal"),
    ("SELECT\n\n (1 FROM x", 3, "sqlglot cannot parse this as Databricks SQL"),
])
def test_mistakes_are_refused_with_their_line(query, line, reason):
    with pytest.raises(TranslationError) as raised:
        translate(query)
    (problem,) = raised.value.problems
    assert problem.line == line and problem.reason.startswith(reason)


def test_dialect_names_are_checked(sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))
    with pytest.raises(InferenceConfigError, match="dialect 'postgres' cannot be translated"):
        execute(duck, "SELECT 1", dialect="postgres")
    # The engine's own dialect runs unchanged.
    assert execute(duck, "SELECT {'a': 1} AS s", dialect="duckdb").fetchone() == ({"a": 1},)


# -- the example's SQL-defined asset --------------------------------------------------------
def test_the_assets_databricks_query_means_what_its_duckdb_twin_means(sim, make_client):
    raw = pd.read_csv(DATASET, dtype=str, nrows=120)
    raw["call_timestamp"] = pd.to_datetime(raw["call_timestamp"])
    con = duckdb.connect()
    con.register("call_center_transcripts", raw)
    ai = register_ai_functions(con, make_client(sim))

    databricks = ai.execute(PIPELINE_SQL, {"endpoint": "sim-model"}, dialect="databricks").df()
    sent = sim.stats()["requests"]
    duck = ai.execute(DUCKDB_PIPELINE_SQL, {"endpoint": "sim-model"}).df()
    con.close()

    assert sent > 0 and sim.stats()["requests"] == sent  # the twin asks exactly the same
    assert len(databricks) == len(raw)
    pd.testing.assert_frame_equal(databricks.sort_values("call_id", ignore_index=True),
                                  duck.sort_values("call_id", ignore_index=True))
