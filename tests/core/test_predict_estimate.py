"""The dry run of predict(): the same arguments, nothing scored; rows the ledger holds and
repeated rows are not counted again, and the dry run loads no model it does not need."""

from __future__ import annotations

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import feature_frame

FEATURES = ["f1", "f2"]


def test_the_dry_run_of_predict_counts_what_a_call_would_score(mlflow_registry, tmp_path):
    settings = InferenceSettings(
        endpoints=(), store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        mlflow_models=(MlflowModelSpec(name="risk", model_uri="models:/risk@champion"),),
        mlflow_registry_uri=mlflow_registry.uri, ledger_flush_interval_s=0.05)
    rows = feature_frame(40, seed=3)
    frame = pd.concat([rows, rows.iloc[:5]], ignore_index=True)  # 5 rows repeated
    arguments = {"model": "risk", "input_columns": FEATURES, "output_column": "risk"}
    with InferenceClient(settings) as client:
        before = client.estimate(frame, task="predict", **arguments)
        assert (before.rows, before.rows_deduplicated, before.rows_answered_by_ledger) == (
            45, 5, 0)
        assert before.requests_to_send >= 1
        scored = client.predict(frame.iloc[:20], **arguments)
        assert scored.stats.succeeded == 20
        after = client.estimate(frame, task="predict", **arguments)
        assert after.rows_answered_by_ledger == 20  # the rows just scored
        assert client.ledger.status_counts()["ok"] == 20  # the dry runs scored nothing
