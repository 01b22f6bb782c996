"""A SQLite ledger file deleted or replaced under a running run: its open connections would
write on into the old file, which no one can open again, and the run would report success
for answers that went nowhere. The run notices at its next write (one ``stat``), stops
sending, keeps its journal and fails naming the file and the journal; a rerun on a new file
at that path folds the journal and pays again at most what was in flight."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import LedgerVanishedError
from dagster_batchllm.core.ledger.stores import check_ledger_file
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.testing import SimulatedEndpoint, wait_until

ROWS = 1500
CONCURRENCY = 16
DELETE_AFTER_OK = 300
pytestmark = pytest.mark.timeout(120)


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"text": [f"vanishing row {i:05d}" for i in range(ROWS)]})


def _settings(make_settings, sim):
    settings = make_settings(sim, ledger_flush_rows=32)
    return settings.replace(endpoints=(
        dataclasses.replace(settings.endpoints[0], max_concurrency=CONCURRENCY),))


@pytest.mark.slow
def test_a_ledger_file_deleted_mid_run_fails_the_run_keeps_the_journal_and_the_rerun_folds_it(
    make_settings, tmp_path
):
    path = tmp_path / "ledger.db"
    journal_dir = tmp_path / ".ledger.db.journal"
    with SimulatedEndpoint(latency_s=0.02, max_concurrency=256) as sim:
        settings = _settings(make_settings, sim)
        deleted: dict[str, float] = {}

        def delete_mid_run() -> None:
            wait_until(lambda: sim.stats(log=False)["ok"] >= DELETE_AFTER_OK, 60,
                       f"{DELETE_AFTER_OK} answers")
            deleted["in_flight"] = sim.stats(log=False)["in_flight"]
            path.unlink()  # as `rm ledger.db` would, the run's connections still open
            deleted["at"] = time.monotonic()

        deleter = threading.Thread(target=delete_mid_run, daemon=True)
        client = InferenceClient(settings)
        try:
            deleter.start()
            with pytest.raises(LedgerVanishedError) as raised:
                client.infer(_frame(), prompt="Echo {text}", model="sim-model",
                             output_column="out")
            failed_after_s = time.monotonic() - deleted["at"]
        finally:
            deleter.join(10)
            client.close()
        message = str(raised.value)
        journals = list(journal_dir.glob("*.jsonl"))
        # It says which ledger vanished and where its answers are, within seconds.
        assert str(path) in message and "deleted" in message, message
        assert len(journals) == 1 and str(journals[0]) in message, (message, journals)
        assert "folds" in message
        assert failed_after_s < 15, f"the run went on {failed_after_s:.1f} s after the deletion"
        # It stopped paying: far from every row was sent.
        first = sim.stats(log=False)
        assert DELETE_AFTER_OK <= first["ok"] < ROWS, first

        # A rerun on a new file at the same path folds the journal: paid twice at most what
        # was in flight when the file went (the journal kept every answer received).
        wait_until(lambda: sim.stats(log=False)["in_flight"] == 0, 10, "in-flight requests")
        assert not path.exists() or path.stat().st_size == 0
        with InferenceClient(settings) as rerun:
            result = rerun.infer(_frame(), prompt="Echo {text}", model="sim-model",
                                 output_column="out")
        assert (result.stats.succeeded, result.stats.failed) == (ROWS, 0)
        assert result.df["out"].tolist() == [f"[sim] Echo {t}" for t in _frame()["text"]]
        after = sim.stats(log=False)
        paid_twice = after["duplicates"]
        print(f"\nvanished ledger: deleted after {DELETE_AFTER_OK} answers "
              f"({deleted['in_flight']} in flight), the run failed {failed_after_s:.2f} s "
              f"later having been answered {first['ok']} times; the rerun sent "
              f"{result.stats.requests} requests, {result.stats.cached} answers from the "
              f"journal, {paid_twice} paid twice")
        assert paid_twice <= CONCURRENCY, (
            f"{paid_twice} answers paid twice, {deleted['in_flight']} in flight at the deletion")
        assert result.stats.cached == first["ok"] - paid_twice
        assert not list(journal_dir.glob("*.jsonl"))  # folded, then removed


def test_a_ledger_file_replaced_by_another_is_not_the_ledger_any_more(tmp_path):
    path, other = tmp_path / "ledger.db", tmp_path / "other.db"
    ledger = Ledger(f"sqlite:///{path}")
    Ledger(f"sqlite:///{other}").dispose()
    try:
        check_ledger_file(ledger.engine)  # the file it opened: fine
        os.replace(other, path)
        with pytest.raises(LedgerVanishedError, match="deleted or replaced") as raised:
            check_ledger_file(ledger.engine)
        assert raised.value.path == str(path)
        # A new connection of this engine would open the new file: refused, not mixed up.
        ledger.engine.dispose()
        with pytest.raises(LedgerVanishedError):
            ledger.status_counts()
    finally:
        ledger.dispose()
