"""Databricks SQL as its docs write it (issue 19): unreadable replies, the older ai_query form,
refusals that name the construct and its line, ${...} placeholders, blank requests."""

from __future__ import annotations

import json
import sqlite3

import duckdb
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.sql import AIQueryError, TranslationError, execute, register_ai_functions
from dagster_batchllm.sql.dialects import translate
from dagster_batchllm.testing import SimulatedEndpoint

TEXTS = [("a", "I love this blender"), ("b", "The toaster broke"), ("c", "It is a kettle"),
         ("d", "   "), ("e", None)]


@pytest.fixture
def duck(tables_in):
    return tables_in(duckdb.connect(), "CREATE TABLE t (id VARCHAR, x VARCHAR)",
                     ("INSERT INTO t VALUES (?, ?)", TEXTS))


@pytest.fixture
def lite(tables_in):
    return tables_in(sqlite3.connect(":memory:"), "CREATE TABLE t (id TEXT, x TEXT)",
                     ("INSERT INTO t VALUES (?, ?)", TEXTS))


# -- 1. an unreadable reply is NULL, not a failed query ---------------------------------------
JSON_FUNCTIONS = {
    "ai_classify": "ai_classify(x, ['good', 'bad'])",
    "ai_analyze_sentiment": "ai_analyze_sentiment(x)",
    "ai_extract": "ai_extract(x, ['product'])",
    "ai_similarity": "ai_similarity(x, 'a blender')",
}


@pytest.mark.parametrize("function", list(JSON_FUNCTIONS))
def test_an_unreadable_reply_is_null_on_duckdb(sim, make_client, duck, function):
    register_ai_functions(duck, make_client(sim))
    sim.script("bad_structured")  # the first request's reply is not JSON

    rows = dict(duck.execute(f"SELECT id, {JSON_FUNCTIONS[function]} FROM t").fetchall())

    assert sum(v is None for k, v in rows.items() if k in "abc") == 1  # the unreadable one
    assert rows["d"] is None and rows["e"] is None  # blank and NULL: not sent
    assert sim.stats(log=False)["requests"] == 3


@pytest.mark.parametrize("function", ["ai_classify", "ai_analyze_sentiment"])
def test_an_unreadable_reply_is_null_on_sqlite(sim, make_client, lite, function):
    register_ai_functions(lite, make_client(sim))
    sim.script("bad_structured")
    query = JSON_FUNCTIONS[function].replace("['good', 'bad']", "json_array('good', 'bad')")

    rows = dict(execute(lite, f"SELECT id, {query} FROM t").fetchall())

    assert sum(v is None for k, v in rows.items() if k in "abc") == 1
    assert {rows[k] for k in "abc"} - {None} <= {"good", "bad", "positive", "negative",
                                                 "neutral", "mixed"}


def test_a_label_outside_the_labels_is_null(make_client, duck):
    """ai_classify's documented NULL: the reply names no label it was offered."""
    class OffLabel:
        def models(self):
            return ["sim-model"]

        def respond(self, model, messages, params):
            return '{"label": "neither"}'

    with SimulatedEndpoint(models=("sim-model",), responder=OffLabel()) as sim:
        register_ai_functions(duck, make_client(sim))
        rows = duck.execute("SELECT ai_classify(x, ['good', 'bad']) FROM t WHERE id = 'a'"
                            ).fetchall()
    assert rows == [(None,)]


def test_a_failed_request_still_fails_the_task_function_without_offering_failonerror(
        sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))
    sim.script(400)  # final: not retried

    with pytest.raises(Exception) as raised:
        duck.execute("SELECT ai_classify(x, ['good', 'bad']) FROM t").fetchall()

    message = str(raised.value)
    assert "ai_classify failed for 1 of the" in message and "bad_request" in message
    assert "has no failOnError argument" in message
    assert "failOnError is true" not in message and "failOnError := false" not in message


def test_an_unreadable_reply_still_fails_ai_query_with_a_return_type(sim, make_client, duck):
    """ai_query keeps Databricks' failOnError: a reply that is not the returnType fails it."""
    register_ai_functions(duck, make_client(sim))
    sim.script("bad_structured")  # the first request's reply is not JSON

    with pytest.raises(Exception, match="failOnError is true"):
        duck.execute("SELECT ai_query('sim-model', x, returnType := 'INT') FROM t").fetchall()


# -- blank requests are NULL, as NULL ones ----------------------------------------------------
def test_a_blank_request_is_null_without_a_request(sim, make_client, duck, lite):
    register_ai_functions(duck, make_client(sim))
    register_ai_functions(lite, make_client(sim, store_url="sqlite://"))

    on_duckdb = dict(duck.execute("SELECT id, ai_query('sim-model', x) FROM t").fetchall())
    struct = dict(duck.execute(
        "SELECT id, ai_query('sim-model', x, failOnError := false) FROM t").fetchall())
    on_sqlite = dict(execute(lite, "SELECT id, ai_summarize(x) FROM t").fetchall())

    assert on_duckdb["d"] is None and on_duckdb["a"] == "[sim] I love this blender"
    assert struct["d"] == {"result": None, "errorMessage": None} == struct["e"]
    assert on_sqlite["d"] is None and on_sqlite["a"].startswith("[sim]")
    assert sim.stats(log=False)["requests"] == 3 + 3  # a, b, c on each engine


