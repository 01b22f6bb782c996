"""A pyfunc model for tests that counts its own loads: each ``load_context`` appends this
process's id to a file, so a test can tell how often each worker process loaded it.

It imports mlflow at module level: only tests and benchmarks import it."""

from __future__ import annotations

import os
from typing import Any

import mlflow.pyfunc


class LoadCountingModel(mlflow.pyfunc.PythonModel):
    """A fitted scikit-learn model behind pyfunc; ``model_config["load_log"]`` names the file
    each load appends ``<pid> <tag>`` to."""

    def __init__(self, estimator: Any, tag: str):
        self.estimator = estimator
        self.tag = tag

    def load_context(self, context: Any) -> None:
        log = (context.model_config or {}).get("load_log")
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} {self.tag}\n")

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them
        return self.estimator.predict(model_input[["f1", "f2"]])
