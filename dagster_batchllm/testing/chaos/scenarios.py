"""The fault scenarios: a table through ``InferenceClient.infer()`` against simulated endpoints
while something goes wrong, measured at the servers (see the package's docstring)."""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .data import distinct_requests, make_frame
from .fleet import Fleet, Scale, clean_tokens, measured, tally
from .outcome import Outcome, finish
from .running import (
    POSTGRES_URL,
    Background,
    drop_tables,
    ledger_counts,
    postgres_unavailable,
    run_in_process,
    start_worker,
    wait_until,
    worker_result,
)


def scenario_429_storm(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome(f"1. 429 storm: 30% for {scale.storm_s:g} s (issue: 60 s)")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 1, error_rate_429=0.3, retry_after_s=scale.retry_after_s)

    def during(job: Background) -> None:
        job.wait(scale.storm_s)
        fleet.configure(error_rate_429=0.0)
        outcome.notes.append(f"storm over after {scale.storm_s:g} s; "
                             f"run still going: {job.running}")

    run_in_process(outcome, fleet, df, during)
    outcome.require(outcome.statuses.get("429", 0) > 0, "the storm sent no 429")
    return finish(outcome)


def scenario_5xx_and_drops(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("2. 10% HTTP 500 + 3% dropped connections")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2, error_rate_500=0.10, drop_rate=0.03)
    run_in_process(outcome, fleet, df, lambda job: None)
    outcome.require(outcome.statuses.get("500", 0) > 0 and outcome.statuses.get("drop", 0) > 0,
                    "no 500 or no dropped connection happened")
    return finish(outcome)


def scenario_slow_endpoint(scale: Scale, workdir: Path) -> Outcome:
    slow = scale.timeout_s * 2.5
    outcome = Outcome(f"3. slow endpoint: 1 of 2 goes to {slow:g} s "
                      f"(timeout {scale.timeout_s:g} s)")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2)
    target = distinct_requests(df) * 0.2

    def during(job: Background) -> None:
        reached = wait_until(lambda: fleet.answered() >= target or not job.running, 120)
        fleet.sims[0].configure(latency_s=slow)
        outcome.require(reached and job.running, "the run ended before the endpoint slowed")

    run_in_process(outcome, fleet, df, during)
    return finish(outcome)


