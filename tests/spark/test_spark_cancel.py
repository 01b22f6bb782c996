"""A Spark job cancelled mid-inference loses none of the answers its tasks already received.

On cancel (``cancelJobGroup`` with ``interruptOnCancel=True``) Spark interrupts the task thread;
the Python worker gets no signal, and its socket to the JVM stays open (so there is nothing a
worker could turn into the engine's stop). The executor's monitor thread notices the interrupt
within 2 s, waits ``spark.python.task.killTimeout`` (2 s) and has the daemon SIGKILL the worker,
mid-batch; until then it keeps sending.
What the worker had received is in its run's journal (appended before it is acknowledged), and
the next query on the same ledger folds that journal in before it looks anything up: the rerun
pays again only for the requests that were in flight at the kill.
"""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
import sqlalchemy as sa

from dagster_batchllm.core.ledger.journal import read_records
from dagster_batchllm.core.settings import EndpointSpec
from dagster_batchllm.spark import ai_query_col, register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark

ROWS = 64  # 8 s of work at 4 x 0.5 s: the kill (<= ~4 s after the cancel) cuts it short
CONCURRENCY = 4  # the endpoint's, split over local[2]'s two task slots


def _answered_in_ledger(ledger_path) -> set[str]:
    engine = sa.create_engine(f"sqlite:///{ledger_path}")
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text(
                "SELECT request_key FROM batchllm_requests WHERE status = 'ok'")).scalars())
    finally:
        engine.dispose()


def _answered_in_journals(ledger_path) -> set[str]:
    journal_dir = ledger_path.parent / f".{ledger_path.name}.journal"
    return {record["request_key"] for path in journal_dir.glob("*.jsonl")
            for record in read_records(path)}


def _wait_until_quiet(sim, quiet_s: float = 1.5, limit_s: float = 30.0) -> dict:
    """The endpoint's stats once no request has arrived for ``quiet_s`` (and none is open)."""
    deadline = time.monotonic() + limit_s
    last = sim.stats(log=False)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = sim.stats(log=False)
        if now["requests"] != last["requests"] or now["in_flight"]:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return now
    raise AssertionError(f"the cancelled job's workers kept sending for {limit_s} s: {last}")


def _cancel_once_answered(spark, sim, group: str, answered: int, seen: dict) -> threading.Thread:
    """Cancel ``group`` from another thread once ``answered`` requests were answered."""

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = sim.stats(log=False)
            if stats["ok"] >= answered:
                spark.sparkContext.cancelJobGroup(group)
                seen.update(ok=stats["ok"], in_flight=stats["in_flight"],
                            requests=stats["requests"], at=time.monotonic())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# "ledger": written every 50 ms, so the killed task had written what it received; "journal":
# ledger writes held back past the kill, so its answers survive only in the journal.
# "shared" limits: the killed worker's claims and concurrency shares stay in the ledger until
# their lease runs out; the rerun must neither wait on them for ever nor pay twice.
@pytest.mark.parametrize(("kept_by", "limits"), [("ledger", "split"), ("journal", "split"),
                                                 ("journal", "shared")])
def test_a_cancelled_job_keeps_its_answers_and_the_rerun_pays_only_for_what_was_in_flight(
        spark, make_settings, tmp_path, kept_by, limits):
    ledger_path = tmp_path / "ledger.db"
    flush = {"ledger": {}, "journal": {"ledger_flush_interval_s": 600.0,
                                       "ledger_flush_rows": 10_000}}[kept_by]
    with SimulatedEndpoint(models=("sim-model",), latency_s=0.5) as sim:
        settings = make_settings(sim, **flush).replace(endpoints=(EndpointSpec(
            name="small", base_url=sim.base_url, models=("sim-model",),
            max_concurrency=CONCURRENCY),))
        register_ai_functions(spark, settings, limits=limits)
        texts = pd.DataFrame({"id": range(ROWS),
                              "text": [f"summarize call {i}" for i in range(ROWS)]})

        def query():  # a new plan each time: a cancelled one keeps its failed query stages
            return spark.createDataFrame(texts).repartition(2, "id").withColumn(
                "s", ai_query_col("sim-model", "text")).collect()

        group, seen = "batchllm-cancel-test", {}
        spark.sparkContext.setJobGroup(group, "cancelled mid-inference", interruptOnCancel=True)
        watcher = _cancel_once_answered(spark, sim, group, answered=10, seen=seen)
        try:
            with pytest.raises(Exception, match="cancel"):
                query()
        finally:  # a group of its own for the rerun (and the tests after this one)
            spark.sparkContext.setJobGroup("batchllm-after-cancel", "after the cancel")
        watcher.join(5)
        # The worker is killed within the monitor's 2 s poll plus killTimeout (2 s): after
        # that nothing more reaches the endpoint.
        before_rerun = _wait_until_quiet(sim)
        sending_s = time.monotonic() - seen["at"] - 1.5
        answered_before_rerun = before_rerun["ok"]
        in_ledger = _answered_in_ledger(ledger_path)
        in_journal = _answered_in_journals(ledger_path)
        kept = len(in_ledger | in_journal)

        started = time.monotonic()
        rows = query()
        rerun_s = time.monotonic() - started
        after = sim.stats(log=False)

    print(f"\n[{kept_by}, {limits}] cancelled at {seen['ok']} answered "
          f"({seen['in_flight']} in flight); "
          f"{answered_before_rerun} answered before the rerun; kept {kept}: {len(in_ledger)} in "
          f"the ledger, {len(in_journal)} in journals; "
          f"{before_rerun['requests'] - seen['requests']} requests sent in the "
          f"~{sending_s:.1f} s after the cancel; "
          f"rerun sent {after['requests'] - before_rerun['requests']}, "
          f"duplicates {after['duplicates']}, in {rerun_s:.1f} s")
    assert len(rows) == ROWS and all(r.s == f"[sim] {r.text}" for r in rows)
    assert seen["ok"] >= 10 and answered_before_rerun < ROWS  # really cut short
    # An answer the endpoint sent but the worker had not read at the kill was in flight.
    assert kept >= answered_before_rerun - CONCURRENCY
    if kept_by == "journal":  # the killed task's answers were in its journal alone
        assert in_journal - in_ledger
    assert after["duplicates"] <= CONCURRENCY  # at most what was in flight at the kill
    assert len(_answered_in_ledger(ledger_path)) == ROWS
    assert not _answered_in_journals(ledger_path)  # folded by the rerun, then its own removed
