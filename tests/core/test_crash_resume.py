"""A run killed with SIGKILL mid-way resumes from its ledger and journal: nothing lost, only
what was in flight paid twice."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.testing import SimulatedEndpoint, sigkill_when, wait_until

ROWS = 2000
CONCURRENCY = 32
FLUSH_ROWS = 16

# The child: one infer() over ROWS rows into the ledger file, as a Dagster run's process would.
CHILD = """
import sys
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

base_url, store_url, rows, concurrency, flush_rows = sys.argv[1:6]
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="ep0", base_url=base_url, models=("sim-model",),
                            max_concurrency=int(concurrency)),),
    store_url=store_url, ledger_flush_rows=int(flush_rows), ledger_flush_interval_s=0.05,
    progress_interval_s=60.0, request_timeout_s=10.0,
)
df = pd.DataFrame({"text": [f"crash row {i:05d}" for i in range(int(rows))]})
print("started", flush=True)
InferenceClient(settings).infer(df, prompt="Echo {text}", model="sim-model",
                                output_column="out")
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_run_killed_with_sigkill_resumes_every_row_and_resends_at_most_what_was_in_flight(
    make_settings, tmp_path
):
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"  # make_settings' ledger file too
    with SimulatedEndpoint(latency_s=0.01) as sim:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, sim.base_url, store_url, str(ROWS), str(CONCURRENCY),
             str(FLUSH_ROWS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        try:
            sigkill_when(child, lambda: sim.stats(log=False)["ok"] >= ROWS // 2, 60,
                         "the child to get half way")
        finally:
            stdout = child.stdout.read().decode() if not child.stdout.closed else ""
            child.stdout.close()
            child.stderr.close()
        assert child.returncode == -signal.SIGKILL and "finished" not in stdout
        # Let the requests the dead client left behind run out at the server.
        wait_until(lambda: sim.stats(log=False)["in_flight"] == 0, 10, "in-flight requests")
        before = sim.stats(log=False)
        assert 0 < before["ok"] < ROWS and before["duplicates"] == 0

        ledger = Ledger(store_url)
        recorded = ledger.status_counts()
        ledger.dispose()
        assert recorded["failed"] == recorded["deferred"] == 0
        assert 0 < recorded["ok"] <= before["ok"]

        df = pd.DataFrame({"text": [f"crash row {i:05d}" for i in range(ROWS)]})
        settings = make_settings(sim, ledger_flush_rows=FLUSH_ROWS)
        assert settings.store_url == store_url
        settings = settings.replace(endpoints=(
            dataclasses.replace(settings.endpoints[0], max_concurrency=CONCURRENCY),))
        with InferenceClient(settings) as client:
            result = client.infer(df, prompt="Echo {text}", model="sim-model",
                                  output_column="out")
            recorded_after = client.ledger.status_counts()

        # Every row is complete and right.
        assert (result.stats.succeeded, result.stats.failed) == (ROWS, 0)
        assert result.df["out"].tolist() == [f"[sim] Echo {t}" for t in df["text"]]
        # The answers the ledger had not been written yet come from the dead run's journal.
        assert recorded["ok"] <= result.stats.cached <= before["ok"]
        assert result.stats.requests == ROWS - result.stats.cached
        assert recorded_after["ok"] == ROWS
        # Only answers of the requests in flight at the kill were paid twice (the journal kept
        # every answer the run had acknowledged, the unwritten ledger batch included).
        after = sim.stats(log=False)
        assert after["ok"] - before["ok"] == ROWS - result.stats.cached
        assert after["duplicates"] == before["ok"] - result.stats.cached
        assert after["duplicates"] <= CONCURRENCY, (
            f"{after['duplicates']} answers paid twice "
            f"({before['ok'] - recorded['ok']} were not in the ledger at the kill)")


def test_a_ledger_that_cannot_be_written_stops_the_run_sending_and_raises(sim, make_client):
    client = make_client(sim, ledger_flush_rows=8)
    writes = {"n": 0}
    upsert = client.ledger.upsert

    def failing_upsert(records, also=None):
        writes["n"] += 1
        if writes["n"] > 2:
            raise OSError("disk full")
        return upsert(records, also)

    client.ledger.upsert = failing_upsert
    df = pd.DataFrame({"text": [f"row {i}" for i in range(3000)]})
    with pytest.raises(OSError, match="disk full"):
        client.infer(df, prompt="Echo {text}", model="sim-model")
    # It stopped paying for answers it could not keep: far fewer than 3,000 were sent.
    sent = sim.stats(log=False)["requests"]
    assert 0 < sent <= 300


def test_a_new_journal_is_never_folded_by_a_run_starting_at_the_same_moment(tmp_path,
                                                                          monkeypatch):
    """Runs of one process start together (the SQL functions answer batches concurrently): a
    run folding abandoned journals must not take another's brand-new journal for a dead one.
    The race is made to happen: another run folds right before the new journal takes its lock."""
    import fcntl
    import logging
    import types

    from dagster_batchllm.core.ledger import journal as journal_module
    from dagster_batchllm.core.ledger.journal import AnswerJournal, fold_abandoned
    from dagster_batchllm.core.ledger.table import Ledger

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    directory = tmp_path / ".ledger.db.journal"
    folding = {"active": False}

    def flock_after_another_run_folds(fd, operation):
        if not folding["active"]:  # the new journal locking itself: another run folds first
            folding["active"] = True
            try:
                fold_abandoned(directory, ledger, logging.getLogger("test"))
            finally:
                folding["active"] = False
        return fcntl.flock(fd, operation)

    monkeypatch.setattr(journal_module, "fcntl", types.SimpleNamespace(
        flock=flock_after_another_run_folds, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB))
    journal = AnswerJournal(directory)
    try:
        assert journal.path.exists()  # not folded away while its run is alive
        journal.append({"request_key": "k"})
        assert journal.path.read_text().count("\n") == 1
    finally:
        journal.close(remove=True)
        ledger.dispose()


def test_a_journal_of_arrays_folds_into_the_records_it_was_given(tmp_path):
    """Records after the first of their fields are journaled as arrays; a record of other
    fields (or order), and a journal of an older version (an object per line), read back as
    they were."""
    import logging

    from dagster_batchllm.core.ledger.journal import AnswerJournal, fold_abandoned

    def key(name: str) -> str:  # a request key is a SHA-256 in hex
        return hashlib.sha256(name.encode()).hexdigest()

    def record(name: str, response: str) -> dict:
        return {"request_key": key(name), "scope": "", "partition_key": "", "model": "m",
                "status": "ok", "response": response, "error": None, "error_type": None,
                "prompt_tokens": 2, "completion_tokens": 0, "attempts": 1, "endpoint": "sim",
                "latency_ms": 1.5, "run_id": None}

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    directory = tmp_path / ".ledger.db.journal"
    journal = AnswerJournal(directory)
    journal.append_many([record("a", "A \"quoted\" é\n"), record("b", "B")])
    journal.append(dict(reversed(record("c", "C").items())))  # its fields in another order
    journal.append_many([record("d", "D"), record("e", "E")])
    lines = journal.path.read_text().splitlines()
    assert [line[0] for line in lines] == ["{", "[", "{", "{", "["]
    journal.close(remove=False)  # as a killed run leaves it
    (directory / "old-run.jsonl").write_text(json.dumps(record("f", "F")) + "\n")
    try:
        assert fold_abandoned(directory, ledger, logging.getLogger("test")) == 6
        answers = ledger.lookup_ok([key(name) for name in "abcdef"])
        assert {k: v["response"] for k, v in answers.items()} == {
            key("a"): "A \"quoted\" é\n", key("b"): "B", key("c"): "C", key("d"): "D",
            key("e"): "E", key("f"): "F"}
        assert not list(directory.glob("*.jsonl"))
    finally:
        ledger.dispose()
