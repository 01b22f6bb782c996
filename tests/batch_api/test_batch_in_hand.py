"""Answers a call's collector holds for its own pass: written once, to the ledger, and to the
book only where the ledger will not have them (rows gone from the table, a reply the task
refused, a pass that did not end)."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from batch_helpers import MODEL, PROMPT, batch_settings, batch_stats, book_of, frame

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.batch_api.tables import owner_id
from dagster_batchllm.core.run.engine import InferenceRun
from dagster_batchllm.simulator.responders import EchoResponder
from dagster_batchllm.testing import SimulatedEndpoint


def infer(client, df, **kwargs):
    return client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                        mode="batch_api", wait=False, **kwargs)


def lines_of(client):
    book = book_of(client)
    with client.ledger.engine.connect() as conn:
        return pd.DataFrame(conn.execute(book.lines.select()).mappings().all())


def test_a_collected_batch_of_the_calls_partition_is_written_to_the_ledger_only(
        held, make_client):
    client = make_client(held)
    df = frame(50)
    infer(client, df)
    held.complete_batches()
    done = infer(client, df)
    assert done.stats.succeeded == 50 and done.stats.requests == 0
    (batch,) = book_of(client).all_batches()
    assert batch["status"] == "collected" and batch["delivered_at"] is not None
    lines = lines_of(client)
    # ok in the book, the answer itself in the ledger record of the partition alone
    assert (lines["state"] == "ok").all() and lines["content"].isna().all()
    records = client.ledger.records()
    assert (records["status"] == "ok").sum() == 50 and records["response"].notna().all()
    again = infer(client, df)
    assert again.stats.cached == 50 and batch_stats(held)["batches_created"] == 1


def test_answers_of_rows_no_longer_in_the_table_are_kept_in_the_book(held, make_client):
    """A pass that does not take an answer it holds (the row left the table) writes it to
    the book, so a later call with the row gets it without submitting it again."""
    client = make_client(held)
    df = frame(40)
    infer(client, df)
    held.complete_batches()
    first = infer(client, df.head(25))
    assert first.stats.succeeded == 25
    lines = lines_of(client)
    kept = lines["content"].dropna()
    assert len(kept) == 15 and (lines["state"] == "ok").all()
    later = infer(client, df)
    assert later.stats.succeeded == 40 and later.stats.cached == 25
    assert later.stats.requests == 0 and batch_stats(held)["batches_created"] == 1
    assert sorted(later.df["summary"][25:]) == sorted(kept)


class OffSchemaResponder(EchoResponder):
    """JSON breaking the schema for rows mentioning 'broken'."""

    def respond(self, model, messages, params) -> str:
        if "broken" in messages[-1]["content"]:
            return json.dumps({"label": 7})
        return json.dumps({"label": "fine"})


def test_an_answer_the_task_refused_keeps_its_reply_in_the_book(store_url):
    """The reply of a row whose schema check failed is in the book, so a rerun fails it with
    the same reason, submitting nothing."""
    schema = {"type": "object", "required": ["label"],
              "properties": {"label": {"type": "string"}}}
    df = pd.DataFrame({"text": ["ok row", "broken row", "another ok row"]})
    with SimulatedEndpoint(models=(MODEL,), responder=OffSchemaResponder(),
                           batch_stage_s=None, api_key="sk-batch") as sim, \
            InferenceClient(batch_settings(sim, store_url)) as client:
        infer(client, df, response_format=schema)
        sim.complete_batches()
        done = infer(client, df, response_format=schema)
        assert done.df["summary"][[0, 2]].tolist() == [{"label": "fine"}] * 2
        reason = done.df["summary_error"][1]
        assert reason.startswith("invalid_structured_output: the reply does not match")
        lines = lines_of(client)
        assert (lines["state"] == "ok").all() and lines["content"].notna().sum() == 1
        rerun = infer(client, df, response_format=schema)
        assert rerun.df["summary_error"][1] == reason and rerun.stats.requests == 0
        assert batch_stats(sim)["batches_created"] == 1


def test_a_pass_that_fails_writes_the_answers_it_held_to_the_book(held, make_client,
                                                                  monkeypatch):
    client = make_client(held)
    df = frame(30)
    infer(client, df)
    held.complete_batches()

    async def broken(self):
        raise RuntimeError("the pass broke")

    with monkeypatch.context() as patch:
        patch.setattr(InferenceRun, "run", broken)
        with pytest.raises(RuntimeError, match="the pass broke"):
            infer(client, df)
    (batch,) = book_of(client).all_batches()
    assert batch["status"] == "collected"
    assert lines_of(client)["content"].notna().all()
    result = infer(client, df)
    assert result.stats.succeeded == 30 and batch_stats(held)["batches_created"] == 1


@pytest.mark.parametrize("owner", ["this process", "a process that died"])
def test_a_batch_left_collecting_is_collected_again(held, make_client, owner):
    """Marked collecting by a call of this process that ended without delivering it, or by
    a process killed meanwhile: the next call collects it again, paying for nothing."""
    client = make_client(held)
    df = frame(20)
    infer(client, df)
    held.complete_batches()
    book = book_of(client)
    (batch,) = book.all_batches()
    gone = owner_id() if owner == "this process" else f"{owner_id().rpartition(':')[0]}:" \
        f"{_dead_pid()}"
    with client.ledger.engine.begin() as conn:
        conn.execute(book.batches.update().values(status="collecting", owner=gone))
    result = infer(client, df)
    assert result.stats.succeeded == 20 and result.stats.requests == 0
    assert book.batch(batch["submission_id"])["status"] == "collected"
    assert batch_stats(held)["batches_created"] == 1


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert child.pid != os.getpid()
    return child.pid