# -- 3. the older form: ai_query(endpoint, request, 'returnType', 'STRING') --------------------
OLDER_FORM = """SELECT id, ai_query(
    'sim-model',
    x,
    'returnType', 'STRING') AS reply
FROM t WHERE id = 'a'"""


def test_the_older_name_value_form_runs_in_databricks_sql(sim, make_client, duck, lite):
    register_ai_functions(duck, make_client(sim))
    register_ai_functions(lite, make_client(sim, store_url="sqlite://"))

    assert "returnType := 'STRING'" in translate(OLDER_FORM, pretty=False)
    assert execute(duck, OLDER_FORM, dialect="databricks").fetchall() == [
        ("a", "[sim] I love this blender")]
    assert execute(lite, OLDER_FORM, dialect="databricks").fetchall() == [
        ("a", "[sim] I love this blender")]
    with_fail = OLDER_FORM.replace("'returnType', 'STRING'", "'failOnError', false")
    assert execute(duck, with_fail, dialect="databricks").fetchall() == [
        ("a", {"result": "[sim] I love this blender", "errorMessage": None})]


@pytest.mark.parametrize("arguments, message", [
    ("'returnType'", "has no value"),
    ("'returntype', 'STRING'", "names are case-sensitive: write 'returnType'"),
    ("'returnType', 'STRING', 'temperature', 0.5", "not a parameter name"),
    ("'returnType', 'STRING', 'returnType', 'INT'", "given twice"),
])
def test_malformed_name_value_pairs_are_refused(arguments, message):
    with pytest.raises(TranslationError, match=message):
        translate(f"SELECT ai_query('m', x, {arguments}) FROM t")


def test_the_older_form_in_native_sql_says_how_to_write_it(sim, make_client, duck, lite):
    """Without dialect='databricks' the engines read options by position: the error names the
    older form instead of blaming failOnError."""
    register_ai_functions(duck, make_client(sim))
    register_ai_functions(lite, make_client(sim, store_url="sqlite://"))
    native = "SELECT ai_query('sim-model', x, 'returnType', 'STRING') FROM t"

    with pytest.raises(duckdb.Error, match="older Databricks form") as on_duckdb:
        duck.execute(native).fetchall()
    with pytest.raises(InferenceConfigError, match="older Databricks form"):
        execute(lite, native).fetchall()
    assert "must be a BOOLEAN" not in str(on_duckdb.value)
    assert sim.stats(log=False)["requests"] == 0


# -- 4. a refusal names the construct, not a leading comment, and its line --------------------
def test_a_statement_level_refusal_quotes_the_construct_and_its_line():
    query = ("-- Materialize it\n"
             "-- for the dashboard\n"
             "\n"
             "create or replace materialized view ai_query_mv\n"
             "TBLPROPERTIES('pipelines.channel' = 'PREVIEW') AS\n"
             "SELECT ai_query('m', text) AS response FROM messages")

    with pytest.raises(TranslationError) as raised:
        translate(query)

    problems = [(p.line, p.construct) for p in raised.value.problems]
    assert problems == [(4, "MATERIALIZED"), (5, "'pipelines.channel'='PREVIEW'")]
    assert "/*" not in str(raised.value)


def test_a_trailing_comment_is_not_quoted_with_the_construct(sim, make_client, lite):
    register_ai_functions(lite, make_client(sim))
    query = "-- lead\nSELECT id, -- the id\n  LOWER(x) -- lower-cased\nFROM t"

    with pytest.raises(TranslationError) as raised:
        execute(lite, query, dialect="databricks")

    [problem] = raised.value.problems
    assert (problem.line, problem.construct) == (3, "LOWER(x)")


def test_problems_in_later_statements_get_their_own_lines():
    query = "SELECT 1;\n-- two\nCREATE MATERIALIZED VIEW v AS SELECT 1;\nSELECT 2"

    with pytest.raises(TranslationError) as raised:
        translate(query)

    assert [p.line for p in raised.value.problems] == [3]


# -- issue 17: a regexp RE2 cannot run is refused with its line -------------------------------
@pytest.mark.parametrize("pattern, construct", [
    ("(?<=refund )\\\\w+", "lookbehind"),
    ("\\\\w+(?= order)", "lookahead"),
    ("(?!x)\\\\w", "negative lookahead"),
    ("(\\\\w)\\\\1", "backreference"),
    ("a++", "possessive quantifier"),
    ("(?U)\\\\w+", "(?U)"),
    ("\\\\p{Alpha}+", "\\p{Alpha}"),
])
def test_a_regexp_re2_cannot_run_is_refused_with_its_line(sim, make_client, duck, pattern,
                                                          construct):
    register_ai_functions(duck, make_client(sim))
    query = f"SELECT id,\n       regexp_extract(x, '{pattern}', 0) AS word\nFROM t"

    with pytest.raises(TranslationError) as raised:
        execute(duck, query, dialect="databricks")

    [problem] = raised.value.problems
    assert problem.line == 2 and problem.construct.startswith("REGEXP_EXTRACT(x")
    assert construct in problem.reason and "no RE2 equivalent" in problem.reason


