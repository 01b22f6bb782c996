"""The example location's traditional models, end to end with the real CLI: the training asset
registers TF-IDF + logistic regression models in a local MLflow registry (alias champion), the
scoring assets score a day in process (one model, and one per agent team), and the champion
served by `mlflow models serve` on 127.0.0.1 gives the same predictions through the pool."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("mlflow")
pytest.importorskip("sklearn")

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import ModelServer

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DAY = "2026-11-09"  # a day after the training week


def _materialize(env: dict, *select: str, partition: str | None = None,
                 fails: bool = False) -> str:
    command = [str(BIN / "dagster"), "asset", "materialize", "-f", "definitions.py",
               "--select", ",".join(select)]
    if partition:
        command += ["--partition", partition]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert (done.returncode != 0) == fails, (done.stdout + done.stderr)[-4000:]
    return done.stdout + done.stderr


def _environment(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
    env.update(BATCHLLM_WAREHOUSE_URL=f"sqlite:///{tmp / 'warehouse.db'}",
               BATCHLLM_STORE_URL=f"sqlite:///{tmp / 'ledger.db'}",
               BATCHLLM_MLFLOW_DIR=str(tmp / "mlflow"), DAGSTER_HOME=str(tmp),
               MLFLOW_DISABLE_TELEMETRY="true")
    return env


@pytest.fixture(scope="module")
def location(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example_ml")
    env = _environment(tmp)
    # One run on a fresh registry: the training and the champion's observation open it at
    # once, in two step processes (MLflow's migrations must run once).
    _materialize(env, "action_required_models", "action_required_champion")
    _materialize(env, "cleaned_transcripts,predicted_actions,predicted_actions_by_team",
                 partition=DAY)
    return tmp


@pytest.mark.timeout(600)
@pytest.mark.parametrize("asset", ["predicted_actions", "predicted_actions_by_team"])
def test_scoring_before_the_models_exist_names_the_asset_to_materialize_first(asset,
                                                                             tmp_path):
    """Both scoring assets (one model, a model column) fail alike before a row is sent."""
    said = _materialize(_environment(tmp_path), "cleaned_transcripts", asset, partition=DAY,
                        fails=True)
    assert "cannot be resolved" in said and "Nothing was sent" in said, said[-3000:]
    assert "materialize action_required_models first" in said, said[-3000:]
    with sqlite3.connect(tmp_path / "warehouse.db") as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert asset not in tables


def _table(tmp: Path, name: str) -> pd.DataFrame:
    with sqlite3.connect(tmp / "warehouse.db") as con:
        return pd.read_sql(f"SELECT * FROM {name} WHERE call_date = ?", con, params=[DAY])


@pytest.mark.timeout(600)
def test_the_registered_models_score_a_day_and_mostly_agree_with_the_labels(location):
    models = pd.read_sql("SELECT * FROM action_required_models",
                         sqlite3.connect(location / "warehouse.db"))
    assert sorted(models["model"]) == ["action_required", "action_required_north",
                                       "action_required_south", "action_required_west"]
    assert set(models["version"]) == {"1"}
    scored = _table(location, "predicted_actions")
    calls = pd.read_csv(REPO_ROOT / "assets" / "data" / "call_center_transcripts.csv.gz")
    labels = calls.set_index("call_id")["expected_action_required"]
    ok = scored["predicted_action_error"].isna()
    assert len(scored) == len(_table(location, "cleaned_transcripts")) and ok.mean() > 0.9
    # Rows without a transcript fail alone, with the model's reason.
    assert scored.loc[~ok, "transcript_text"].isna().all()
    assert scored.loc[~ok, "predicted_action_error"].str.startswith("invalid_input:").all()
    agreement = (scored.loc[ok, "predicted_action"].to_numpy()
                 == labels[scored.loc[ok, "call_id"]].to_numpy()).mean()
    assert agreement >= 0.8, agreement  # a week of calls teaches the later days' topics
    by_team = _table(location, "predicted_actions_by_team")
    assert by_team["team_model"].str.match(r"models:/action_required_(north|south|west)@").all()
    assert by_team["predicted_action_error"].isna().sum() == ok.sum()


@pytest.mark.timeout(600)
def test_the_champion_served_by_mlflow_gives_the_in_process_predictions(location, tmp_path):
    registry = f"sqlite:///{location / 'mlflow' / 'mlflow.db'}"
    scored = _table(location, "predicted_actions")
    texts = scored.loc[scored["transcript_text"].notna(), ["call_id", "transcript_text"]]
    with ModelServer("models:/action_required@champion", tracking_uri=registry) as server:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="served", base_url=server.base_url,
                                    models=("action-served",), protocol="mlflow",
                                    max_concurrency=2),),
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05)
        with InferenceClient(settings) as client:
            result = client.predict(texts, model="action-served",
                                    input_columns=["transcript_text"],
                                    output_column="served", rows_per_request=32)
    assert result.df["served_error"].isna().all()
    assert result.stats.requests <= 6  # 70 rows, 32 per request
    in_process = scored.set_index("call_id").loc[texts["call_id"], "predicted_action"]
    assert result.df["served"].tolist() == in_process.tolist()
