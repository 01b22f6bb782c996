"""Embeddings throughput, client CPU and peak memory per row, against the simulated endpoint.

From the repository root::

    .venv/bin/python -m bench.embeddings            # the issue's run: 100,000 texts (minutes)
    .venv/bin/python -m bench.embeddings --quick    # 10,000 texts, for a smoke check

The simulated endpoint runs in its own process (its CPU is not counted): 384 dimensions, 50 ms
per request whatever its size (up to 128 inputs), and the client side keeps 64 requests in
flight. Printed side by side:

1. ``llm.embed`` (64 inputs per request, real SQLite ledger, base64 vectors) against
   ``AsyncOpenAI`` + ``asyncio.Semaphore(64)`` with one input per request, and against
   ``AsyncOpenAI`` with 64 inputs per request, the script a careful user writes (vectors into
   a float32 matrix). The theoretical limit is concurrency x inputs per request / latency.
   The one-input baseline runs over ``--single-rows`` texts (its rate is steady; 100,000
   requests would take minutes of CPU).
2. Client CPU per row (``time.process_time``: every thread of this process).
3. Peak RSS growth per row (VmHWM, see ``peak_memory``) of a fresh subprocess that builds the
   table and embeds it, at two sizes, against the raw float32 size of a vector.
4. The rerun, answered from the ledger: its requests (0) and wall time.

Targets (issue #14): >= 20x the one-input baseline, >= 1.0x the 64-input one; <= 0.05 ms CPU
per row; peak RSS growth <= 1.5 x 4 x 384 + 200 bytes per row.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

import numpy as np
import pandas as pd

from bench.child import run_child, serve_child
from bench.peak_memory import peak_resident_bytes, resident_bytes
from bench.timing import per_row, timed
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-embed"
DIMENSIONS = 384
LATENCY_S = 0.05
CONCURRENCY = 64
PER_REQUEST = 64


def texts(rows: int, tag: str) -> list[str]:
    return [f"{tag} call {i:07d}: the customer asks for a refund of a broken lamp"
            for i in range(rows)]


def settings_for(base_url: str, store_url: str) -> InferenceSettings:
    return InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=base_url, embedding_models=(MODEL,),
                                max_concurrency=CONCURRENCY),),
        store_url=store_url, progress_interval_s=3600.0)


def run_batchllm(base_url: str, rows: int, tag: str, workdir: str) -> tuple[dict, dict]:
    """The first run and the rerun from the ledger."""
    df = pd.DataFrame({"text": texts(rows, tag)})
    with InferenceClient(settings_for(base_url, f"sqlite:///{workdir}/{tag}.db")) as client:
        def once() -> dict:
            result = client.embed(df, input_column="text", model=MODEL,
                                  inputs_per_request=PER_REQUEST)
            assert result.stats.succeeded == rows, result.stats.summary()
            assert result.df["embedding"].iloc[0].shape == (DIMENSIONS,)
            return {"rows": rows, "requests": result.stats.requests}

        return timed(once), timed(once)


async def _openai(base_url: str, inputs: list[str], per_request: int) -> np.ndarray:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    semaphore = asyncio.Semaphore(CONCURRENCY)
    out = np.empty((len(inputs), DIMENSIONS), dtype=np.float32)

    async def one(start: int) -> None:
        async with semaphore:
            reply = await client.embeddings.create(
                model=MODEL, input=inputs[start:start + per_request])
        out[start:start + len(reply.data)] = [d.embedding for d in reply.data]

    await asyncio.gather(*(one(s) for s in range(0, len(inputs), per_request)))
    await client.close()
    return out


def run_openai(base_url: str, rows: int, per_request: int, tag: str) -> dict:
    inputs = texts(rows, tag)

    def once() -> dict:
        matrix = asyncio.run(_openai(base_url, inputs, per_request))
        assert matrix.shape == (rows, DIMENSIONS) and abs(np.linalg.norm(matrix[-1]) - 1) < 1e-4
        return {"rows": rows, "requests": -(-rows // per_request)}

    return timed(once)


# -- peak memory, in a fresh subprocess ---------------------------------------------------------
def rss_child(base_url: str, rows: int) -> dict:
    """Runs in the fresh subprocess (``measure_rss``)."""
    with tempfile.TemporaryDirectory() as workdir:
        df = pd.DataFrame({"text": texts(rows, f"rss{rows}")})
        with InferenceClient(settings_for(base_url, f"sqlite:///{workdir}/rss.db")) as client:
            client.embed(df.head(200), input_column="text", model=MODEL)  # imports, warm
            before = resident_bytes()
            result = client.embed(df, input_column="text", model=MODEL,
                                  inputs_per_request=PER_REQUEST)
            assert result.stats.succeeded == rows
    return {"rows": rows, "before": before, "peak": peak_resident_bytes()}


def measure_rss(base_url: str, rows: int) -> dict:
    return run_child("bench.embeddings", base_url=base_url, rows=rows)


# -- report -------------------------------------------------------------------------------------
def line(name: str, figures: dict, limit: float) -> str:
    rate, cpu_ms = per_row(figures)
    return (f"  {name:<46} {figures['rows']:>7} {figures['requests']:>8} "
            f"{figures['wall_s']:>8.2f} {rate:>9.0f} {100 * rate / limit:>6.1f}% {cpu_ms:>8.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--single-rows", type=int, default=5_000,
                        help="texts for the one-input-per-request baseline")
    parser.add_argument("--rss-rows", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.single_rows, args.rss_rows = 10_000, 1_000, [5_000, 10_000]

    with SimulatedEndpoint(models=None, embedding_models=(MODEL,), process=True,
                           embedding_dimensions=DIMENSIONS, max_inputs_per_request=128,
                           latency_s=LATENCY_S, max_concurrency=256) as sim, \
            tempfile.TemporaryDirectory() as workdir:
        base = sim.base_url
        run_batchllm(base, 500, "warm", workdir)  # imports and connections, not per-row costs
        run_openai(base, 500, PER_REQUEST, "warm")
        ours, rerun = run_batchllm(base, args.rows, "main", workdir)
        grouped = run_openai(base, args.rows, PER_REQUEST, "grouped")
        single = run_openai(base, args.single_rows, 1, "single")
        memory = [measure_rss(base, rows) for rows in args.rss_rows]

    limit_grouped = CONCURRENCY * PER_REQUEST / LATENCY_S
    limit_single = CONCURRENCY / LATENCY_S
    print(f"\n{args.rows:,} texts, {DIMENSIONS} dims, {LATENCY_S * 1000:.0f} ms per request, "
          f"concurrency {CONCURRENCY}; limits: {limit_grouped:,.0f} rows/s at {PER_REQUEST} "
          f"inputs per request, {limit_single:,.0f} at one\n")
    print(f"  {'':<46} {'rows':>7} {'requests':>8} {'wall s':>8} {'rows/s':>9} "
          f"{'limit':>7} {'CPU ms/row':>8}")
    print(line("llm.embed, 64 inputs/request (ledger, base64)", ours, limit_grouped))
    print(line("AsyncOpenAI + semaphore, 64 inputs/request", grouped, limit_grouped))
    print(line("AsyncOpenAI + semaphore, 1 input/request", single, limit_single))
    rate, cpu_ms = per_row(ours)
    print(f"\n  llm.embed vs 1 input/request:  {rate / per_row(single)[0]:.1f}x (target >= 20x)")
    print(f"  llm.embed vs 64 inputs/request: {rate / per_row(grouped)[0]:.2f}x "
          "(target >= 1.0x)")
    print(f"  client CPU per row: {cpu_ms:.4f} ms (target <= 0.05)")
    print(f"  rerun from the ledger: {rerun['requests']} requests, {rerun['wall_s']:.2f} s "
          f"({rerun['rows'] / rerun['wall_s']:,.0f} rows/s)")
    raw = 4 * DIMENSIONS
    target = 1.5 * raw + 200
    for figures in memory:
        growth = (figures["peak"] - figures["before"]) / figures["rows"]
        print(f"  peak RSS growth, {figures['rows']:,} rows: {growth:,.0f} bytes/row "
              f"({growth / raw:.2f}x the {raw}-byte vector; target <= {target:,.0f})")
    if len(memory) == 2:
        (a, b) = memory
        slope = ((b["peak"] - b["before"]) - (a["peak"] - a["before"])) / (b["rows"] - a["rows"])
        print(f"  between the two sizes: {slope:,.0f} bytes per extra row")


if __name__ == "__main__" and not serve_child(rss_child):
    main()
