"""ai_query and the AI functions on SQLite: the two-pass execute, against the simulated endpoint."""

from __future__ import annotations

import json
import sqlite3

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.sql import AIQueryError, execute, handle_for, register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

TICKETS = ["I want a refund for my blender", "The router keeps dropping, this is a complaint",
           "What time do you open?", "I want a refund for my blender", None]


@pytest.fixture
def con():
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE tickets (id INTEGER PRIMARY KEY, text TEXT)")
    connection.executemany("INSERT INTO tickets (text) VALUES (?)", [(t,) for t in TICKETS])
    connection.commit()
    yield connection
    connection.close()


def test_ai_query_is_batched_deduplicated_and_null_safe(sim, make_client, con):
    sim.configure(latency_s=0.05)
    register_ai_functions(con, make_client(sim))

    rows = execute(con, "SELECT id, ai_query('sim-model', 'Summarize: ' || text) "
                        "FROM tickets ORDER BY id").fetchall()

    assert rows == [(i + 1, None if t is None else f"[sim] Summarize: {t}")
                    for i, t in enumerate(TICKETS)]
    stats = sim.stats()
    assert stats["requests"] == 3  # four texts, one of them twice; NULL sends nothing
    assert stats["max_concurrent"] == 3  # all in flight at once: one bulk pass, not per row


def test_every_ai_function(sim, make_client, con):
    register_ai_functions(con, make_client(sim), default_model="sim-model")
    row = execute(con, """
        SELECT ai_summarize('The caller wants a refund', 20),
               ai_classify('I want a refund now', json_array('complaint', 'refund')),
               ai_extract('John Smith called from Paris', json_array('person', 'city')),
               ai_analyze_sentiment('I am so happy, positive vibes'),
               ai_translate('good morning', 'French'),
               ai_fix_grammar('he go to school'),
               ai_mask('call me at 555-1234', '["phone"]'),
               ai_gen('Write a haiku about queues'),
               ai_similarity('a cat', 'a kitten'),
               ai_gen('Write a haiku about queues', 'sim-model')
    """).fetchone()
    assert row[0] == "[sim] The caller wants a refund"
    assert row[1] == "refund"
    assert json.loads(row[2]) == {"person": "John Smith called from Paris",
                                  "city": "John Smith called from Paris"}
    assert row[3] == "positive"
    assert row[4:8] == ("[sim] good morning", "[sim] he go to school",
                        "[sim] call me at 555-1234", "[sim] Write a haiku about queues")
    assert isinstance(row[8], float) and 0.0 <= row[8] <= 1.0
    assert row[9] == row[7]
    assert sim.stats()["requests"] == 9


