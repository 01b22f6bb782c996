"""Two processes share one ledger (SQLite file, PostgreSQL table): both finish, no row is lost."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.ledger.stores import normalize_store_url
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.testing import SimulatedEndpoint

# One process = one Dagster run on one partition: rows [start, stop), results to a JSON file.
WORKER = """
import json, sys
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

base_url, store_url, table, start, stop, partition, out_path = sys.argv[1:8]
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="ep0", base_url=base_url, models=("sim-model",),
                            max_concurrency=16),),
    store_url=store_url, ledger_table=table, ledger_flush_rows=16,
    ledger_flush_interval_s=0.02, progress_interval_s=60.0, coordination_interval_s=0.1,
)
df = pd.DataFrame({"text": [f"shared row {i:05d}" for i in range(int(start), int(stop))]})
with InferenceClient(settings) as client:
    result = client.infer(df, prompt="Echo {text}", model="sim-model", output_column="out",
                          partition_key=partition)
with open(out_path, "w") as f:
    json.dump({"out": result.df["out"].tolist(), "errors": result.df["out_error"].tolist(),
               "stats": result.stats.as_dict()}, f)
"""

RANGES = {"p1": (0, 300), "p2": (150, 450)}  # 150 rows in common


def run_two_workers(sim: SimulatedEndpoint, store_url: str, table: str, tmp_path) -> dict:
    procs = {}
    for partition, (start, stop) in RANGES.items():
        out = tmp_path / f"{partition}.json"
        procs[partition] = (out, subprocess.Popen(
            [sys.executable, "-c", WORKER, sim.base_url, store_url, table, str(start),
             str(stop), partition, str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
    results = {}
    for partition, (out, proc) in procs.items():
        try:
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, stderr.decode()[-3000:]
        results[partition] = json.loads(out.read_text())
    return results


def check_nothing_lost(results: dict, ledger: Ledger, sim: SimulatedEndpoint) -> None:
    for partition, (start, stop) in RANGES.items():
        got = results[partition]
        assert got["out"] == [f"[sim] Echo shared row {i:05d}" for i in range(start, stop)]
        assert all(e is None for e in got["errors"])
        stats = got["stats"]
        assert (stats["succeeded"], stats["failed"], stats["deferred"]) == (stop - start, 0, 0)
        # Each partition has its own complete bookkeeping, rows shared with the other included.
        assert ledger.status_counts(partition_key=partition) == {
            "ok": stop - start, "failed": 0, "deferred": 0, "superseded": 0}
    records = ledger.records()
    assert records["request_key"].nunique() == 450
    assert (records["status"] == "ok").all()
    server = sim.stats(log=False)
    assert server["ok"] >= 450 and server["requests"] == server["ok"]
    # A shared row is paid twice only if both runs had it in flight at once.
    assert server["duplicates"] <= 150
    total_sent = sum(results[p]["stats"]["requests"] for p in RANGES)
    assert total_sent == server["ok"]
    assert sum(results[p]["stats"]["cached"] for p in RANGES) == 600 - total_sent


@pytest.mark.slow
def test_two_processes_share_one_sqlite_ledger_file(tmp_path):
    store_url = f"sqlite:///{tmp_path / 'shared.db'}"
    with SimulatedEndpoint(latency_s=0.005) as sim:
        results = run_two_workers(sim, store_url, "batchllm_requests", tmp_path)
        ledger = Ledger(store_url)
        try:
            check_nothing_lost(results, ledger, sim)
            with ledger.engine.connect() as conn:
                mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
            assert mode == "wal"
        finally:
            ledger.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_two_processes_share_one_postgresql_ledger_table(tmp_path, postgres_url):
    table = f"batchllm_test_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(normalize_store_url(postgres_url))
    try:
        with SimulatedEndpoint(latency_s=0.005) as sim:
            results = run_two_workers(sim, postgres_url, table, tmp_path)
            ledger = Ledger(postgres_url, table)
            try:
                assert ledger.engine.dialect.name == "postgresql"
                check_nothing_lost(results, ledger, sim)
            finally:
                ledger.dispose()
    finally:
        with engine.begin() as conn:
            for suffix in ("runs", "claims", "budgets"):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}_{suffix}"')
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}"')
        engine.dispose()
