"""Core throughput, client CPU per row and peak memory, against the simulated endpoint.

From the repository root::

    .venv/bin/python -m bench.core_throughput            # the full run (minutes on 2 cores)
    .venv/bin/python -m bench.core_throughput --quick    # smaller figures, for a smoke check

What it measures (the simulated server runs in its own process, so its CPU is not counted):

1. Throughput at 100 ms latency, concurrency 128, 5,000 rows: dagster-batchllm's ``infer`` (real
   SQLite ledger, default lean aiohttp transport) against a plain ``AsyncOpenAI`` +
   ``asyncio.Semaphore(128)`` loop sending the same requests. The theoretical limit is
   concurrency / latency = 1,280 rows/s. A bare aiohttp + semaphore loop (no ledger, no
   retries, nothing) shows what the machine and the simulated server allow at all.
2. Client CPU per row (``time.process_time``: every thread of this process, so the ledger
   writer thread counts too) at 100 ms and at zero latency, where CPU is the only limit.
3. Peak RSS (VmHWM, see ``peak_memory``) of a fresh subprocess that builds a table and runs
   ``infer`` over it at zero latency, for two table sizes: the growth of the peak over the
   resident size before the call (imports, table, ledger), less the output column it returns,
   per row, shows whether the engine's own memory is flat in the number of rows.

Targets (issue #2): >= 90% of the theoretical limit; <= 1 ms client CPU per row; memory flat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import pandas as pd

from bench.baselines import chat_loop
from bench.child import run_child, serve_child
from bench.peak_memory import peak_resident_mib, resident_bytes
from bench.timing import per_row, timed
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
MAX_TOKENS = 16


def frame(rows: int, tag: str) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{tag} ticket {i:07d}: the customer asks about an invoice"
                                  for i in range(rows)]})


def settings_for(base_url: str, concurrency: int, store_url: str, **overrides) -> InferenceSettings:
    return InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=base_url, models=(MODEL,),
                                max_concurrency=concurrency),),
        store_url=store_url, progress_interval_s=3600.0, **overrides,
    )


def run_batchllm(base_url: str, rows: int, concurrency: int, tag: str, workdir: str,
                 http_client: str = "aiohttp") -> dict:
    store_url = f"sqlite:///{workdir}/{tag}.db"
    df = frame(rows, tag)
    with InferenceClient(settings_for(base_url, concurrency, store_url,
                                      http_client=http_client)) as client:
        def run() -> None:
            result = client.infer(df, prompt="Summarize: {text}", model=MODEL,
                                  output_column="summary", max_tokens=MAX_TOKENS)
            assert result.stats.succeeded == rows, result.stats.summary()

        return {"rows": rows, **timed(run)}


def run_baseline(base_url: str, rows: int, concurrency: int, tag: str) -> dict:
    """``AsyncOpenAI`` + ``asyncio.Semaphore(concurrency)``, the same requests."""
    def run() -> None:
        prompts = [f"Summarize: {t}" for t in frame(rows, tag)["text"]]
        asyncio.run(chat_loop(base_url, lambda i: [{"role": "user", "content": prompts[i]}],
                              rows, model=MODEL, concurrency=concurrency,
                              max_tokens=MAX_TOKENS))

    return {"rows": rows, **timed(run)}


async def _raw_aiohttp(base_url: str, rows: int, concurrency: int, tag: str) -> None:
    import aiohttp

    semaphore = asyncio.Semaphore(concurrency)
    bodies = [json.dumps({"model": MODEL, "max_tokens": MAX_TOKENS, "messages": [
        {"role": "user", "content": f"Summarize: {t}"}]}).encode()
        for t in frame(rows, tag)["text"]]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(body: bytes) -> None:
            async with semaphore, session.post(
                    f"{base_url}/chat/completions", data=body,
                    headers={"Content-Type": "application/json"}) as response:
                reply = json.loads(await response.read())
                assert reply["choices"][0]["message"]["content"]

        await asyncio.gather(*(one(b) for b in bodies))


def run_raw_aiohttp(base_url: str, rows: int, concurrency: int, tag: str) -> dict:
    """The leanest client there is: what this machine and server allow at all."""
    return {"rows": rows, **timed(lambda: asyncio.run(_raw_aiohttp(base_url, rows, concurrency,
                                                                   tag)))}


def warm_up(base_url: str, concurrency: int, workdir: str) -> None:
    """Import and exercise every path once, so imports do not count as per-row CPU."""
    run_batchllm(base_url, 200, concurrency, "warm-a", workdir)
    run_batchllm(base_url, 50, concurrency, "warm-o", workdir, http_client="openai")
    run_baseline(base_url, 200, concurrency, "warm-b")
    run_raw_aiohttp(base_url, 200, concurrency, "warm-r")


# -- peak memory, in a fresh subprocess ---------------------------------------------------------
def rss_child(base_url: str, rows: int, concurrency: int) -> dict:
    """Runs in the fresh subprocess (``measure_rss``)."""
    with tempfile.TemporaryDirectory() as workdir:
        df = frame(rows, f"rss{rows}")
        settings = settings_for(base_url, concurrency, f"sqlite:///{workdir}/rss.db")
        with InferenceClient(settings) as client:
            client.ledger  # noqa: B018 - open it before the baseline figure
            import aiohttp  # noqa: F401 - imported by the run; not a per-row cost

            before = resident_bytes() / 2**20  # the table and every import are in already
            wall0 = time.perf_counter()
            result = client.infer(df, prompt="Summarize: {text}", model=MODEL,
                                  output_column="summary", max_tokens=MAX_TOKENS)
            wall = time.perf_counter() - wall0
            assert result.stats.succeeded == rows
            result_bytes = int(result.df["summary"].map(sys.getsizeof).sum()) + 8 * rows
    # VmHWM: ru_maxrss would be the parent's after exec
    return {"rows": rows, "rss_before_mib": before, "rss_peak_mib": peak_resident_mib(),
            "result_column_mib": result_bytes / 2**20, "wall_s": wall}


def measure_rss(base_url: str, rows: int, concurrency: int) -> dict:
    return run_child("bench.core_throughput", base_url=base_url, rows=rows,
                     concurrency=concurrency)


# -- report -------------------------------------------------------------------------------------
def row(name: str, figures: dict, limit: float | None) -> str:
    rate, cpu_ms = per_row(figures)
    share = f"{100 * rate / limit:6.1f}%" if limit else "      -"
    return (f"  {name:<44} {figures['rows']:>7} {figures['wall_s']:>8.2f} {rate:>9.0f} "
            f"{share:>8} {cpu_ms:>9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--cpu-rows", type=int, default=5000, help="rows for the 0-latency runs")
    parser.add_argument("--rss-rows", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--quick", action="store_true", help="small figures, for a smoke check")
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.cpu_rows, args.rss_rows = 1500, 1500, [5_000, 20_000]

    limit = args.concurrency / args.latency
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f} "
          f"(other work on the machine lowers every figure)")
    with SimulatedEndpoint(process=True, latency_s=args.latency, max_concurrency=256) as sim, \
            tempfile.TemporaryDirectory() as workdir:
        warm_up(sim.base_url, args.concurrency, workdir)
        results = {
            "batchllm": run_batchllm(sim.base_url, args.rows, args.concurrency, "lat-a",
                                     workdir),
            "baseline": run_baseline(sim.base_url, args.rows, args.concurrency, "lat-b"),
            "raw": run_raw_aiohttp(sim.base_url, args.rows, args.concurrency, "lat-r"),
        }
        sim.configure(latency_s=0.0)
        results["batchllm0"] = run_batchllm(sim.base_url, args.cpu_rows, args.concurrency,
                                            "zero-a", workdir)
        results["baseline0"] = run_baseline(sim.base_url, args.cpu_rows, args.concurrency,
                                            "zero-b")
        results["openai0"] = run_batchllm(sim.base_url, args.cpu_rows, args.concurrency,
                                          "zero-o", workdir, http_client="openai")
        rss = [] if args.skip_rss else [measure_rss(sim.base_url, n, args.concurrency)
                                         for n in args.rss_rows]

    a, b = results["batchllm"], results["baseline"]
    rate_a, rate_b = a["rows"] / a["wall_s"], b["rows"] / b["wall_s"]
    print()
    print(f"Throughput and client CPU (concurrency {args.concurrency}, server 256 slots)")
    print(f"  {'run':<44} {'rows':>7} {'wall s':>8} {'rows/s':>9} {'of limit':>8} "
          f"{'CPU ms/row':>9}")
    print(row(f"batchllm infer, latency {args.latency * 1000:.0f} ms", a, limit))
    print(row(f"AsyncOpenAI + Semaphore, latency {args.latency * 1000:.0f} ms", b, limit))
    print(row(f"bare aiohttp + Semaphore (ceiling), {args.latency * 1000:.0f} ms",
              results["raw"], limit))
    print(row("batchllm infer, latency 0", results["batchllm0"], None))
    print(row("AsyncOpenAI + Semaphore, latency 0", results["baseline0"], None))
    print(row("batchllm infer (http_client='openai'), lat. 0", results["openai0"], None))
    rate_raw = results["raw"]["rows"] / results["raw"]["wall_s"]
    print(f"  theoretical limit: {limit:.0f} rows/s; batchllm / baseline: {rate_a / rate_b:.2f}x "
          f"rows/s at {args.latency * 1000:.0f} ms; batchllm / bare aiohttp: "
          f"{rate_a / rate_raw:.2f}x")
    cpu_a = 1000 * results["batchllm0"]["cpu_s"] / results["batchllm0"]["rows"]
    cpu_b = 1000 * results["baseline0"]["cpu_s"] / results["baseline0"]["rows"]
    print(f"  client CPU per row at latency 0: batchllm {cpu_a:.3f} ms, baseline {cpu_b:.3f} ms "
          f"({cpu_b / cpu_a:.1f}x less)")
    if rss:
        print()
        print("Peak memory of infer() in a fresh process (latency 0)")
        print(f"  {'rows':>8} {'RSS before':>11} {'RSS peak':>9} {'growth':>8} "
              f"{'results':>8} {'wall s':>7}")
        for r in rss:
            growth = r["rss_peak_mib"] - r["rss_before_mib"]
            print(f"  {r['rows']:>8} {r['rss_before_mib']:>9.1f}Mi {r['rss_peak_mib']:>7.1f}Mi "
                  f"{growth:>6.1f}Mi {r['result_column_mib']:>6.1f}Mi {r['wall_s']:>7.1f}")
        print("  (RSS before: imports, the input table, an open ledger; growth: peak - before; "
              "results: the output column's strings and pointers, returned to the caller)")
        if len(rss) >= 2:
            small, large = rss[0], rss[-1]
            rows = large["rows"] - small["rows"]
            growth = ((large["rss_peak_mib"] - large["rss_before_mib"])
                      - (small["rss_peak_mib"] - small["rss_before_mib"])) * 2**20 / rows
            results = (large["result_column_mib"] - small["result_column_mib"]) * 2**20 / rows
            print(f"  from {small['rows']:,} to {large['rows']:,} rows the peak grows "
                  f"{growth:.0f} B per extra row, of which the returned results {results:.0f} B: "
                  f"the engine itself adds {growth - results:.0f} B per row")
    print()
    share = 100 * rate_a / limit
    print("Targets: throughput >= 90% of the limit: "
          f"{'met' if share >= 90 else 'MISSED'} ({share:.1f}%); client CPU <= 1 ms/row: "
          f"{'met' if cpu_a <= 1.0 else 'MISSED'} ({cpu_a:.3f} ms)")


if __name__ == "__main__" and not serve_child(rss_child):
    main()
