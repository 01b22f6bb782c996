"""Where the example's MLflow registry lives, and the models the resource scores in process.

A SQLite-backed registry (and tracking store) under ``data/mlflow/``, artifacts beside it;
``BATCHLLM_MLFLOW_DIR`` moves it (the tests point it into a temporary folder).
"""

from __future__ import annotations

import os

from dagster_batchllm import MlflowModel

from .warehouse import DEFAULT_DATA_DIR

MLFLOW_DIR = os.environ.get("BATCHLLM_MLFLOW_DIR", str(DEFAULT_DATA_DIR / "mlflow"))
REGISTRY_URI = f"sqlite:///{os.path.join(MLFLOW_DIR, 'mlflow.db')}"
ARTIFACTS_URI = f"file://{os.path.join(MLFLOW_DIR, 'artifacts')}"
ACTION_MODEL = "action_required"


def example_mlflow_models() -> list[MlflowModel]:
    """The champion of the model ``assets/ml_models.py`` trains, scored in process."""
    return [MlflowModel(name=ACTION_MODEL, model_uri=f"models:/{ACTION_MODEL}@champion",
                        registry_uri=REGISTRY_URI)]
