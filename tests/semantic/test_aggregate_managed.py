"""The embedded default answers ai_summarize_agg with an extractive summary of the group, and
refuses an open ai_agg instruction per group with unsupported_task, saying why."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.sql import register_ai_functions

ROWS = pd.DataFrame({
    "product": ["lamp", "lamp", "chair"],
    "body": ["The lamp arrived broken and the customer wants a refund.",
             "The lamp switch sparks; the customer is worried about a fire.",
             "The chair leg is short and the customer is angry."]})


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from dagster_batchllm import BatchInferenceResource, ManagedEndpoint

    store = tmp_path_factory.mktemp("managed") / "ledger.db"
    resource = BatchInferenceResource(managed_endpoints=[ManagedEndpoint()],
                                      default_model="local", store_url=f"sqlite:///{store}")
    yield resource
    resource.close()


def test_a_summary_of_each_group_and_an_open_instruction_refused(local):
    con = duckdb.connect()
    con.register("reviews", ROWS)
    register_ai_functions(con, local)

    summaries = dict(con.sql("SELECT product, ai_summarize_agg(body) FROM reviews "
                             "GROUP BY product").fetchall())

    assert "sparks" in summaries["lamp"] and "broken" in summaries["lamp"]
    assert "chair" in summaries["chair"]
    result = local.aggregate(ROWS, instruction="What do they want most?", column="body",
                             by="product")
    assert result.df["answer"].isna().all()
    assert all(e.startswith("unsupported_task: ") and "real model endpoint" in e
               for e in result.df["answer_error"])
    with pytest.raises(duckdb.Error, match="unsupported_task"):
        con.sql("SELECT ai_agg(body, 'What do they want most?') FROM reviews").fetchall()
