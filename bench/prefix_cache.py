"""Prefix-affinity routing against least-loaded, over simulated endpoints with prefix caches.

From the repository root::

    .venv/bin/python -m bench.prefix_cache            # 8,000 rows per run (about a minute)
    .venv/bin/python -m bench.prefix_cache --quick    # 2,000 rows per run, a smoke check

Four simulated endpoints (each its own process), each with vLLM's prefix cache
(``prefix_cache_tokens``, blocks of 16 tokens, see ``dagster_batchllm.simulator.prefix_cache``)
and a latency of ``--latency`` seconds plus ``--prefill-us`` microseconds per prompt token the
cache did not hold: a prompt's uncached 2,000 tokens cost 0.1 s at the default 50 us, about
what a 7-8B model's prefill costs on one GPU under load. Concurrency 32 per endpoint.

Two workloads, each run with ``prefix_affinity`` off (least-loaded, as before issue 32) and on,
side by side in one run, with the caches emptied between runs:

1. the issue's: every row shares one 2,000-token system instruction, a short ticket each;
2. eight instructions of 2,000 tokens (the system prompt from a column), rows interleaved:
   one endpoint's cache (``--cache-tokens``, 8,192 by default: a KV cache under pressure)
   holds about three of them with the rows' tails, the four together hold all eight.

Figures: rows/s; the cached share of input tokens at the servers (their
``stats()["prefix_cache"]``); the limit of that share (every instruction computed once, the
rows' own tokens never cached); the rows/s limit (concurrency over the latency with the
instruction cached). Targets (issue 32): >= 80% cached, throughput no more than 5% below
least-loaded.
"""

from __future__ import annotations

import argparse
import tempfile

import pandas as pd

from bench.timing import timed
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.simulator.prefix_cache import BLOCK_TOKENS
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
ENDPOINTS = 4
CONCURRENCY = 32  # per endpoint
INSTRUCTION_TOKENS = 2000


def instruction(n: int) -> str:
    """A 2,000-token (8,000-character) instruction, distinct for each ``n``."""
    words = f"Instruction set {n}: read the support ticket and answer with its urgency, "
    return (words * (INSTRUCTION_TOKENS * 4 // len(words) + 1))[:INSTRUCTION_TOKENS * 4]


def workload(rows: int, instructions: int, tag: str) -> pd.DataFrame:
    return pd.DataFrame({
        "instruction": [instruction(i % instructions) for i in range(rows)],
        "text": [f"{tag} ticket {i:07d}: the customer cannot open last month's invoice"
                 for i in range(rows)]})


def run_one(sims: list[SimulatedEndpoint], df: pd.DataFrame, instructions: int, affinity: bool,
            workdir: str, tag: str) -> dict:
    for sim in sims:  # an empty cache, zero counters
        cache_tokens = sim.stats(log=False)["prefix_cache"]["capacity_tokens"]
        sim.configure(prefix_cache_tokens=0)
        sim.configure(prefix_cache_tokens=cache_tokens)
        sim.reset_stats()
    settings = InferenceSettings(
        endpoints=tuple(EndpointSpec(name=f"sim{i}", base_url=sim.base_url, models=(MODEL,),
                                     max_concurrency=CONCURRENCY) for i, sim in enumerate(sims)),
        store_url=f"sqlite:///{workdir}/{tag}.db", progress_interval_s=3600.0,
        prefix_affinity=affinity)
    # One instruction: a literal system prompt (the usual call's path); eight: from a column.
    system = instruction(0) if instructions == 1 else "{instruction}"
    with InferenceClient(settings) as client:
        def run() -> None:
            result = client.infer(df, prompt="Ticket: {text}", system=system, model=MODEL,
                                  output_column="answer", max_tokens=16)
            assert result.stats.succeeded == len(df), result.stats.summary()

        figures = timed(run)
    caches = [sim.stats(log=False)["prefix_cache"] for sim in sims]
    prompt = sum(c["prompt_tokens"] for c in caches)
    cached = sum(c["cached_tokens"] for c in caches)
    per_row = prompt / len(df)
    shared = INSTRUCTION_TOKENS // BLOCK_TOKENS * BLOCK_TOKENS  # whole blocks of it
    return {"rows_s": len(df) / figures["wall_s"], "cached": cached / prompt,
            "limit": (len(df) - instructions) * shared / (len(df) * per_row),
            "spread": [c["requests"] for c in caches]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 rows per run")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per request")
    parser.add_argument("--prefill-us", type=float, default=50.0,
                        help="microseconds per prompt token not cached")
    parser.add_argument("--cache-tokens", type=int, default=8192, help="per endpoint")
    args = parser.parse_args()
    rows = args.rows or (2000 if args.quick else 8000)
    sims = [SimulatedEndpoint(process=True, latency_s=args.latency, max_concurrency=4096,
                              prefix_cache_tokens=args.cache_tokens,
                              prefill_s_per_token=args.prefill_us / 1e6)
            for _ in range(ENDPOINTS)]
    for sim in sims:
        sim.start()
    limit_rows_s = ENDPOINTS * CONCURRENCY / (args.latency + args.prefill_us / 1e6 * 30)
    print(f"{rows:,} rows per run, {ENDPOINTS} endpoints x concurrency {CONCURRENCY}, latency "
          f"{args.latency * 1000:g} ms + {args.prefill_us:g} us per uncached prompt token, "
          f"prefix cache {args.cache_tokens:,} tokens per endpoint; rows/s limit with the "
          f"instruction cached ~{limit_rows_s:,.0f}")
    print(f"{'workload':<26}{'routing':<14}{'rows/s':>8}{'cached':>9}{'limit':>8}"
          f"{'vs least-loaded':>17}   requests per endpoint")
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for instructions in (1, 8):
                name = ("1 instruction (issue 32)" if instructions == 1
                        else f"{instructions} instructions")
                df = workload(rows, instructions, f"w{instructions}")
                base = None
                for affinity in (False, True):
                    tag = f"w{instructions}-{'affinity' if affinity else 'least'}"
                    got = run_one(sims, df, instructions, affinity, workdir, tag)
                    base = base or got["rows_s"]
                    print(f"{name:<26}{'affinity' if affinity else 'least-loaded':<14}"
                          f"{got['rows_s']:>8,.0f}{got['cached']:>9.1%}{got['limit']:>8.1%}"
                          f"{got['rows_s'] / base:>16.2f}x   {got['spread']}", flush=True)
    finally:
        for sim in sims:
            sim.stop()


if __name__ == "__main__":
    main()
