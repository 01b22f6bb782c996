"""Scoring whole batches against the ledger (what ``model_udf(..., use_ledger=True)`` does on
the executors), over a real local MLflow registry and a real SQLite ledger: the request keys
are predict()'s own, byte for byte, so each answers the other's rows; a rerun or a retried task
scores nothing again; a rejected row fails alone, with its reason kept in the ledger; the
background writer's answers are on disk when its task ends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec
from dagster_batchllm.core.tasks.chat.rendering import row_tuples
from dagster_batchllm.core.tasks.predict.keyed import (
    BackgroundWrites,
    counters,
    request_keys,
    score_keyed,
)
from dagster_batchllm.core.tasks.predict.models import resolve_models
from dagster_batchllm.core.tasks.predict.task import PredictCall, PredictTask

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import feature_frame, fit_risk_model

# Outside the fast tier: the module trains and logs MLflow models first (about 10 s).
pytestmark = pytest.mark.slow
FEATURES = ["f1", "f2"]


@pytest.fixture
def client(mlflow_registry, tmp_path):
    settings = InferenceSettings(
        endpoints=(), store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        mlflow_models=(MlflowModelSpec(name="risk", model_uri="models:/risk@champion"),),
        mlflow_registry_uri=mlflow_registry.uri, ledger_flush_interval_s=0.05,
        progress_interval_s=60.0)
    with InferenceClient(settings) as built:
        yield built


def _models(client, *refs):
    return resolve_models(client.settings, list(refs))


def _task_keys(frame, call, models):
    items = PredictTask(call, models).requests(row_tuples(frame[call.columns_read()]))
    return [item.as_cell() if hasattr(item, "as_cell") else item.key for item in items]


@pytest.mark.slow
def test_batch_keys_are_predict_tasks_keys_for_every_kind_of_column(client):
    models = _models(client, "risk", "models:/risk/2")
    frame = pd.DataFrame({
        "f1": [0.1, np.nan, 1e300, -0.0, 3.0],
        "f2": np.array([1, 2, 3, 4, 5], dtype=np.int64),
        "flag": [True, False, True, False, True],
        "small": np.array([0.1, 0.2, 0.3, 0.4, 0.5], dtype=np.float32),
        "text": ["a", None, "c", "d", "e"],  # not numeric: PredictTask's own conversion
        "model": ["risk", "models:/risk/2", None, "nobody", "risk"],
    })
    for columns in (["f1", "f2", "flag", "small"], ["f1"], ["f1", "text"]):
        fixed = PredictCall(input_columns=tuple(columns), model="risk")
        keys = request_keys(frame, fixed, models)
        assert keys == _task_keys(frame, fixed, models)
        assert len(set(keys)) == len(keys)
        routed = PredictCall(input_columns=tuple(columns), model_column="model")
        keys = [k if isinstance(k, str) else k.as_cell()
                for k in request_keys(frame, routed, models)]
        assert keys == _task_keys(frame, routed, models)
        assert keys[2].startswith("invalid_input") and keys[3].startswith("unsupported_model")


def test_predict_and_batch_scoring_answer_each_others_rows(client):
    frame = feature_frame(300, seed=21)
    models = _models(client, "risk")
    call = PredictCall(input_columns=tuple(FEATURES), model="risk")
    first = client.predict(frame.head(200), call)
    assert first.stats.cached == 0
    before = counters["scored"]
    batch = score_keyed(client.ledger, frame, call, models, run_id="batch")
    assert batch.cached == 200 and batch.scored == 100 and batch.failed == 0
    assert counters["scored"] - before == 100  # only the rows predict() had not scored
    assert batch.values == fit_risk_model(1).predict(frame[FEATURES]).tolist()
    again = client.predict(frame, call)
    assert again.stats.cached == 300  # the batch's records answer predict() in turn
    assert again.df["prediction"].tolist() == batch.values
    records = client.ledger.records()
    assert len(records) == 300
    assert (records["run_id"] == "batch").sum() == 100


def test_a_rerun_scores_nothing_and_a_rejected_row_fails_alone(client):
    frame = feature_frame(64, seed=22).astype({"f1": object})
    frame.loc[7, "f1"] = None
    frame = frame.astype({"f1": float})  # a missing value, which LogisticRegression rejects
    frame.loc[40] = frame.loc[3]  # a repeated row is scored once
    models = _models(client, "risk")
    call = PredictCall(input_columns=tuple(FEATURES), model="risk", partition_key="p")
    first = score_keyed(client.ledger, frame, call, models)
    assert [e is not None for e in first.errors] == [i == 7 for i in range(64)]
    assert first.errors[7].startswith("invalid_input: model 'risk' rejected the input")
    assert first.scored == 63 and first.values[40] == first.values[3]
    records = client.ledger.records(partition_key="p").set_index("status")
    assert records.loc["failed", "error_type"] == "invalid_input"
    assert len(records.loc["ok"]) == 62
    rerun = score_keyed(client.ledger, frame, call, models)
    assert rerun.cached == 63 and rerun.scored == 1  # only the failed row is tried again
    assert rerun.values == first.values and rerun.errors == first.errors
    # Another partition is answered from the ledger and gets records of its own.
    other = score_keyed(client.ledger, frame.drop(index=7).reset_index(drop=True),
                        PredictCall(input_columns=tuple(FEATURES), model="risk",
                                    partition_key="q"), models)
    assert other.scored == 0 and other.cached == 63
    assert len(client.ledger.records(partition_key="q")) == 62


def test_background_writes_are_in_the_ledger_when_the_task_ends(client):
    models = _models(client, "risk")
    call = PredictCall(input_columns=tuple(FEATURES), model="risk")
    batches = [feature_frame(500, seed=s) for s in (31, 32)]
    batches.append(batches[0].head(100))  # a later batch repeating rows of an earlier one
    writes = BackgroundWrites(client.ledger, outage_s=5.0)
    outcomes = [score_keyed(client.ledger, b, call, models, writes=writes) for b in batches]
    writes.close()
    assert [o.scored for o in outcomes] == [500, 500, 0]  # held or written: not scored again
    assert outcomes[2].values == outcomes[0].values[:100]
    assert len(client.ledger.records()) == 1000
    rerun = score_keyed(client.ledger, batches[1], call, models)  # a retried task
    assert rerun.scored == 0 and rerun.cached == 500


def test_a_failed_write_fails_the_task_after_scoring(client, monkeypatch):
    models = _models(client, "risk")
    call = PredictCall(input_columns=tuple(FEATURES), model="risk")
    writes = BackgroundWrites(client.ledger, outage_s=0.1)

    def broken(records):
        raise ValueError("disk full")

    monkeypatch.setattr(client.ledger, "upsert", broken)
    score_keyed(client.ledger, feature_frame(50, seed=33), call, models, writes=writes)
    with pytest.raises(RuntimeError, match="could not be written to the ledger: disk full"):
        writes.close()
    monkeypatch.undo()
    assert len(client.ledger.records()) == 0  # nothing claimed written that was not
