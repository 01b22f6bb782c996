"""The executor side of traditional ML models on Spark: score one Arrow batch or one group.

Runs in Spark's Python workers: imports neither dagster nor pyspark. Each batch goes to the
worker process's client for the job's settings (:func:`.worker.client_for`), whose ``predict``
looks every row up in the ledger first and scores the rest in groups with the model loaded once
per process (:func:`~dagster_batchllm.core.mlflow_models.load_model`): a Python worker that
runs many batches and tasks loads each model once. The models were resolved on the driver, so
every worker scores the same versions even if an alias moves during the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..core.mlflow_models import ResolvedModel
from ..core.predict import PredictCall
from ..core.settings import InferenceSettings
from .worker import client_for

RESULT_FIELD, ERROR_FIELD = "result", "errorMessage"


@dataclass(frozen=True)
class ModelJob:
    """What each executor needs: settings, the call, the driver's resolution of its models."""

    settings: InferenceSettings
    call: PredictCall
    models: tuple[tuple[str, ResolvedModel], ...]
    result_type: str = "double"
    fail_on_error: bool = False
    run_id: str | None = None

    def score(self, frame: pd.DataFrame) -> tuple[list[Any], list[str | None]]:
        client = client_for(self.settings)
        result = client.predict(frame, self.call, models=dict(self.models), run_id=self.run_id)
        values = [_as_type(v, self.result_type) for v in result.df[result.output_column]]
        errors = result.df[result.error_column].tolist()
        if self.fail_on_error:
            failed = [e for e in errors if e is not None]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(errors)} rows failed; the first: "
                                   f"{failed[0]} (the answered rows are in the ledger; "
                                   "fail_on_error=False keeps errors as data)")
        return values, errors


def _as_type(value: Any, result_type: str) -> Any:
    """A prediction in the column's Spark type (a classifier's 0/1 as 1.0, like spark_udf)."""
    if value is None:
        return None
    kind = result_type.lower()
    try:
        if kind in ("double", "float"):
            return float(value)
        if kind in ("int", "integer", "bigint", "long"):
            return int(value)
        if kind in ("string",):
            return value if isinstance(value, str) else str(value)
        if kind == "boolean":
            return bool(value)
    except (TypeError, ValueError):
        return None
    return value


def scalar_function(job: ModelJob, feature_names: list[str]):
    """The pandas UDF body: a batch of the features (a struct, one field per feature)."""

    # No type hints: pandas_udf would read them as a different kind of UDF.
    def predict_batch(features):
        frame = features.copy(deep=False)
        frame.columns = feature_names
        values, errors = job.score(frame.reset_index(drop=True))
        if job.fail_on_error:
            return pd.Series(values, dtype=object)
        return pd.DataFrame({RESULT_FIELD: values, ERROR_FIELD: errors})

    return predict_batch


def group_function(job: ModelJob, output_column: str, drop_columns: tuple[str, ...] = ()):
    """The applyInPandas body: one group's rows, plus the prediction column."""

    def predict_group(pdf):
        pdf = pdf.reset_index(drop=True)
        values, errors = job.score(pdf)
        out = pdf.drop(columns=list(drop_columns))
        if job.fail_on_error:
            out[output_column] = pd.Series(values, dtype=object)
        else:
            out[output_column] = [{RESULT_FIELD: v, ERROR_FIELD: e}
                                  for v, e in zip(values, errors, strict=True)]
        return out

    return predict_group
