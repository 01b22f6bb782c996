"""Batch mode at the issue's scale, and after a SIGKILL: nothing submitted twice.

120,000 rows make three batches (OpenAI's 50,000-line limit) and every row is answered once.
A run killed (SIGKILL, a real subprocess) after it submitted its batches leaves them in the
batch book; the rerun waits for those batches and collects them: no new file, no new batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, frame

from dagster_batchllm.testing import SimulatedEndpoint, sigkill_when

REPO_ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

url, store_url, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="openai", base_url=url, models=("sim-model",), api_key="sk-batch",
                            batch_api=True, max_requests_per_batch=1000),),
    store_url=store_url, progress_interval_s=3600.0, batch_poll_initial_s=0.05)
df = pd.DataFrame({"text": [f"call number {i}" for i in range(rows)]})
InferenceClient(settings).infer(df, prompt="Summarize: {text}", model="sim-model",
                                output_column="summary", mode="batch_api", wait=True)
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_120000_rows_make_three_batches_and_every_row_is_answered_once(make_client):
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch", process=True) as sim:
        client = make_client(sim)
        result = client.infer(frame(120_000), prompt=PROMPT, model=MODEL,
                              output_column="summary", mode="batch_api", wait=True)
        assert result.stats.succeeded == 120_000 and result.stats.failed == 0
        assert result.df["summary"].notna().all()
        stats = batch_stats(sim)
        assert stats["batches_created"] == 3 and stats["files_uploaded"] == 3
        assert sorted(b["request_counts"]["total"] for b in sim.batches()) == [
            20_000, 50_000, 50_000]
        assert stats["lines_ok"] == 120_000 and stats["line_duplicates"] == 0
        assert client.ledger.status_counts()["ok"] == 120_000


@pytest.mark.slow
def test_sigkill_after_submission_then_a_rerun_submits_nothing(tmp_path, held, make_client,
                                                               store_url):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    held.configure(batch_validating_s=0.0)  # validated at once, then held in progress
    client = make_client(held)
    book = book_of(client)
    proc = subprocess.Popen([sys.executable, str(script), held.base_url, store_url, "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

    def submitted() -> bool:
        batches = book.all_batches()
        return len(batches) == 3 and all(b["batch_id"] for b in batches)

    sigkill_when(proc, submitted, 120, "three batches")
    assert proc.returncode == -signal.SIGKILL
    before = batch_stats(held)
    assert before["batches_created"] == 3 and before["files_uploaded"] == 3

    held.complete_batches()
    result = client.infer(frame(3000), prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=True)
    assert result.stats.succeeded == 3000 and result.stats.deferred == 0
    after = batch_stats(held)
    assert after["batches_created"] == 3 and after["files_uploaded"] == 3  # 0 new
    assert after["lines_ok"] == 3000 and after["line_duplicates"] == 0
    assert result.stats.prompt_tokens == after["line_prompt_tokens"]  # paid once, counted here


def test_a_submission_its_run_never_created_is_forgotten_and_submitted(tmp_path, held,
                                                                       make_client, store_url):
    """A run killed between recording a file's keys and creating its batch: the rerun finds
    no batch with that submission id, so it submits the keys itself."""
    client = make_client(held)
    book = book_of(client)
    book.record_submission({"submission_id": "bllm-dead", "provider": "openai",
                            "endpoint": "openai", "model": MODEL,
                            "route": "/chat/completions", "lines": 0, "bytes": 0,
                            "scope": "", "partition_key": "", "run_id": None})
    df = frame(5)
    from dagster_batchllm.core.tasks.chat.call import InferenceCall
    from dagster_batchllm.core.tasks.chat.rendering import iter_row_requests, row_tuples

    call = InferenceCall(prompt=PROMPT, model=MODEL, output_column="summary")
    keys = [r.key for r in iter_row_requests(row_tuples(df), call, default_max_tokens=512)]
    book.add_lines("bllm-dead", [(k, 1) for k in keys])
    with client.ledger.engine.begin() as conn:  # its owner, on another host, long silent
        conn.execute(book.batches.update().values(owner="elsewhere:1", updated_at=0.0))

    held.configure(batch_validating_s=0.0, batch_in_progress_s=0.0, batch_finalizing_s=0.0)
    result = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=True)
    assert result.stats.succeeded == 5
    assert [b["submission_id"] for b in book.all_batches()] != ["bllm-dead"]
    assert batch_stats(held)["batches_created"] == 1


def test_a_collection_whose_run_died_is_taken_over(held, make_client):
    """A run killed while streaming an ended batch's files into the book (status collecting):
    the next run collects the batch again, and every row is answered once."""
    client = make_client(held)
    df = frame(40)
    client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary", mode="batch_api",
                 wait=False)
    held.complete_batches()
    book = book_of(client)
    (batch,) = book.all_batches()
    with client.ledger.engine.begin() as conn:  # collecting, by a process long gone
        conn.execute(book.batches.update().values(status="collecting", owner="elsewhere:1",
                                                  updated_at=0.0))
    result = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=False)
    assert result.stats.succeeded == 40 and result.stats.requests == 0
    assert book.batch(batch["submission_id"])["status"] == "collected"
    assert batch_stats(held)["batches_created"] == 1


def test_a_run_stopped_while_it_waits_leaves_its_batches_for_the_rerun(held, make_client):
    """Cancelling ainfer() (what Terminate, SIGTERM and Ctrl-C do) while it polls: it stops at
    once; the batches it submitted stay in the book, and the rerun collects them."""
    import asyncio

    client = make_client(held)
    df = frame(30)

    async def stop_while_waiting() -> None:
        task = asyncio.create_task(client.ainfer(
            df, prompt=PROMPT, model=MODEL, output_column="summary", mode="batch_api",
            wait=True))
        while not (book_of(client).all_batches() and all(
                b["batch_id"] for b in book_of(client).all_batches())):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # polling now
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("the run did not stop")

    asyncio.run(stop_while_waiting())
    assert batch_stats(held)["batches_created"] == 1
    held.complete_batches()
    result = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=True)
    assert result.stats.succeeded == 30 and batch_stats(held)["batches_created"] == 1
