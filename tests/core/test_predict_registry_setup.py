"""A fresh SQLite MLflow registry opened by several processes at once (two Dagster steps: one
registering a model, one observing its alias) is created and migrated once: without the lock,
MLflow's migrations run twice and one process fails with ``duplicate column name: step``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("mlflow")

from dagster_batchllm.core.tasks.predict.registry import sqlite_path

# Each process imports MLflow (seconds), then waits for the start file, so all of them open
# the registry within milliseconds of each other.
RACER = """
import json, os, sys, time
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
import mlflow
from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec
from dagster_batchllm.core.tasks.predict.models import resolve_models
from dagster_batchllm.simulator.mlflow_registry import LocalRegistry, feature_frame, fit_risk_model
root, role, start = sys.argv[1:4]
while not os.path.exists(start):
    time.sleep(0.005)
try:
    if role == "register":
        version = LocalRegistry(root).log_sklearn("risk", fit_risk_model(1),
                                                  input_example=feature_frame(3), alias="champion")
        print(json.dumps({"version": version}))
    else:
        uri = f"sqlite:///{root}/mlflow.db"
        settings = InferenceSettings(endpoints=(), mlflow_models=(
            MlflowModelSpec(name="risk", model_uri="models:/risk@champion", registry_uri=uri),))
        print(json.dumps({"error": resolve_models(settings, ["risk"])["risk"].error}))
except Exception as exc:
    print(json.dumps({"crash": f"{type(exc).__name__}: {exc}"[:400]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_processes_racing_on_a_fresh_registry_set_it_up_once(tmp_path):
    root, start = tmp_path / "registry", tmp_path / "start"
    roles = ["register", "observe", "observe", "observe"]
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(root), role, str(start)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for role in roles]
    time.sleep(6)  # the imports
    start.touch()
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=240)
        assert racer.returncode == 0, err[-2000:]
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    assert not [o for o in outcomes if "crash" in o], outcomes
    assert outcomes[0] == {"version": "1"}
    for observed in outcomes[1:]:  # before the model was registered, or after: no crash
        assert observed["error"] is None or "cannot be resolved" in observed["error"]
        assert "OperationalError" not in str(observed["error"])
    from dagster_batchllm.simulator.mlflow_registry import LocalRegistry

    registry = LocalRegistry(root)  # the database the race left is whole and migrated
    assert str(registry.client.get_model_version_by_alias("risk", "champion").version) == "1"


@pytest.mark.parametrize("uri, path", [
    ("sqlite:////abs/mlflow.db", "/abs/mlflow.db"),
    ("sqlite:///rel/mlflow.db?timeout=5", "rel/mlflow.db"),
    ("sqlite:///:memory:", None),
    ("postgresql://u@h/db", None),
    (None, None),
])
def test_only_a_sqlite_file_is_set_up_here(uri, path):
    assert sqlite_path(uri) == path
