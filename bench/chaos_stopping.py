"""The stopping scenarios of ``bench/chaos.py``: a run stopped by SIGTERM, killed by SIGKILL, or
cut off from its PostgreSQL ledger, then run again; measured at the simulated servers.

Figures per scenario: rows without an outcome (must be 0), answers paid twice (duplicate
deliveries) against the bound, the requests in flight at the stop (a rerun may pay those
again, nothing else), and how long the stopped process took to exit. Not in the reduced suite
of ``tests/test_chaos.py``: ``tests/stopping/`` tests the same with real processes. Built on
the fault scenarios' harness, :mod:`dagster_batchllm.testing.chaos`; run them with
``python -m bench.chaos --only sigterm,sigkill_64,ledger_outage`` from the repository root.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.testing import CuttableProxy
from dagster_batchllm.testing.chaos import (
    POSTGRES_URL,
    Background,
    Fleet,
    Outcome,
    Scale,
    distinct_requests,
    drop_tables,
    finish,
    infer,
    ledger_counts,
    make_frame,
    measured,
    postgres_unavailable,
    start_worker,
    tally,
    wait_until,
    worker_job,
    worker_result,
)

STOP_WITHIN_S = 5.0  # the bound for a stopped process to exit


def _stop_and_rerun(outcome: Outcome, scale: Scale, workdir: Path, sig: int, *,
                    concurrency: int, latency_s: float, stop_at: float) -> Outcome:
    """A worker over ``scale.crash_rows`` rows gets ``sig`` once ``stop_at`` of its requests
    are answered; a second worker runs the same rows to the end."""
    df = make_frame(scale.crash_rows)
    # Endpoint limits high enough that ``concurrency`` requests really are in flight.
    fleet = Fleet(scale, 1, concurrency=concurrency, latency_s=latency_s,
                  rps=max(scale.rps, 2 * concurrency / latency_s),
                  tps=max(scale.tps, 200 * concurrency / latency_s))
    store_url = f"sqlite:///{workdir / 'stop-ledger.db'}"
    job = worker_job(scale, fleet, store_url, "batchllm_requests", scale.crash_rows, "stop",
                     workdir / "stop.pkl")
    out = None
    with measured(outcome, fleet):
        proc = start_worker(job)
        target = stop_at * distinct_requests(df)
        wait_until(lambda: fleet.answered() >= target or proc.poll() is not None, 300)
        outcome.require(proc.poll() is None, "the run ended before the stop (make it longer)")
        in_flight = fleet.in_flight()
        signalled = time.monotonic()
        os.kill(proc.pid, sig)
        proc.communicate(timeout=60)
        exit_s = time.monotonic() - signalled
        if sig != signal.SIGKILL:
            outcome.require(exit_s < STOP_WITHIN_S,
                            f"the process took {exit_s:.1f} s to exit after the signal")
        wait_until(lambda: fleet.in_flight() == 0, 10)
        answered = fleet.answered()
        kept = ledger_counts(store_url, "batchllm_requests").get(("stop", "ok"), 0)
        outcome.allowed_duplicates = in_flight
        outcome.notes.append(
            f"{signal.Signals(sig).name} with {in_flight} in flight, {answered} answered: exit "
            f"after {exit_s:.2f} s (code {proc.returncode}), {kept} answers in the ledger at once"
            f"{' (the rest in the journal, folded by the rerun)' if kept < answered else ''}")
        rerun = start_worker(job)
        out, error = worker_result(rerun, job)
        outcome.require(out is not None, f"the rerun failed: {error}")
    tally(outcome, scale, [(df, out)])
    return finish(outcome)


def scenario_sigterm(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("9. SIGTERM mid-run at 30%, then a rerun")
    return _stop_and_rerun(outcome, scale, workdir, signal.SIGTERM, concurrency=16,
                           latency_s=max(0.2, scale.latency_s), stop_at=0.3)


def scenario_sigkill_64(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("10. SIGKILL at concurrency 64, then a rerun")
    return _stop_and_rerun(outcome, scale, workdir, signal.SIGKILL, concurrency=64,
                           latency_s=max(0.2, scale.latency_s), stop_at=0.3)


def scenario_ledger_outage(scale: Scale, workdir: Path) -> Outcome:
    cut_s = 15.0 if scale.name == "bench" else 2.0
    outcome = Outcome(f"11. PostgreSQL ledger cut off for {cut_s:g} s at 25% (a TCP proxy)")
    reason = postgres_unavailable()
    if reason:
        outcome.notes.append(f"skipped: {reason}")
        outcome.limits = "skipped"
        return outcome
    import sqlalchemy as sa

    url = sa.engine.make_url(POSTGRES_URL)
    proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432))
    table = f"chaos_outage_{uuid.uuid4().hex[:10]}"
    store_url = url.set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2)
    client = InferenceClient(fleet.settings(store_url=store_url, ledger_table=table))
    try:
        with measured(outcome, fleet):
            try:
                result = _cut_mid_run(outcome, proxy, client, fleet, df, store_url, table,
                                      cut_s)
            finally:
                client.close()
                proxy.close()
    finally:
        drop_tables(POSTGRES_URL, [table, f"{table}_claims", f"{table}_runs"])
    tally(outcome, scale, [(df, result.df)])
    return finish(outcome)


def _cut_mid_run(outcome: Outcome, proxy: CuttableProxy, client: InferenceClient, fleet: Fleet,
                 df, store_url: str, table: str, cut_s: float):
    """Infer ``df`` while the ledger database is cut off for ``cut_s`` at 25%; the result."""
    job = Background(lambda: infer(client, df))
    reached = wait_until(lambda: fleet.answered() >= 0.25 * distinct_requests(df)
                         or not job.running, 120)
    outcome.require(reached and job.running, "the run ended before the cut")
    proxy.cut()
    at_cut = fleet.answered()
    time.sleep(cut_s)
    during = fleet.answered() - at_cut
    proxy.restore()
    restored = time.monotonic()
    result = job.join(120)
    ended_s = time.monotonic() - restored
    kept = ledger_counts(store_url, table)
    ok_records = sum(c for (_, status), c in kept.items() if status == "ok")
    lost = distinct_requests(df) - ok_records
    outcome.require(lost == 0, f"{lost} answered requests are not in the ledger")
    outcome.notes.append(
        f"{proxy.refused} connections refused during the cut; {during} answers arrived "
        f"while it lasted (the run pauses once its unwritten room is full); run ended "
        f"{ended_s:.1f} s after the database came back; ledger rows lost: {lost}")
    return result

STOPPING_SCENARIOS = {
    "sigterm": scenario_sigterm,
    "sigkill_64": scenario_sigkill_64,
    "ledger_outage": scenario_ledger_outage,
}
