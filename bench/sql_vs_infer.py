"""Throughput of ``ai_query`` in SQL against ``infer()`` on the same rows (target: >= 80%).

The same 5,000 distinct prompts go three ways to one simulated endpoint in its own process
(50 ms per request, 256 at a time): ``client.infer()`` on a DataFrame, ``ai_query`` in a DuckDB
query (vectorized UDF, 2048 rows per call) and ``ai_query`` on SQLite through the two-pass
``execute``. Every measurement gets a fresh ledger, so each sends all 5,000 requests; rounds
alternate the modes so that load from elsewhere on the machine hits them alike, and the median
round counts.

Run from the repository root::

    .venv/bin/python -m bench.sql_vs_infer           # --rows 5000 --rounds 3 --latency 0.05
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pandas as pd

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.sql import execute, register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
CONCURRENCY = 256
QUERY = f"SELECT id, ai_query('{MODEL}', text) AS reply FROM tickets ORDER BY id"


def tickets(rows: int) -> pd.DataFrame:
    return pd.DataFrame({
        "id": range(rows),
        "text": [f"Ticket {i}: the customer reports that order {i * 7 % 9973} arrived late"
                 for i in range(rows)],
    })


def fresh_client(sim: SimulatedEndpoint, workdir: Path, name: str) -> InferenceClient:
    store = workdir / f"{name}-{time.monotonic_ns()}.db"
    return InferenceClient(InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=(MODEL,),
                                max_concurrency=CONCURRENCY),),
        store_url=f"sqlite:///{store}", progress_interval_s=3600.0,
    ))


def run_infer(client: InferenceClient, df: pd.DataFrame) -> list[str]:
    result = client.infer(df, prompt_column="text", model=MODEL, output_column="reply")
    return result.df["reply"].tolist()


def run_duckdb(client: InferenceClient, df: pd.DataFrame) -> list[str]:
    con = duckdb.connect()
    try:
        con.register("tickets", df)
        with register_ai_functions(con, client):
            return [reply for _, reply in con.execute(QUERY).fetchall()]
    finally:
        con.close()


def run_sqlite(client: InferenceClient, df: pd.DataFrame) -> list[str]:
    con = sqlite3.connect(":memory:")
    try:
        df.to_sql("tickets", con, index=False)
        with register_ai_functions(con, client):
            return [reply for _, reply in execute(con, QUERY).fetchall()]
    finally:
        con.close()


MODES = {"infer()": run_infer, "DuckDB ai_query": run_duckdb, "SQLite ai_query": run_sqlite}


def measure(sim: SimulatedEndpoint, workdir: Path, mode: str, df: pd.DataFrame) -> float:
    client = fresh_client(sim, workdir, mode.split()[0].strip("()"))
    try:
        before = sim.stats(log=False)["requests"]
        started = time.perf_counter()
        replies = MODES[mode](client, df)
        elapsed = time.perf_counter() - started
        sent = sim.stats(log=False)["requests"] - before
    finally:
        client.close()
    if sent != len(df) or replies != [f"[sim] {t}" for t in df["text"]]:
        raise SystemExit(f"{mode}: sent {sent} requests for {len(df)} rows, or wrong replies")
    return len(df) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    df = tickets(args.rows)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp, SimulatedEndpoint(
            process=True, latency_s=args.latency, max_concurrency=CONCURRENCY) as sim:
        workdir = Path(tmp)
        for mode in MODES:  # warm-up: imports, first connections, the first DuckDB bind
            measure(sim, workdir, mode, tickets(300))
        for _ in range(args.rounds):
            for mode in MODES:
                rates[mode].append(measure(sim, workdir, mode, df))
    base = statistics.median(rates["infer()"])
    print(f"{args.rows} rows, {args.latency * 1000:.0f} ms per request, {CONCURRENCY} at a time, "
          f"median of {args.rounds} rounds")
    for mode, values in rates.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {mode:16s} {median:7.0f} rows/s  ({100 * median / base:5.1f}% of infer())  "
              f"rounds: {rounds}")
    ratio = statistics.median(rates["DuckDB ai_query"]) / base
    print(f"DuckDB ai_query / infer(): {100 * ratio:.1f}% (target >= 80%)")


if __name__ == "__main__":
    main()
