"""Runs at once share an endpoint: their combined requests stay within its max_concurrency,
measured at the server, because they coordinate through the ledger database."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.testing import SimulatedEndpoint

LIMIT = 6  # the endpoint's max_concurrency, shared by all runs
RUNS = 3
ROWS = 150
pytestmark = pytest.mark.timeout(60)


class RunRecordingResponder:
    """Answers 'ok' and notes when each run's requests arrive (the prompt names the run)."""

    def __init__(self):
        self.arrivals: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def models(self) -> list[str]:
        return ["sim-model"]

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        run = messages[-1]["content"].split()[2]  # "Echo: run r1 row 7"
        with self._lock:
            self.arrivals.setdefault(run, []).append(time.monotonic())
        return "ok"


@pytest.fixture
def recorder():
    return RunRecordingResponder()


@pytest.fixture
def busy_sim(recorder):
    # Many server-side slots and a latency that keeps requests in flight long enough to overlap:
    # what the server sees is then what the clients send.
    with SimulatedEndpoint(latency_s=0.02, max_concurrency=256, responder=recorder) as sim:
        yield sim


def _run_partitions_at_once(settings) -> list:
    start = threading.Barrier(RUNS)

    def one_run(i: int):
        # One client per run, as separate Dagster runs (processes) each have their own.
        with InferenceClient(settings) as client:
            df = pd.DataFrame({"text": [f"run r{i} row {j}" for j in range(ROWS)]})
            start.wait()
            return client.infer(df, prompt="Echo: {text}", output_column="out",
                                partition_key=f"2026-11-0{i + 1}", scope="summaries",
                                run_id=f"r{i}").stats

    with ThreadPoolExecutor(RUNS) as pool:
        return list(pool.map(one_run, range(RUNS)))


def _settings(make_settings, sim, *, coordinate_runs: bool):
    settings = make_settings(sim, coordinate_runs=coordinate_runs,
                             coordination_interval_s=0.25)
    shared = dataclasses.replace(settings.endpoints[0], max_concurrency=LIMIT)
    return settings.replace(endpoints=(shared,))


def _all_runs_overlapped(recorder: RunRecordingResponder) -> bool:
    spans = [(min(times), max(times)) for times in recorder.arrivals.values()]
    return len(spans) == RUNS and max(s for s, _ in spans) < min(e for _, e in spans)


@pytest.mark.slow
def test_coordinated_runs_respect_the_endpoints_concurrency_together(make_settings, busy_sim,
                                                                      recorder):
    stats = _run_partitions_at_once(_settings(make_settings, busy_sim, coordinate_runs=True))
    assert [s.succeeded for s in stats] == [ROWS] * RUNS
    server = busy_sim.stats(log=False)
    assert server["requests"] == RUNS * ROWS
    assert _all_runs_overlapped(recorder)  # all three were sending at the same time ...
    assert server["max_concurrent"] <= LIMIT  # ... and together stayed within the limit


@pytest.mark.slow
def test_uncoordinated_runs_would_multiply_the_load(make_settings, busy_sim, recorder):
    stats = _run_partitions_at_once(_settings(make_settings, busy_sim, coordinate_runs=False))
    assert [s.succeeded for s in stats] == [ROWS] * RUNS
    assert _all_runs_overlapped(recorder)
    # Each run alone keeps to the limit; three at once exceed it: the measurement above bites.
    assert busy_sim.stats(log=False)["max_concurrent"] > LIMIT
