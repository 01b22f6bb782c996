"""The example pipeline for one day in batch mode (BATCHLLM_BATCH_API=1) gives the same rows and
answers as online mode: the real ``dagster asset materialize`` CLI, the example code location,
a simulated endpoint speaking both the online and the Files + Batches API."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dagster_batchllm.testing import SimulatedEndpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-11-05"
PIPELINE = "cleaned_transcripts,transcript_summaries,classified_transcripts"


def materialize_day(sim: SimulatedEndpoint, where: Path, **extra_env: str) -> pd.DataFrame:
    where.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
    env.update(BATCHLLM_ENDPOINTS=sim.base_url, BATCHLLM_MODEL="llama-70b",
               BATCHLLM_WAREHOUSE_URL=f"sqlite:///{where / 'warehouse.db'}",
               BATCHLLM_STORE_URL=f"sqlite:///{where / 'ledger.db'}",
               PYTHONPATH=str(REPO_ROOT), **extra_env)
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-f",
         "definitions.py", "--select", PIPELINE, "--partition", DAY],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    with sqlite3.connect(where / "warehouse.db") as conn:
        table = pd.read_sql("SELECT * FROM classified_transcripts", conn)
    return table.sort_values("call_id").reset_index(drop=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_example_day_in_batch_mode_matches_online(tmp_path):
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        online = materialize_day(sim, tmp_path / "online")
        assert sim.stats(log=False)["batches"]["batches_created"] == 0
        batch = materialize_day(sim, tmp_path / "batch", BATCHLLM_BATCH_API="1")
        batches = sim.stats(log=False)["batches"]
    assert batches["batches_created"] == 2  # the summaries, then the classifications
    assert batches["line_duplicates"] == 0
    assert len(online) == len(batch) > 0
    compared = [c for c in online.columns if c not in ("materialized_at",)]
    pd.testing.assert_frame_equal(online[compared], batch[compared])
    assert batch["summary"].notna().sum() > 0.9 * len(batch)
