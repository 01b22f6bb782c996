"""How many of Databricks' documented AI-function examples run as written, engine by engine.

Every example of :mod:`dagster_batchllm.testing.databricks.documented` (SQL copied from
Databricks' pages, each with its source) runs on DuckDB and SQLite through
``execute(..., dialect="databricks")`` and in Spark SQL as written, against a simulated endpoint
serving the endpoints the examples name. The table shows, per engine: translated (DuckDB/SQLite
only; Spark reads Databricks SQL itself), ran, and whether the result types match the documented
ones; then the counts, and why each example that did not run as documented did not.

Run from the repository root::

    .venv/bin/python -m bench.sql_compat             # --no-spark: skip Spark (a JVM)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint
from dagster_batchllm.testing.databricks.compat import (
    ExampleRun,
    run_on_duckdb,
    run_on_sqlite,
    sample_frames,
    transcripts_frame,
)
from dagster_batchllm.testing.databricks.documented import EXAMPLES, SERVED_MODELS

DATASET = Path(__file__).resolve().parents[1] / "assets" / "data" / "call_center_transcripts.csv.gz"


def settings_for(sim: SimulatedEndpoint, store: Path) -> InferenceSettings:
    return InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=SERVED_MODELS,
                                max_concurrency=64),),
        store_url=f"sqlite:///{store}", default_model=SERVED_MODELS[0],
        progress_interval_s=3600.0)


def spark_runs(settings: InferenceSettings, tables: dict) -> list[ExampleRun]:
    from pyspark.sql import SparkSession

    from dagster_batchllm.spark import register_ai_functions
    from dagster_batchllm.testing.databricks.spark_compat import run_on_spark

    spark = (SparkSession.builder.master("local[2]").appName("sql-compat")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    try:
        register_ai_functions(spark, settings)
        return [run_on_spark(spark, example, tables) for example in EXAMPLES]
    finally:
        spark.stop()


def cell(run: ExampleRun | None) -> str:
    """translated / ran / types, as ``y``, ``n`` or ``-`` (not applicable)."""
    if run is None:
        return "   (skipped)   "
    marks = ["-" if run.translated is None else "y" if run.translated else "n",
             "y" if run.ran else "n",
             "-" if run.types_match is None else "y" if run.types_match else "n"]
    return "    ".join(marks).center(15)


def documented_type(example) -> str:
    """The documented result type(s), STRUCTs shortened to their field count."""
    shown = []
    for ddl in example.result_types.values():
        short = (f"STRUCT({ddl.count(':')} fields)" if ddl.startswith("STRUCT") else ddl)
        if short not in shown:
            shown.append(short)
    return ", ".join(shown) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-spark", action="store_true", help="skip Spark SQL")
    args = parser.parse_args()

    tables = sample_frames({"call_center_transcripts": transcripts_frame(DATASET)})
    engines = ["duckdb", "sqlite"] + ([] if args.no_spark else ["spark"])
    runs: dict[str, dict[str, ExampleRun]] = {e.name: {} for e in EXAMPLES}
    with tempfile.TemporaryDirectory() as workdir, \
            SimulatedEndpoint(models=SERVED_MODELS) as sim:
        # One ledger per engine, so each engine really asks the endpoint.
        for engine, run in (("duckdb", run_on_duckdb), ("sqlite", run_on_sqlite)):
            client = InferenceClient(settings_for(sim, Path(workdir) / f"{engine}.db"))
            try:
                for example in EXAMPLES:
                    runs[example.name][engine] = run(example, client, tables)
            finally:
                client.close()
        if "spark" in engines:
            settings = settings_for(sim, Path(workdir) / "spark.db")
            for example_run in spark_runs(settings, tables):
                runs[example_run.example]["spark"] = example_run

    width = max(len(e.name) for e in EXAMPLES)
    header = "".join(f"{name:^17}" for name in ("DuckDB", "SQLite", "Spark SQL")[:len(engines)])
    print(f"{'documented example':<{width}}  {'documented type':<16}{header}")
    print(f"{'':<{width}}  {'':<16}" + "".join(f"{'trans ran type':^17}" for _ in engines))
    for example in EXAMPLES:
        print(f"{example.name:<{width}}  {documented_type(example):<16}"
              + "".join(f"{cell(runs[example.name].get(e)):^17}" for e in engines))
    print()
    total = len(EXAMPLES)
    for engine in engines:
        done = [r for r in (runs[e.name][engine] for e in EXAMPLES)]
        translated = sum(1 for r in done if r.translated)
        ran = sum(1 for r in done if r.ran)
        documented = sum(1 for r in done if r.as_documented)
        limited = sum(1 for e in EXAMPLES if e.limitation)
        print(f"{engine:>7}: {documented} of {total} run as documented (ran {ran}, translated "
              f"{translated if engine != 'spark' else '-'}); {limited} ask for what no engine "
              "here has")
    print("\nWhy the others did not run as documented:")
    for example in EXAMPLES:
        for engine in engines:
            run = runs[example.name][engine]
            if run.as_documented:
                continue
            why = run.error or f"result types {dict(run.types)} vs {dict(example.result_types)}"
            print(f"  {example.name} [{engine}]: {why}")
            if example.limitation:
                print(f"    (documented limitation: {example.limitation})")
    print("\nSources:")
    for example in EXAMPLES:
        print(f"  {example.name}: {example.title} {example.url}".rstrip())


if __name__ == "__main__":
    main()
