"""Stopping a run cleanly: real processes, real signals, duplicates counted at the server.

A stopped run (SIGTERM, SIGINT / Ctrl-C, Dagster's interrupt) stops sending at once, writes
what was answered, cancels what is in flight and ends within seconds; a rerun then pays again
for at most the requests in flight at the signal. A SIGKILLed run loses no acknowledged answer
either (its journal is folded into the ledger by the next run).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagster_batchllm.testing import SimulatedEndpoint, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# A plain Python process calling the sync infer(), as a script or a notebook cell would.
CHILD = """
import sys, time
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

url, store_url, concurrency, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="e", base_url=url, models=("sim-model",),
                            max_concurrency=concurrency),),
    store_url=store_url, progress_interval_s=3600.0)
df = pd.DataFrame({"t": [f"row {i}" for i in range(rows)]})
try:
    InferenceClient(settings).infer(df, prompt="{t}", model="sim-model", output_column="o")
    print("finished", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the caller", flush=True)
    raise
"""


def stop_mid_run(sim: SimulatedEndpoint, argv: list[str], sig: int, *, after_ok: int,
                 env: dict | None = None, cwd: Path | None = None, exit_within_s: float = 5.0
                 ) -> tuple[int, int, float, str]:
    """Start ``argv``, send ``sig`` once ``after_ok`` rows were answered; (return code,
    requests in flight at the signal, seconds to exit, output)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd)
    try:
        wait_until(lambda: sim.stats(log=False)["ok"] >= after_ok or proc.poll() is not None,
                   120, f"{after_ok} answers")
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        in_flight = sim.stats(log=False)["in_flight"]
        signalled = time.monotonic()
        proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=exit_within_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(
                f"still running 35 s after {sig!r}: {out.decode()[-3000:]}") from None
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, in_flight, took, out.decode(errors="replace")


def rerun_duplicates(sim: SimulatedEndpoint, argv: list[str], **popen) -> int:
    """Run ``argv`` to the end; the answers the server gave twice, all runs together."""
    wait_until(lambda: sim.stats(log=False)["in_flight"] == 0, 10, "in-flight requests to end")
    completed = subprocess.run(argv, capture_output=True, timeout=180, **popen)
    assert completed.returncode == 0, (completed.stdout + completed.stderr).decode()[-3000:]
    return sim.stats(log=False)["duplicates"]


def child_argv(sim: SimulatedEndpoint, store_url: str, concurrency: int, rows: int) -> list:
    return [sys.executable, "-c", CHILD, sim.base_url, store_url, str(concurrency), str(rows)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_infer_stops_it_within_5_s_and_loses_no_answer(sig, tmp_path):
    with SimulatedEndpoint(latency_s=1.0, process=True) as sim:
        argv = child_argv(sim, f"sqlite:///{tmp_path / 'ledger.db'}", 4, 40)
        code, in_flight, took, out = stop_mid_run(sim, argv, sig, after_ok=20)
        assert took < 5.0, out
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt reached the caller" in out, out
            assert code != 0
        else:  # the process still ends by SIGTERM, once the run has written its answers
            assert code == -signal.SIGTERM, out
        assert "stopping" in out, out  # the run said what it does
        # ... counting what was in flight: requests sent, not workers (twice the concurrency)
        said = re.search(r"(\d+) requests in flight are cancelled", out)
        assert said and 1 <= int(said.group(1)) <= 4, out
        duplicates = rerun_duplicates(sim, argv)
        assert duplicates <= in_flight, f"{duplicates} answers paid twice, {in_flight} in flight"


def test_sigkill_at_concurrency_64_costs_a_rerun_at_most_the_requests_in_flight(tmp_path):
    with SimulatedEndpoint(latency_s=0.2, process=True) as sim:
        argv = child_argv(sim, f"sqlite:///{tmp_path / 'ledger.db'}", 64, 3000)
        code, in_flight, _, out = stop_mid_run(sim, argv, signal.SIGKILL, after_ok=700)
        assert code == -signal.SIGKILL, out
        before = sim.stats(log=False)["ok"]
        duplicates = rerun_duplicates(sim, argv)
        assert sim.stats(log=False)["ok"] - duplicates == 3000
        assert duplicates <= 64, f"{duplicates} answers paid twice of {before} answered"
        assert not list(tmp_path.glob(".ledger.db.journal/*.jsonl"))  # folded, and removed


def _location_env(tmp_path: Path, sim: SimulatedEndpoint) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
    env.update(BATCHLLM_WAREHOUSE_URL=f"sqlite:///{tmp_path / 'warehouse.db'}",
               BATCHLLM_STORE_URL=f"sqlite:///{tmp_path / 'ledger.db'}",
               BATCHLLM_ENDPOINTS=sim.base_url, BATCHLLM_MODEL="sim-model",
               BATCHLLM_MAX_CONCURRENCY="4", DAGSTER_HOME=str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir(exist_ok=True)
    return env


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_dagster_asset_materialize_stops_within_5_s(sig, tmp_path):
    with SimulatedEndpoint(latency_s=1.0, process=True) as sim:
        env = _location_env(tmp_path, sim)
        argv = [str(BIN / "dagster"), "asset", "materialize", "-f", "definitions.py",
                "--select", "cleaned_transcripts,transcript_summaries",
                "--partition", "2026-11-05"]
        code, in_flight, took, out = stop_mid_run(sim, argv, sig, after_ok=20, env=env,
                                                  cwd=REPO_ROOT)
        assert took < 5.0, out[-3000:]
        assert code != 0, out[-3000:]
        assert "stopping" in out, out[-3000:]
        duplicates = rerun_duplicates(sim, argv, env=env, cwd=REPO_ROOT)
        assert duplicates <= in_flight, f"{duplicates} answers paid twice, {in_flight} in flight"
