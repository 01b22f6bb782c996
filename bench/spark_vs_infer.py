"""Throughput of ``ai_query`` on Spark local[2] against ``infer()`` and against the naive pattern.

The same 5,000 distinct prompts go three ways to one simulated endpoint in its own process
(50 ms per request, 256 at a time):

* ``infer()``: ``InferenceClient.infer`` on a pandas DataFrame, in this process;
* Spark: ``SELECT ai_query(...)`` through :func:`dagster_batchllm.spark.register_ai_functions`
  on ``local[2]`` (two tasks, each handing its Arrow batch to ``infer`` with half the
  endpoint's concurrency);
* naive: what people write first, a synchronous ``openai`` call per row inside
  ``mapInPandas`` (two tasks, so two requests in flight).

Every measurement gets a fresh ledger, so each sends all rows. The Spark session and its
Python workers are started (and warmed on a few other rows) before the clock runs: the figures
compare throughput, not JVM start-up. ``infer()`` and Spark alternate over ``--rounds`` and the
median counts; the naive pattern, slow by construction, runs once.

Run from the repository root::

    .venv/bin/python -m bench.spark_vs_infer         # --rows 5000 --rounds 3 --latency 0.05
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import pandas as pd

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
CONCURRENCY = 256
MAX_TOKENS = 64
QUERY = f"SELECT id, ai_query('{MODEL}', text, modelParameters => " \
        f"named_struct('max_tokens', {MAX_TOKENS})) AS reply FROM tickets"


def tickets(rows: int, offset: int = 0) -> pd.DataFrame:
    ids = range(offset, offset + rows)
    return pd.DataFrame({
        "id": list(ids),
        "text": [f"Ticket {i}: the customer reports that order {i * 7 % 9973} arrived late"
                 for i in ids],
    })


def settings(sim: SimulatedEndpoint, workdir: Path, name: str) -> InferenceSettings:
    store = workdir / f"{name}-{time.monotonic_ns()}.db"
    return InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=(MODEL,),
                                max_concurrency=CONCURRENCY),),
        store_url=f"sqlite:///{store}", progress_interval_s=3600.0,
    )


def start_spark():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("spark_vs_infer")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def load(spark, df: pd.DataFrame) -> None:
    """The input as a cached two-partition view, so reading it is not what is measured."""
    frame = spark.createDataFrame(df).repartition(2).cache()
    frame.count()
    frame.createOrReplaceTempView("tickets")


# -- the three ways ------------------------------------------------------------------------------
def run_infer(sim, workdir, df) -> tuple[float, int]:
    with InferenceClient(settings(sim, workdir, "infer")) as client:
        started = time.perf_counter()
        result = client.infer(df, prompt_column="text", model=MODEL, output_column="reply",
                              max_tokens=MAX_TOKENS)
        elapsed = time.perf_counter() - started
    return elapsed, int(result.df["reply"].notna().sum())


def run_spark(spark, sim, workdir) -> tuple[float, int]:
    """``ai_query`` over the ``tickets`` view."""
    register_ai_functions(spark, settings(sim, workdir, "spark"))
    started = time.perf_counter()
    replies = spark.sql(QUERY).collect()
    elapsed = time.perf_counter() - started
    return elapsed, sum(r.reply is not None for r in replies)


def run_naive(spark, sim, df) -> tuple[float, int]:
    base_url = sim.base_url

    def per_row(batches):
        import openai

        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=2)
        for pdf in batches:
            replies = []
            for text in pdf["text"]:
                reply = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": text}],
                    max_tokens=MAX_TOKENS)
                replies.append(reply.choices[0].message.content)
            yield pd.DataFrame({"id": pdf["id"], "reply": replies})

    started = time.perf_counter()
    replies = spark.table("tickets").mapInPandas(per_row, "id long, reply string").collect()
    elapsed = time.perf_counter() - started
    return elapsed, sum(r.reply is not None for r in replies)


# -- the report ----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--skip-naive", action="store_true",
                        help="leave out the naive pattern (it takes rows * latency / 2 s)")
    args = parser.parse_args()

    df = tickets(args.rows)
    spark = start_spark()
    times: dict[str, list[float]] = {"infer": [], "spark": []}
    with tempfile.TemporaryDirectory() as tmp, SimulatedEndpoint(
            models=(MODEL,), latency_s=args.latency, max_concurrency=CONCURRENCY,
            process=True) as sim:
        workdir = Path(tmp)
        load(spark, tickets(200, offset=10**6))
        run_spark(spark, sim, workdir)  # starts and warms the Python workers
        load(spark, df)
        for round_ in range(args.rounds):
            order = ("infer", "spark") if round_ % 2 == 0 else ("spark", "infer")
            for mode in order:
                sim.reset_stats()
                elapsed, ok = (run_infer(sim, workdir, df) if mode == "infer"
                               else run_spark(spark, sim, workdir))
                sent = sim.stats(log=False)["requests"]
                print(f"round {round_ + 1} {mode:>5}: {elapsed:6.2f} s, {ok} ok, {sent} sent")
                times[mode].append(elapsed)
        if not args.skip_naive:
            sim.reset_stats()
            elapsed, ok = run_naive(spark, sim, df)
            print(f"naive (one round): {elapsed:6.2f} s, {ok} ok, "
                  f"{sim.stats(log=False)['requests']} sent")
            times["naive"] = [elapsed]
    spark.stop()

    rate = {mode: args.rows / statistics.median(t) for mode, t in times.items()}
    load_avg = os.getloadavg()[0]
    print(f"\n{args.rows} rows, {args.latency * 1000:.0f} ms per request, endpoint concurrency "
          f"{CONCURRENCY}, {os.cpu_count()} CPUs (load average {load_avg:.1f})")
    for mode, value in rate.items():
        print(f"  {mode:>5}: {value:8.1f} rows/s")
    print(f"  spark / infer: {rate['spark'] / rate['infer']:.2f}")
    if "naive" in rate:
        print(f"  spark / naive: {rate['spark'] / rate['naive']:.1f}x")
        print(f"  infer / naive: {rate['infer'] / rate['naive']:.1f}x")


if __name__ == "__main__":
    main()
