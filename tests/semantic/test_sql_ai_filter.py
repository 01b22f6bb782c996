"""ai_filter and the cascade argument in DuckDB and SQLite: WHERE, JOIN ... ON, the same rows."""

from __future__ import annotations

import sqlite3

import duckdb
import pandas as pd
import pytest

from dagster_batchllm import InferenceConfigError
from dagster_batchllm.sql import execute, register_ai_functions
from tests.semantic.cascade_helpers import ORACLE, PROXY, TRUTH, tickets

PREDICATE = "The customer asks for a refund."
CASCADE_DUCKDB = f"{{'proxy': '{PROXY}', 'oracle': '{ORACLE}', 'sample': 200}}"
CASCADE_SQLITE = f"json_object('proxy', '{PROXY}', 'oracle', '{ORACLE}', 'sample', 200)"


@pytest.fixture
def duck(labelled_sim, make_llm_resource):
    con = duckdb.connect()
    con.register("tickets", tickets(1200))
    con.register("customers", pd.DataFrame({"ticket_id": range(0, 1200, 2), "name": "Sam"}))
    ai = register_ai_functions(con, make_llm_resource(labelled_sim))
    yield con, ai
    ai.close()


@pytest.mark.slow
def test_ai_filter_in_where_and_join_on_duckdb(duck, labelled_sim):
    con, _ = duck
    refunds = {i for i, t in enumerate(tickets(1200)["body"]) if TRUTH(t) == "refund"}
    where = con.sql(f"SELECT ticket_id FROM tickets WHERE ai_filter('{PREDICATE}', body, "
                    f"'{ORACLE}') ORDER BY ticket_id").fetchall()
    assert {r[0] for r in where} == refunds
    joined = con.sql(f"""SELECT t.ticket_id, c.name FROM tickets t JOIN customers c
                         ON c.ticket_id = t.ticket_id AND ai_filter('{PREDICATE}', t.body,
                         '{ORACLE}')""").fetchall()
    assert {r[0] for r in joined} == {i for i in refunds if i % 2 == 0}
    assert con.sql("SELECT ai_filter('x', NULL), typeof(ai_filter('x', 'y', "
                   f"'{ORACLE}'))").fetchall() == [(None, "BOOLEAN")]


@pytest.mark.slow
def test_a_cascade_in_duckdb_and_sqlite_gives_the_same_rows(duck, labelled_sim):
    con, ai = duck
    query = (f"SELECT ticket_id FROM tickets WHERE ai_filter('{PREDICATE}', body, "
             f"cascade := {CASCADE_DUCKDB}) ORDER BY ticket_id")
    in_duckdb = execute(con, query).fetchall()
    report = ai.runtime.cascade_reports[-1]
    assert report.rows == 1200 and report.sample_size == 200  # every row of the call at once
    requests = labelled_sim.stats()["requests"]
    assert requests == 1200 + report.oracle_rows
    lite = sqlite3.connect(":memory:")
    lite.execute("CREATE TABLE tickets (ticket_id INTEGER, body TEXT)")
    lite.executemany("INSERT INTO tickets VALUES (?, ?)", tickets(1200).itertuples(index=False))
    register_ai_functions(lite, ai.runtime.client.settings)
    labelled_sim.reset_stats()
    in_sqlite = execute(lite, f"SELECT ticket_id FROM tickets WHERE ai_filter('{PREDICATE}', "
                              f"body, NULL, {CASCADE_SQLITE}) ORDER BY ticket_id").fetchall()
    assert in_sqlite == in_duckdb
    assert labelled_sim.stats()["requests"] == 0  # the same ledger: the rerun pays nothing
    labels = execute(con, f"""SELECT ai_classify(body, ['refund', 'complaint', 'question'],
                              cascade := {CASCADE_DUCKDB}) AS label FROM tickets""").df()
    truth = tickets(1200)["body"].map(TRUTH)
    assert (labels["label"].to_numpy() == truth.to_numpy()).mean() >= 0.9


def test_a_cascade_outside_execute_or_with_an_endpoint_is_refused(duck, labelled_sim):
    con, _ = duck
    with pytest.raises(duckdb.Error, match=r"run the statement through .*execute"):
        con.sql(f"SELECT ai_filter('{PREDICATE}', body, cascade := {CASCADE_DUCKDB}) "
                "FROM tickets").fetchall()
    # DuckDB reports a function's InferenceConfigError as its own error, message kept
    with pytest.raises(duckdb.Error, match="'endpoint' or 'cascade', not both"):
        execute(con, f"SELECT ai_filter('{PREDICATE}', body, '{ORACLE}', "
                     f"cascade := {CASCADE_DUCKDB}) FROM tickets").fetchall()
    with pytest.raises((duckdb.Error, InferenceConfigError), match="unknown cascade field"):
        execute(con, f"SELECT ai_filter('{PREDICATE}', body, cascade := {{'proxy': '{PROXY}', "
                     f"'oracle': '{ORACLE}', 'samples': 5}}) FROM tickets").fetchall()
    assert labelled_sim.stats()["requests"] == 0