def test_dependent_calls_take_one_pass_per_level(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    rows = execute(con, """
        WITH summaries AS (
            SELECT id, ai_query('sim-model', 'Summarize: ' || text) AS summary FROM tickets
        )
        SELECT id, ai_query('sim-model', 'Shorten: ' || summary) FROM summaries
        WHERE summary LIKE '%refund%' ORDER BY id
    """).fetchall()
    assert rows == [(1, f"[sim] Shorten: [sim] Summarize: {TICKETS[0]}"),
                    (4, f"[sim] Shorten: [sim] Summarize: {TICKETS[0]}")]
    assert sim.stats()["requests"] == 3 + 1


def test_rerun_of_the_same_query_sends_nothing(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    query = "SELECT ai_classify(text, json_array('refund', 'complaint', 'question')) FROM tickets"
    first = execute(con, query).fetchall()
    sent = sim.stats()["requests"]
    assert execute(con, query).fetchall() == first
    assert sim.stats()["requests"] == sent == 3


def test_writes_happen_once_and_in_one_batch(sim, make_client, con, monkeypatch):
    ai = register_ai_functions(con, make_client(sim))
    batches = []
    answer = ai.runtime.answer
    monkeypatch.setattr(ai.runtime, "answer", lambda b: batches.append(b) or answer(b))
    con.execute("CREATE TABLE summaries (id INTEGER, summary TEXT NOT NULL)")
    execute(con, "INSERT INTO summaries SELECT id, ai_summarize(text) FROM tickets "
                 "WHERE text IS NOT NULL")
    con.commit()
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM summaries").fetchone() == (4, 4)
    assert con.execute("SELECT summary FROM summaries WHERE id = 1").fetchone() == (
        f"[sim] {TICKETS[0]}",)
    assert sim.stats()["requests"] == 3
    assert len(batches) == 1  # one collect pass found all three, despite NOT NULL


def test_fail_on_error_true_raises_the_real_error(sim, make_client, con):
    register_ai_functions(con, make_client(sim, max_attempts=1))
    sim.script(500)
    with pytest.raises(AIQueryError,
                       match=r"failed for 1 of the 3 rows in a batch.*server_error: HTTP 500"):
        execute(con, "SELECT ai_query('sim-model', text) FROM tickets")
    assert execute(con, "SELECT count(ai_query('sim-model', text)) FROM tickets"
                   ).fetchone() == (4,)
    assert sim.stats()["requests"] == 4  # the rerun sent only the failed request


def test_fail_on_error_false_returns_errors_as_json(sim, make_client, con):
    register_ai_functions(con, make_client(sim, max_attempts=1))
    sim.script(500)
    rows = execute(con, "SELECT ai_query('sim-model', text, NULL, false) FROM tickets "
                        "WHERE text IS NOT NULL").fetchall()
    results = [json.loads(r) for (r,) in rows]
    failed = [r for r in results if r["errorMessage"] is not None]
    assert len(failed) == 2  # the duplicate text shares its request's fate
    assert all(r["result"] is None and r["errorMessage"].startswith("server_error")
               for r in failed)
    assert all(r["result"].startswith("[sim] ") for r in results if r not in failed)


def test_response_format_gives_json_text(sim, make_client, con):
    register_ai_functions(con, make_client(sim))
    rows = execute(con, """
        SELECT json_extract(r, '$.risk'), json_extract(r, '$.score') FROM (
            SELECT ai_query('sim-model', text, NULL, NULL, json_object('max_tokens', 50),
                            'STRUCT<risk: STRING, score: INT>') AS r
            FROM tickets WHERE id = 3)
    """).fetchall()
    assert rows == [(TICKETS[2], 5)]


@pytest.mark.parametrize("query, argument", [
    ("SELECT ai_query('nope', text) FROM tickets", r"argument 'endpoint' names 'nope'"),
    ("SELECT ai_query('sim-model', id) FROM tickets", r"argument 'request' must be TEXT"),
    ("SELECT ai_query('sim-model', text, NULL, 'no') FROM tickets",
     r"argument 'failOnError' must be a BOOLEAN"),
    ("SELECT ai_query('sim-model', text, NULL, NULL, NULL, 'STRUCT<a:>') FROM tickets",
     r"argument 'responseFormat': unknown type '>'"),
    ("SELECT ai_query('sim-model', text, NULL, NULL, '{\"max_tokens\": 0}') FROM tickets",
     r"argument 'modelParameters.max_tokens' must be at least 1"),
    ("SELECT ai_query('sim-model') FROM tickets", r"ai_query takes 2 to 7 arguments, got 1"),
    ("SELECT ai_classify(text, 'refund') FROM tickets",
     r"argument 'labels' must be an ARRAY<STRING>.*not JSON"),
    ("SELECT ai_translate(text, '') FROM tickets", r"argument 'to_lang' must be a non-empty"),
])
def test_errors_name_the_argument_and_send_nothing(sim, make_client, con, query, argument):
    register_ai_functions(con, make_client(sim))
    with pytest.raises(InferenceConfigError, match=argument):
        execute(con, query)
    assert sim.stats()["requests"] == 0


def test_direct_calls_work_row_by_row_and_keep_the_error(sim, make_client, con):
    ai = register_ai_functions(con, make_client(sim))
    assert con.execute("SELECT ai_gen(text, 'sim-model') FROM tickets WHERE id = 1"
                       ).fetchone() == (f"[sim] {TICKETS[0]}",)
    with pytest.raises(sqlite3.OperationalError, match="user-defined function raised"):
        con.execute("SELECT ai_query('nope', 'hi')").fetchone()
    assert "argument 'endpoint' names 'nope'" in str(ai.engine.last_error)


def test_sqlalchemy_connections_and_settings(sim, make_settings, tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'warehouse.db'}")
    raw = engine.raw_connection()
    try:
        with register_ai_functions(raw, make_settings(sim)) as ai:
            assert handle_for(raw) is ai and ai.dialect == "sqlite"
            assert execute(raw, "SELECT ai_gen(?)", ("hi",)).fetchone() == ("[sim] hi",)
            assert ai.stats.requests == 1
    finally:
        raw.close()
        engine.dispose()


def test_connection_without_functions_is_refused():
    with pytest.raises(InferenceConfigError, match="register_ai_functions"):
        execute(sqlite3.connect(":memory:"), "SELECT 1")
    with SimulatedEndpoint() as other, pytest.raises(InferenceConfigError, match="'llm'"):
        register_ai_functions(sqlite3.connect(":memory:"), other.base_url)


def test_sqlalchemy_connection_objects_are_unwrapped(sim, make_client):
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn:
        register_ai_functions(conn, make_client(sim))
        assert execute(conn, "SELECT ai_gen('hi')").fetchone() == ("[sim] hi",)
    engine.dispose()
