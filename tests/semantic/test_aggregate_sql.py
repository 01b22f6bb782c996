"""ai_agg and ai_summarize_agg with GROUP BY on real DuckDB and SQLite: the answers llm.aggregate
gives, every group of a DuckDB vector reduced at once, reruns from the ledger, failures that
fail the query with the reason."""

from __future__ import annotations

import sqlite3

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.ai_functions.aggregate_prompts import SUMMARY_INSTRUCTION
from dagster_batchllm.ai_functions.outcomes import AIQueryError
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.simulator.aggregation import answer_text, rows_digest
from dagster_batchllm.sql import execute, register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint
from tests.semantic.aggregate_helpers import CONTEXT, aggregating_endpoint, complaints

QUERY = """SELECT product, ai_agg(body, 'What do they complain about?') AS verdict,
                  ai_summarize_agg(body) AS summary
           FROM tickets GROUP BY product ORDER BY product"""


@pytest.fixture
def agg_sim():
    yield from aggregating_endpoint()


@pytest.fixture
def client(agg_sim, make_client):
    return make_client(agg_sim, endpoint_kwargs={"max_context_tokens": CONTEXT},
                       default_max_tokens=32)


def tickets() -> pd.DataFrame:
    bodies = complaints(300)
    return pd.DataFrame({"product": [("lamp", "chair", "desk")[i % 3] for i in range(300)],
                         "body": bodies})


def expected(df: pd.DataFrame) -> list[tuple]:
    return [(p, answer_text(len(g), rows_digest(g["body"])),
             answer_text(len(g), rows_digest(g["body"])))
            for p, g in sorted(df.groupby("product"))]


def test_duckdb_groups_are_answered_together_and_match_llm_aggregate(agg_sim, client):
    df = tickets()
    con = duckdb.connect()
    con.register("tickets", df)
    ai = register_ai_functions(con, client)

    rows = con.sql(QUERY).fetchall()

    assert rows == expected(df)
    sent = agg_sim.stats(log=False)["requests"]
    assert ai.stats.requests == sent
    direct = client.aggregate(df, instruction=SUMMARY_INSTRUCTION, column="body",
                              by="product")  # the same requests: all from the ledger
    assert direct.df["answer"].tolist() == [summary for _, _, summary in rows]
    assert direct.figures.requests_sent == 0
    assert con.sql(QUERY).fetchall() == rows
    assert execute(con, QUERY, dialect="databricks").fetchall() == rows  # sqlglot knows them
    assert agg_sim.stats(log=False)["requests"] == sent


def test_sqlite_aggregates_by_position_with_the_same_answers(agg_sim, client, tmp_path):
    df = tickets()
    con = sqlite3.connect(tmp_path / "tickets.db")
    con.execute("CREATE TABLE tickets (product TEXT, body TEXT)")
    con.executemany("INSERT INTO tickets VALUES (?, ?)", df.itertuples(index=False))
    con.execute("INSERT INTO tickets VALUES ('desk', NULL)")  # left out, as NULLs are
    register_ai_functions(con, client)

    assert execute(con, QUERY).fetchall() == expected(df)
    assert execute(con, "SELECT ai_agg(body, 'What?', 'sim-model') FROM tickets "
                        "WHERE product = 'none'").fetchall() == [(None,)]
    with pytest.raises(InferenceConfigError, match="takes 2 to 3 arguments"):
        execute(con, "SELECT ai_agg(body) FROM tickets")


def test_a_group_that_cannot_be_answered_fails_the_query_saying_why(agg_sim, client, tmp_path):
    too_long = "x" * 4 * CONTEXT
    df = pd.DataFrame({"product": ["lamp", "sofa"], "body": ["broken", too_long]})
    con = duckdb.connect()
    con.register("tickets", df)
    register_ai_functions(con, client)
    says = (r"ai_(summarize_)?agg failed for 1 of the [12] groups it was asked for; first error: "
            r"context_length_exceeded: a row of this group \(2,048 characters")

    with pytest.raises(duckdb.Error, match=says):
        con.sql(QUERY).fetchall()
    with pytest.raises(duckdb.Error, match="instruction differs between rows of one group"):
        con.sql("SELECT ai_agg(body, body) FROM tickets").fetchall()
    lite = sqlite3.connect(tmp_path / "t.db")
    lite.execute("CREATE TABLE tickets (product TEXT, body TEXT)")
    lite.executemany("INSERT INTO tickets VALUES (?, ?)", df.itertuples(index=False))
    register_ai_functions(lite, client)
    with pytest.raises(AIQueryError, match=says):
        execute(lite, QUERY)


@pytest.mark.parametrize("models", [("sim-model",), ("sim-model", "other-model")])
def test_no_rows_give_null_on_duckdb_and_sqlite_and_send_nothing(make_client, tmp_path, models):
    """A global aggregate over no rows is NULL, as SQL's own aggregates: its instruction and
    model are not judged, since no row carries them (DuckDB hands NULL for each; with two
    served models there is no default either). Rows of NULL text still carry their arguments."""
    empty_queries = ("SELECT ai_agg(body, 'What?') FROM tickets",
                     "SELECT ai_summarize_agg(body) FROM tickets",
                     "SELECT ai_agg(body, 'What?'), ai_summarize_agg(body) FROM tickets "
                     "WHERE 1 = 0")
    with SimulatedEndpoint(models=models) as sim:
        client = make_client(sim)
        con = duckdb.connect()
        con.execute("CREATE TABLE tickets (product VARCHAR, body VARCHAR)")
        register_ai_functions(con, client)
        lite = sqlite3.connect(tmp_path / "t.db")
        lite.execute("CREATE TABLE tickets (product TEXT, body TEXT)")
        register_ai_functions(lite, client)

        for query in empty_queries:
            width = 2 if "WHERE" in query else 1
            assert con.sql(query).fetchall() == [(None,) * width], query
            assert execute(lite, query).fetchall() == [(None,) * width], query
        grouped = "SELECT product, ai_agg(body, 'What?') FROM tickets GROUP BY product"
        assert con.sql(grouped).fetchall() == []
        assert execute(lite, grouped).fetchall() == []
        assert sim.stats(log=False)["requests"] == 0

        con.execute("INSERT INTO tickets VALUES ('lamp', NULL)")
        assert con.sql("SELECT ai_agg(body, 'What?', 'sim-model') FROM tickets"
                       ).fetchall() == [(None,)]
        with pytest.raises(duckdb.Error, match="argument 'instruction' must be a non-empty"):
            con.sql("SELECT ai_agg(body, '') FROM tickets").fetchall()
