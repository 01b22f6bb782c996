"""``ai_query('<embedding model>', text)``: DuckDB ``FLOAT[]`` (cosine functions work on it),
SQLite JSON array text, the Databricks dialect; rows embedded through ``embed()`` and its
ledger, NULL in NULL out, failures as the chat ``ai_query``'s."""

from __future__ import annotations

import json
import sqlite3

import duckdb
import numpy as np
import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.sql import AIQueryError, execute, register_ai_functions
from dagster_batchllm.testing import openai_client

EMBED = "sim-embed"
TEXTS = ["I want a refund for my lamp", "What time does the store close", None,
         "I want a refund for my lamp", "   "]


@pytest.fixture
def client(embed_sim, tmp_path):
    spec = EndpointSpec(name="sim", base_url=embed_sim.base_url, models=("sim-model",),
                        embedding_models=(EMBED,))
    with InferenceClient(InferenceSettings(endpoints=(spec,), store_url=f"sqlite:///"
                                           f"{tmp_path / 'ledger.db'}")) as client:
        yield client


@pytest.fixture
def duck(client, tables_in):
    con = tables_in(duckdb.connect(), "CREATE TABLE calls (id INT, t VARCHAR)",
                    ("INSERT INTO calls VALUES (?, ?)", list(enumerate(TEXTS))))
    register_ai_functions(con, client)
    return con


def reference(embed_sim, texts):
    reply = openai_client(embed_sim).embeddings.create(model=EMBED, input=texts)
    return [np.array(d.embedding, dtype=np.float32) for d in reply.data]


def test_duckdb_gives_float_lists_that_cosine_functions_take(duck, embed_sim):
    rows = duck.sql(f"SELECT id, ai_query('{EMBED}', t), typeof(ai_query('{EMBED}', t)) "
                    "FROM calls ORDER BY id").fetchall()
    assert {r[2] for r in rows} == {"FLOAT[]"}
    assert rows[2][1] is None and rows[4][1] is None  # NULL and blank: NULL, nothing sent
    sent = embed_sim.stats()["embeddings"]
    assert sent["inputs"] == 2 and sent["requests"] == 1
    expected = reference(embed_sim, [TEXTS[0], TEXTS[1]])
    np.testing.assert_array_equal(np.array(rows[0][1], np.float32), expected[0])
    np.testing.assert_array_equal(np.array(rows[1][1], np.float32), expected[1])
    pairs = duck.sql(f"""
        WITH v AS (SELECT id, ai_query('{EMBED}', t) AS e FROM calls WHERE t IS NOT NULL
                   AND trim(t) <> '')
        SELECT a.id, b.id, list_cosine_similarity(a.e, b.e),
               array_cosine_similarity(a.e::FLOAT[16], b.e::FLOAT[16])
        FROM v a JOIN v b ON a.id < b.id ORDER BY a.id, b.id""").fetchall()
    assert [p[:2] for p in pairs] == [(0, 1), (0, 3), (1, 3)]
    assert pairs[1][2] == pytest.approx(1.0, abs=1e-6)  # the same text
    cosine = float(expected[0] @ expected[1])
    assert pairs[0][2] == pytest.approx(cosine, abs=1e-5)
    assert pairs[0][3] == pytest.approx(cosine, abs=1e-5)


def test_the_ledger_is_shared_with_embed(duck, client, embed_sim):
    client.embed(pd.DataFrame({"t": [TEXTS[0], TEXTS[1]]}), input_column="t", model=EMBED)
    embed_sim.reset_stats()
    duck.sql(f"SELECT ai_query('{EMBED}', t) FROM calls").fetchall()
    assert embed_sim.stats()["embeddings"]["requests"] == 0


def test_failures_fail_the_query_or_become_data(duck, embed_sim):
    embed_sim.configure(max_context_tokens=7)  # the lamp sentence fits (7), the store one does not
    with pytest.raises(duckdb.Error, match="ai_query failed for 1 of the 5 rows"):
        duck.sql(f"SELECT ai_query('{EMBED}', t) FROM calls").fetchall()
    call = f"ai_query('{EMBED}', t, failOnError := false)"
    rows = duck.sql(f"SELECT id, {call}, typeof({call}) FROM calls ORDER BY id").fetchall()
    assert rows[0][2] == "STRUCT(result FLOAT[], errorMessage VARCHAR)"
    assert rows[1][1]["result"] is None
    assert rows[1][1]["errorMessage"].startswith("context_length_exceeded")
    assert len(rows[0][1]["result"]) == 16 and rows[0][1]["errorMessage"] is None


def test_chat_options_are_refused_for_an_embedding_model(duck, embed_sim):
    with pytest.raises(duckdb.Error, match="embedding model: it returns ARRAY<FLOAT>"):
        duck.sql(f"SELECT ai_query('{EMBED}', t, returnType := 'STRING') FROM calls").fetchall()
    with pytest.raises(duckdb.Error, match="takes no modelParameters"):
        duck.sql(f"SELECT ai_query('{EMBED}', t, modelParameters := {{'max_tokens': 4}}) "
                 "FROM calls").fetchall()
    assert embed_sim.stats()["embeddings"]["requests"] == 0
    # The chat ai_query is as it was.
    [(text,)] = duck.sql("SELECT ai_query('sim-model', 'hello')").fetchall()
    assert text == "[sim] hello"


def test_the_databricks_dialect_and_a_model_from_a_column(duck):
    query = f"SELECT id, ai_query('{EMBED}', t) AS e FROM calls WHERE id = 1"
    [(_, vector)] = execute(duck, query, dialect="databricks").fetchall()
    assert len(vector) == 16
    # DuckDB fixes the result type when it binds the query: the model must be a literal.
    with pytest.raises(duckdb.BinderException, match="endpoint is a string literal on DuckDB"):
        execute(duck, "SELECT ai_query(m, t) FROM calls, (VALUES ('sim-model')) v(m)")


def test_sqlite_gives_json_array_text(client, tables_in, embed_sim):
    con = tables_in(sqlite3.connect(":memory:"), "CREATE TABLE calls (id INT, t TEXT)",
                    ("INSERT INTO calls VALUES (?, ?)", list(enumerate(TEXTS))))
    register_ai_functions(con, client)
    rows = execute(con, f"SELECT id, ai_query('{EMBED}', t) FROM calls ORDER BY id").fetchall()
    assert rows[2][1] is None and rows[4][1] is None
    vectors = [json.loads(r[1]) for r in rows if r[1] is not None]
    assert [len(v) for v in vectors] == [16, 16, 16] and vectors[0] == vectors[2]
    np.testing.assert_allclose(vectors[1], reference(embed_sim, [TEXTS[1]])[0], rtol=1e-6)
    embed_sim.configure(max_context_tokens=5)
    with pytest.raises(AIQueryError, match="context_length_exceeded"):
        execute(con, f"SELECT ai_query('{EMBED}', 'word ' || t) FROM calls").fetchall()
