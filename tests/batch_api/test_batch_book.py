"""The batch book's guarantee that no key is submitted twice, also by runs at the same time."""

from __future__ import annotations

import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, frame

from dagster_batchllm.core.delivery.batch_api.book import BatchBook
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.testing import run_on_threads


def _submission(book: BatchBook, sub: str) -> None:
    book.record_submission({"submission_id": sub, "provider": "openai", "endpoint": "openai",
                            "model": MODEL, "route": "/chat/completions", "lines": 0,
                            "bytes": 0, "scope": "", "partition_key": "", "run_id": None})


def test_an_attempt_of_a_key_is_recorded_in_one_batch_only(store_url):
    book = BatchBook(Ledger(store_url))
    _submission(book, "bllm-a")
    _submission(book, "bllm-b")
    assert book.add_lines("bllm-a", [("k1", 1), ("k2", 1)]) == {"k1", "k2"}
    assert book.add_lines("bllm-b", [("k2", 1), ("k3", 1), ("k1", 2)]) == {"k3", "k1"}
    latest = book.latest_lines(["k1", "k2", "k3", "k4"])
    assert {k: (s.submission_id, s.attempt) for k, s in latest.items()} == {
        "k1": ("bllm-b", 2), "k2": ("bllm-a", 1), "k3": ("bllm-b", 1)}


@pytest.mark.slow
def test_two_partitions_submitting_the_same_rows_at_once_pay_for_each_once(held, make_client):
    df = frame(3000)

    def run(day: str):
        return make_client(held).infer(df, prompt=PROMPT, model=MODEL, output_column="s",
                                       mode="batch_api", wait=False, partition_key=day)

    results = run_on_threads(run, ("d1", "d2"))
    assert all(r.stats.deferred == 3000 for r in results.values())
    assert sum(r.stats.requests for r in results.values()) == 3000  # lines written
    held.advance_batches()  # validated: the lines the batches hold are counted
    lines = sum(b["request_counts"]["total"] for b in held.batches())
    assert lines == 3000  # each key in one batch, whichever run got it first

    held.complete_batches()
    client = make_client(held)
    for day in ("d1", "d2"):
        done = client.infer(df, prompt=PROMPT, model=MODEL, output_column="s",
                            mode="batch_api", wait=False, partition_key=day)
        assert done.stats.succeeded == 3000, day
    assert batch_stats(held)["line_duplicates"] == 0


def test_a_book_made_before_content_was_kept_still_answers_from_its_reply_bodies(
        held, make_client, store_url):
    """Books written by an earlier version hold an answered line's whole reply body in
    ``response`` and have no ``content``/``finish_reason`` columns: opening one adds the
    columns, and its answers are still read, nothing submitted again."""
    import json

    import sqlalchemy as sa

    df = frame(3)
    client = make_client(held)
    client.infer(df, prompt=PROMPT, model=MODEL, output_column="s", mode="batch_api",
                 wait=False)
    book = BatchBook(client.ledger)
    lines, batches = book.lines.name, book.batches.name
    with client.ledger.engine.begin() as conn:  # the book as the earlier version left it
        keys = [k for (k,) in conn.exec_driver_sql(f"SELECT request_key FROM {lines}")]
        for column in ("content", "finish_reason"):
            conn.exec_driver_sql(f"ALTER TABLE {lines} DROP COLUMN {column}")
        for i, key in enumerate(keys):
            body = {"choices": [{"index": 0, "message": {"role": "assistant",
                                                         "content": f"old answer {i}"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
            conn.exec_driver_sql(f"UPDATE {lines} SET state = 'ok', response = ? "
                                 "WHERE request_key = ?", (json.dumps(body), key))
        conn.exec_driver_sql(f"UPDATE {batches} SET status = 'collected'")

    again = make_client(held)
    done = again.infer(df, prompt=PROMPT, model=MODEL, output_column="s", mode="batch_api",
                       wait=False)
    assert done.stats.succeeded == 3 and done.stats.prompt_tokens == 21
    assert sorted(done.df["s"]) == ["old answer 0", "old answer 1", "old answer 2"]
    assert batch_stats(held)["batches_created"] == 1  # the first run's, nothing more
    columns = {c["name"] for c in sa.inspect(again.ledger.engine).get_columns(lines)}
    assert {"content", "finish_reason"} <= columns


def test_keys_assumed_new_are_recorded_all_or_none(quick, make_client):
    book = book_of(make_client(quick))
    for sub in ("bllm-a", "bllm-b"):
        book.record_submission({"submission_id": sub, "provider": "openai", "endpoint": "openai",
                                "model": MODEL, "route": "/chat/completions", "lines": 0,
                                "bytes": 0, "scope": "", "partition_key": ""})
    assert book.add_lines("bllm-a", [("k1", 1), ("k2", 1)]) == {"k1", "k2"}
    # k2's first attempt is there (in this very batch, too): nothing of these is recorded.
    assert book.add_lines("bllm-a", [("k3", 1), ("k2", 1)], all_or_none=True) == set()
    assert book.add_lines("bllm-b", [("k3", 1), ("k1", 1)], all_or_none=True) == set()
    assert book.latest_lines(["k3"]) == {}
    assert book.add_lines("bllm-b", [("k3", 1), ("k4", 1)], all_or_none=True) == {"k3", "k4"}
    # Without it, a key already in this batch counts as its own (another run's is left out).
    assert book.add_lines("bllm-a", [("k5", 1), ("k2", 1), ("k3", 1)]) == {"k5", "k2"}
