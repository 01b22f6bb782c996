"""Several runs over the same rows, one ledger: they share the work and pay each row once.

Four processes over the same 2,000 rows used to deadlock claiming them on PostgreSQL (multi-row
inserts in different key orders), fall back to sending without a claim and pay up to 85% of
the rows twice; and where claims worked, one run claimed every row and the others waited for
its answers with 3/4 of the endpoint idle, so four runs took four times as long as one. Now
claims are taken in one key order, retried instead of skipped, and a slice at a time, so every
run sends a part. Default settings; the simulator counts what it answered twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.ledger.stores import normalize_store_url
from dagster_batchllm.testing import SimulatedEndpoint

ROWS = 2_000
CONCURRENCY = 32  # the endpoint's: at most this many requests are in flight at any moment

WORKER = """
import json, sys, time
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

base_url, store_url, table, rows, concurrency, out_path = sys.argv[1:7]
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="gpu", base_url=base_url, models=("sim-model",),
                            max_concurrency=int(concurrency)),),
    store_url=store_url, ledger_table=table, progress_interval_s=3600.0)
df = pd.DataFrame({"text": [f"shared row {i:05d}" for i in range(int(rows))]})
with InferenceClient(settings) as client:
    started = time.perf_counter()
    result = client.infer(df, prompt="Echo {text}", model="sim-model", output_column="out")
    elapsed = time.perf_counter() - started
with open(out_path, "w") as f:
    json.dump({"elapsed": elapsed, "stats": result.stats.as_dict(),
               "right": sum(o == f"[sim] Echo shared row {i:05d}"
                            for i, o in enumerate(result.df["out"]))}, f)
"""


def run_at_once(script: str, argv: list[str], n: int, tmp_path) -> list[dict]:
    """``n`` processes of ``script`` at once, each given ``argv`` and then the path of the JSON
    file it writes its figures to; those figures, once every process ended well."""
    outs = [tmp_path / f"{uuid.uuid4().hex}.json" for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv, str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for out in outs]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=240)[0].decode(errors="replace"))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log[-3000:]
        # Claims are retried, never skipped: no run sent anything without one.
        assert "sending them anyway" not in log and "deadlock" not in log.lower(), log[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def run_processes(n: int, sim: SimulatedEndpoint, store_url: str, table: str, tmp_path
                  ) -> list[dict]:
    """``n`` processes over the same rows at once; each one's figures."""
    return run_at_once(WORKER, [sim.base_url, store_url, table, str(ROWS), str(CONCURRENCY)],
                       n, tmp_path)


def drop_tables(store_url: str, table: str) -> None:
    engine = sa.create_engine(normalize_store_url(store_url))
    try:
        with engine.begin() as conn:
            for suffix in ("_runs", "_claims", "_budgets", ""):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}{suffix}"')
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_four_processes_over_the_same_rows_on_postgresql_share_them(tmp_path, postgres_url):
    with SimulatedEndpoint(latency_s=0.1) as sim:
        alone_table = f"batchllm_alone_{uuid.uuid4().hex[:8]}"
        try:
            (alone,) = run_processes(1, sim, postgres_url, alone_table, tmp_path)
        finally:
            drop_tables(postgres_url, alone_table)
        sim.reset_stats()
        for attempt in range(2):
            table = f"batchllm_four_{uuid.uuid4().hex[:8]}"
            try:
                four = run_processes(4, sim, postgres_url, table, tmp_path)
            finally:
                drop_tables(postgres_url, table)
            server = sim.stats(log=False)
            sim.reset_stats()
            for got in four:  # every process ends with every row answered, right
                assert got["right"] == ROWS
                assert (got["stats"]["succeeded"], got["stats"]["failed"]) == (ROWS, 0)
            # Paid twice: at most what can be in flight at once (it was 1,482 to 1,735).
            assert server["duplicates"] <= CONCURRENCY, (attempt, server)
            assert sum(g["stats"]["requests"] for g in four) == server["ok"]
            # Every run sent a part: none waited for another to send everything.
            sent = sorted(g["stats"]["requests"] for g in four)
            assert sent[0] > 0, (attempt, sent)
            # About the time of one run, not four (it was 3.5x): the endpoint serves the
            # same requests at the same concurrency, shared.
            slowest = max(g["elapsed"] for g in four)
            assert slowest <= 1.5 * alone["elapsed"], (attempt, slowest, alone["elapsed"])