def test_a_named_group_is_rewritten_for_re2(duck):
    query = r"SELECT regexp_replace('refund 4521', '(?<word>[a-z]+) (\\d+)', '$2-$1') AS v"

    assert duck.execute(translate(query)).fetchall() == [("4521-refund",)]


# -- 5. ${param} placeholders: what they are and how to bind them -----------------------------
def test_a_placeholder_is_refused_saying_how_to_bind_it():
    query = ("SELECT ai_query(\"${endpoint}\", text)\n"
             "FROM ${input_table_name}\n"
             "WHERE id = ${id} OR id = ${id}")

    with pytest.raises(TranslationError) as raised:
        translate(query)

    problems = {p.construct: p for p in raised.value.problems}
    assert list(problems) == ["'${endpoint}'", "${input_table_name}", "${id}"]  # each once
    assert [p.line for p in problems.values()] == [1, 2, 3]
    value = problems["${id}"].reason
    assert "Databricks SQL editor or a notebook widget" in value
    assert "write :id and pass the value as execute(con, query, {'id': ...}" in value
    table = problems["${input_table_name}"].reason
    assert "table or column name" in table and ":input_table_name" not in table
    assert "string.Template(query).substitute(input_table_name=...)" in table


def test_the_marker_the_placeholder_message_suggests_binds(sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))

    rows = execute(duck, "SELECT ai_query('sim-model', x) FROM t WHERE id = :id", {"id": "b"},
                   dialect="databricks").fetchall()

    assert rows == [("[sim] The toaster broke",)]


# -- issue 17: LIKE over failOnError's struct says which field to compare ----------------------
def test_like_over_the_fail_on_error_struct_names_the_result_field(sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))
    query = ("SELECT id FROM (SELECT id, ai_query('sim-model', x, failOnError => false) AS s "
             "FROM t) WHERE s LIKE '%love%'")

    with pytest.raises(duckdb.BinderException, match=r"compare its result field"):
        execute(duck, query, dialect="databricks")
    rows = execute(duck, query.replace("s LIKE", "s.result LIKE"), dialect="databricks")
    assert rows.fetchall() == [("a",)]


def test_a_failed_ai_query_row_is_data_with_fail_on_error_false(sim, make_client, duck):
    register_ai_functions(duck, make_client(sim))
    sim.script(400)

    rows = duck.execute("SELECT ai_query('sim-model', x, failOnError := false) FROM t "
                        "WHERE id IN ('a', 'b', 'c')").fetchall()

    errors = [r[0]["errorMessage"] for r in rows if r[0]["errorMessage"]]
    assert len(errors) == 1 and errors[0].startswith("bad_request")
    sim.script(400)
    with pytest.raises(duckdb.Error, match=AIQueryError.__name__):  # failOnError true
        duck.execute("SELECT ai_query('sim-model', x || '!') FROM t").fetchall()


# -- issue 17: the README's SQL block, for SQLite ---------------------------------------------
def test_the_readme_sqlite_example_runs(make_client):
    """SQLite has no named arguments or list literals: optional arguments go by position
    (NULL to skip one), labels are json_array(...), and a struct is JSON text read with ->>."""
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        llm = make_client(sim)
        con = sqlite3.connect(":memory:")
        con.execute("CREATE TABLE calls (transcript TEXT)")
        con.executemany("INSERT INTO calls VALUES (?)",
                        [("I want a refund for my blender",), ("When do you open?",)])

        register_ai_functions(con, llm)
        rows = execute(con, """
            SELECT ai_query('llama-70b', 'Summarize: ' || transcript, NULL, false) ->> '$.result'
                       AS s,
                   ai_classify(transcript, json_array('refund', 'complaint', 'question')) AS kind
            FROM calls""").fetchall()
        # The same query in Databricks SQL runs on SQLite and DuckDB alike.
        databricks = """
            SELECT ai_query('llama-70b', 'Summarize: ' || transcript, failOnError => false) AS s,
                   ai_classify(transcript, array('refund', 'complaint', 'question')) AS kind
            FROM calls"""
        translated = execute(con, databricks, dialect="databricks").fetchall()
        duck = duckdb.connect()
        duck.execute("CREATE TABLE calls AS SELECT * FROM (VALUES "
                     "('I want a refund for my blender'), ('When do you open?')) v(transcript)")
        register_ai_functions(duck, llm)
        on_duckdb = execute(duck, databricks, dialect="databricks").fetchall()
        con.close()
        duck.close()

    assert [s for s, _ in rows] == ["[sim] Summarize: I want a refund for my blender",
                                    "[sim] Summarize: When do you open?"]
    assert {kind for _, kind in rows} <= {"refund", "complaint", "question"}
    assert [json.loads(s)["result"] for s, _ in translated] == [s for s, _ in rows]
    assert [s["result"] for s, _ in on_duckdb] == [s for s, _ in rows]