def scenario_endpoint_death(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome(f"4. 1 of 3 endpoints killed at 30%, 1 restarted ({scale.restart_down_s:g} s"
                      " down)")
    df = make_frame(scale.rows)
    # Slow enough that the last 70% take one endpoint twice the downtime: the restarted one
    # must come back while rows are still being sent.
    fleet = Fleet(scale, 3, rps=min(scale.rps, 0.7 * scale.rows / (2 * scale.restart_down_s)))
    target = distinct_requests(df) * 0.3

    def during(job: Background) -> None:
        reached = wait_until(lambda: fleet.answered() >= target or not job.running, 120)
        outcome.require(reached and job.running, "the run ended before the endpoints died")
        dead, restarted = fleet.sims[0], fleet.sims[1]
        dead.stop()
        restarted.stop()
        time.sleep(scale.restart_down_s)
        outcome.require(job.running, "the run ended while an endpoint was down (make it longer)")
        restarted.start()

    run_in_process(outcome, fleet, df, during)
    return finish(outcome)


def scenario_budget_edge(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("7. token budget runs out mid-batch, concurrency 128")
    df = make_frame(scale.rows)
    # Faster endpoint limits than elsewhere, and latency, so 128 requests really are in flight.
    fleet = Fleet(scale, 1, concurrency=128, rps=scale.rps * 8, tps=scale.tps * 8,
                  latency_s=max(0.1, scale.latency_s))
    outcome.budget = clean_tokens(scale, [df]) // 2
    run_in_process(outcome, fleet, df, lambda job: None, token_budget=outcome.budget)
    outcome.require(outcome.deferred > 0 and outcome.ok > 0,
                    "the budget did not run out mid-batch (no deferred or no ok rows)")
    return finish(outcome)


def scenario_bad_replies(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("8. bad replies: non-JSON, no choices, empty, bad schema, stalled")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2, malformed_rate=0.02, no_choices_rate=0.02, empty_rate=0.02,
                  bad_structured_rate=0.02, stall_rate=0.01)
    run_in_process(outcome, fleet, df, lambda job: None, structured=True)
    for code in ("malformed_response", "invalid_structured_output"):
        outcome.require(outcome.failures.get(code, 0) > 0, f"no row failed with {code}")
    outcome.require(outcome.statuses.get("stall", 0) > 0, "no reply stalled")
    return finish(outcome)


# -- scenarios with inferring subprocesses ---------------------------------------------------

def worker_job(scale: Scale, fleet: Fleet, store_url: str, table: str, rows: int,
               partition: str, out: Path, offset: int = 0) -> dict:
    """The job of ``run_worker``: ``rows`` rows of ``make_frame`` from ``offset``."""
    return {"scale": scale.name, "fleet": fleet.describe(), "store_url": store_url,
            "ledger_table": table, "rows": rows, "offset": offset, "seed": 7,
            "partition": partition, "out": str(out)}


def scenario_crash(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("5. SIGKILL x3 at random points, each rerun resumes from the ledger")
    df = make_frame(scale.crash_rows)
    distinct = distinct_requests(df)
    fleet = Fleet(scale, 2)
    store_url, table = f"sqlite:///{workdir / 'crash-ledger.db'}", "batchllm_requests"
    job = worker_job(scale, fleet, store_url, table, scale.crash_rows, "crash",
                     workdir / "crash.pkl")
    rng = random.Random(5)
    out = None
    with measured(outcome, fleet):
        answered_before = recorded_before = 0
        for k in range(3):
            proc = start_worker(job)
            target = answered_before + rng.uniform(0.08, 0.25) * distinct
            wait_until(lambda target=target, proc=proc:
                       fleet.answered() >= target or proc.poll() is not None, 300)
            if proc.poll() is not None:
                # On a small or fast run the rows can all be answered before the kill point;
                # that is a shorter scenario, not a failure (unless the run itself failed).
                finished, error = worker_result(proc, job)
                if finished is None:
                    outcome.problems.append(f"run {k + 1} failed before it was killed: "
                                            f"{error[-300:]}")
                else:
                    outcome.notes.append(f"run {k + 1} finished before its kill point")
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
            time.sleep(0.3)  # the endpoints see the closed connections and give up on them
            answered_now = fleet.answered()
            recorded = ledger_counts(store_url, table).get(("crash", "ok"), 0)
            lost = (answered_now - answered_before) - (recorded - recorded_before)
            outcome.allowed_duplicates += lost
            outcome.notes.append(f"kill {k + 1}: {answered_now} answered, {recorded} recorded, "
                                 f"{lost} answered but not yet recorded")
            answered_before, recorded_before = answered_now, recorded
        proc = start_worker(job)
        out, error = worker_result(proc, job)
        outcome.require(out is not None, f"the resumed run failed: {error}")
    tally(outcome, scale, [(df, out)])
    return finish(outcome)


def scenario_contention(scale: Scale, workdir: Path, backend: str = "sqlite") -> Outcome:
    label = "SQLite" if backend == "sqlite" else "PostgreSQL"
    outcome = Outcome(f"6. 4 processes, overlapping partitions, one {label} ledger")
    n = scale.contention_rows
    parts = [(f"p{i}", i * n // 2) for i in range(4)]
    frames = [make_frame(n, offset=offset) for _, offset in parts]
    table = f"chaos_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        store_url = f"sqlite:///{workdir / 'contention-ledger.db'}"
    else:
        store_url = POSTGRES_URL
        reason = postgres_unavailable()
        if reason:
            outcome.notes.append(f"skipped: {reason}")
            outcome.limits = "skipped"
            return outcome
    fleet = Fleet(scale, 2)
    jobs = [worker_job(scale, fleet, store_url, table, n, part,
                       workdir / f"{backend}-{part}.pkl", offset) for part, offset in parts]
    results = []
    try:
        with measured(outcome, fleet):
            procs = [start_worker(job) for job in jobs]
            for proc, job in zip(procs, jobs, strict=True):
                out, error = worker_result(proc, job)
                outcome.require(out is not None, f"partition {job['partition']} failed: {error}")
                results.append(out)
            counts = ledger_counts(store_url, table)
            for (part, _), df in zip(parts, frames, strict=True):
                recorded = sum(c for (p, st), c in counts.items()
                               if p == part and st != "deferred")
                outcome.require(recorded == distinct_requests(df),
                                f"the ledger holds {recorded} records for {part}, "
                                f"expected {distinct_requests(df)}")
    finally:
        if backend != "sqlite":
            drop_tables(store_url, [table, f"{table}_holders"])
    tally(outcome, scale, list(zip(frames, results, strict=True)))
    return finish(outcome)


SCENARIOS: dict[str, Callable[[Scale, Path], Outcome]] = {
    "429_storm": scenario_429_storm,
    "5xx_and_drops": scenario_5xx_and_drops,
    "slow_endpoint": scenario_slow_endpoint,
    "endpoint_death": scenario_endpoint_death,
    "crash": scenario_crash,
    "contention_sqlite": scenario_contention,
    "contention_postgres": lambda scale, workdir: scenario_contention(scale, workdir, "postgres"),
    "budget_edge": scenario_budget_edge,
    "bad_replies": scenario_bad_replies,
}


def run_scenario(name: str, scale: Scale, workdir: Path | None = None, *,
                 scenarios: dict[str, Callable[[Scale, Path], Outcome]] | None = None) -> Outcome:
    """``scenarios``: where ``name`` is looked up (these by default; bench/chaos.py adds
    others)."""
    scenario = (scenarios or SCENARIOS)[name]
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as tmp:
            return scenario(scale, Path(tmp))
    return scenario(scale, workdir)
