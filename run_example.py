"""Materialize the example pipeline for one day, headless, then show what it wrote.

    .venv/bin/python run_example.py [--partition 2026-11-05]

Runs the real ``dagster asset materialize`` CLI (the same code path as the UI) against the
embedded default endpoint unless BATCHLLM_ENDPOINTS points at real LLM servers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The executable assets of group call_center (the raw source table is an external asset).
PIPELINE = ("cleaned_transcripts", "transcript_summaries", "classified_transcripts")
# Where an embedding model is served (the embedded default's local-embedder, or one named by
# BATCHLLM_EMBEDDING_MODEL): the transcripts' vectors and the similar calls they find.
EMBEDDINGS = ("transcript_embeddings", "similar_high_risk_calls")


def _with_embeddings(env: dict[str, str]) -> bool:
    return not env.get("BATCHLLM_ENDPOINTS") or bool(env.get("BATCHLLM_EMBEDDING_MODEL"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partition", default="2026-11-05", help="the day to materialize")
    args = parser.parse_args()
    env = dict(os.environ)
    # The Dagster instance: the user's DAGSTER_HOME, else the one ./dagster.yaml configures
    # (data/dagster_home; the CLI reads it as it runs in ROOT). `dagster dev -w workspace.yaml`
    # started in ROOT opens the same one, so the UI shows the runs made here.
    # `dagster asset materialize` still works in Dagster 1.13 but warns that `dg launch` (which
    # needs a dg project layout) supersedes it: the user did not cause that warning.
    env["PYTHONWARNINGS"] = ",".join(filter(None, [
        env.get("PYTHONWARNINGS"), "ignore:Function `asset_materialize_command` is superseded"]))
    dagster = Path(sys.executable).with_name("dagster")
    # Asset keys rather than group:call_center, whose selection path warns about a beta option.
    command = [str(dagster), "asset", "materialize", "-f", "definitions.py",
               "--select", ",".join(PIPELINE + (EMBEDDINGS if _with_embeddings(env) else ())),
               "--partition", args.partition]
    print("$", " ".join(command[1:]), flush=True)
    completed = subprocess.run(command, cwd=ROOT, env=env)
    if completed.returncode != 0:
        print(f"dagster asset materialize failed (exit {completed.returncode})", file=sys.stderr)
        return completed.returncode
    show_results(args.partition, similar_calls=_with_embeddings(env))
    return 0


def show_results(partition: str, similar_calls: bool = False) -> None:
    import pandas as pd

    sys.path.insert(0, str(ROOT))
    from resources import build_llm_resource, build_resources

    warehouse = build_resources()["warehouse"]
    ledger_url = build_llm_resource().store_url
    table = warehouse.read_partition("classified_transcripts", partition)
    ok = table["classification_error"].isna() & table["summary_error"].isna()
    print(f"\nWarehouse: {warehouse.display_url}")
    print("Tables: call_center_transcripts, cleaned_transcripts, transcript_summaries, "
          "classified_transcripts (column call_date holds the partition)")
    print(f"Ledger:    {ledger_url}")
    print(f"\n{partition}: {len(table)} calls, {int(ok.sum())} classified, "
          f"{int((~ok).sum())} with a per-row error (null/empty transcripts)\n")
    columns = ["call_id", "risk_level", "action_required", "rule_risk_level",
               "rule_action_required", "summary"]
    with pd.option_context("display.max_colwidth", 70, "display.width", 200):
        print(table.loc[ok, columns].head(8).to_string(index=False))
    failed = table.loc[~ok, ["call_id", "summary_error"]].head(3)
    if len(failed):
        print("\nPer-row errors are data, not crashes:")
        print(failed.to_string(index=False))
    if similar_calls:
        show_similar_calls(partition)
    print("\nOpen the UI: .venv/bin/dagster dev -w workspace.yaml  (http://127.0.0.1:3000)")


def show_similar_calls(partition: str) -> None:
    from resources import build_resources

    similar = build_resources()["warehouse"].read_partition("similar_high_risk_calls", partition)
    print(f"\ntranscript_embeddings -> similar_high_risk_calls: for {similar.call_id.nunique()} "
          "High-risk calls, the most similar earlier calls of the day (DuckDB, "
          "list_cosine_similarity):")
    columns = ["call_id", "action_required", "similarity_rank", "similar_call_id",
               "similar_action_required", "similarity"]
    print(similar[columns].head(6).round(3).to_string(index=False))


if __name__ == "__main__":
    sys.exit(main())
