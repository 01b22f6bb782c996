"""The executor side of traditional ML models on Spark: score one Arrow batch or one group.

Runs in Spark's Python workers: imports neither dagster nor pyspark. Without the ledger (the
default, as ``spark_udf``) each batch is one ``predict`` per model; with it, every row is looked
up in the ledger first and the rest scored and written in bulk (:func:`~..core.keyed_scoring.
score_keyed`; served models through the worker process's client, :func:`.worker.client_for`).
Either way the model is loaded once per process
(:func:`~dagster_batchllm.core.tasks.predict.models.load_model`): a Python worker that runs many
batches and tasks loads each model once. The models were resolved on the driver, so
every worker scores the same versions even if an alias moves during the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..core import (
    BackgroundWrites,
    InferenceSettings,
    PredictCall,
    ResolvedModel,
    fewer_collections,
    load_model,
    predict_isolating_errors,
    score_keyed,
)
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
    #: Keep every prediction in the ledger (a rerun scores nothing again); False (the default,
    #: spark_udf's way): each batch one plain predict(), a rejected row still failing alone.
    use_ledger: bool = False

    @property
    def keyed(self) -> bool:
        """Whether batches are scored by :func:`score_keyed` (every model in process)."""
        return self.use_ledger and all(not m.served for _, m in self.models)

    def background_writes(self) -> BackgroundWrites | None:
        """A writer thread for one task's batches (see :mod:`~.predict.keyed`)."""
        if not self.keyed:
            return None
        return BackgroundWrites(client_for(self.settings).ledger,
                                outage_s=self.settings.ledger_outage_s)

    def score(self, frame: pd.DataFrame, writes: BackgroundWrites | None = None, *,
              column: bool = False) -> tuple[Any, list[str | None]]:
        """(predictions, errors) per row; ``column``: predictions as one array where the
        result type allows (a pandas UDF's column), else a list of Python values."""
        if self.keyed:
            # The batch's keys, lookups, model call and ledger writes in bulk: the engine's
            # bookkeeping per row would cost a hundred times what such a model does.
            client = client_for(self.settings)
            batch = score_keyed(client.ledger, frame, self.call, dict(self.models),
                                run_id=self.run_id, outage_s=self.settings.ledger_outage_s,
                                writes=writes)
            outputs, errors = batch.values, batch.errors
        elif self.use_ledger:  # served models: the engine, for the pool's limits and retries
            client = client_for(self.settings)
            result = client.predict(frame, self.call, models=dict(self.models),
                                    run_id=self.run_id)
            outputs = result.df[result.output_column]
            errors = result.df[result.error_column].tolist()
        else:
            outputs, errors = self._score_directly(frame, numbers=column and _NUMERIC.get(
                self.result_type.lower(), False))
        values = _as_column(outputs, self.result_type) if column else None
        if values is None:
            values = [_as_type(v, self.result_type) for v in outputs]
        if self.fail_on_error:
            failed = [e for e in errors if e is not None]
            if failed:
                if writes is not None:
                    writes.drain()  # the answered rows in the ledger before the task fails
                kept = "the answered rows are in the ledger; " if self.use_ledger else ""
                raise RuntimeError(f"{len(failed)} of {len(errors)} rows failed; the first: "
                                   f"{failed[0]} ({kept}fail_on_error=False keeps errors as "
                                   "data)")
        return values, errors


    def _score_directly(self, frame: pd.DataFrame, numbers: bool = False
                        ) -> tuple[Any, list[str | None]]:
        """``numbers``: a model's 1-D numeric predictions may come back as the array itself
        (a double column needs no value per row in Python)."""
        models = dict(self.models)
        features = frame[list(self.call.input_columns)]
        if self.call.model is not None:  # one model: the batch as it is, as spark_udf scores it
            name = self.call.model
            model = models.get(name)
            if numbers and _unusable(name, model, None) is None:
                array = _numeric_predictions(model, features)
                if array is not None:
                    return array, [None] * len(features)
            return self._predict_or_fail(name, model, features)
        n = len(frame)
        names = frame[self.call.model_column].tolist()
        outputs: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        for name in dict.fromkeys(names):
            rows = [i for i, m in enumerate(names) if m == name]
            model = models.get(name) if isinstance(name, str) else None
            values, failed = self._predict_or_fail(
                name, model, features.iloc[rows].reset_index(drop=True))
            for i, value, error in zip(rows, values, failed, strict=True):
                outputs[i], errors[i] = value, error
        return outputs, errors

    def _predict_or_fail(self, name: Any, model: ResolvedModel | None, features: pd.DataFrame
                         ) -> tuple[list[Any], list[str | None]]:
        """One plain predict of ``features`` by ``model``; every row failing with the reason
        where the model cannot be used or loaded, a rejected row alone with the model's."""
        problem = _unusable(name, model, self.call.model_column)
        if problem is None:
            try:
                pyfunc = load_model(model)
            except Exception as exc:
                problem = f"unsupported_model: model '{name}' could not be loaded: {exc}"
        if problem is not None:
            return [None] * len(features), [problem] * len(features)
        return predict_isolating_errors(pyfunc, features, name)


def _unusable(name: Any, model: ResolvedModel | None, column: str | None) -> str | None:
    if name is None or (isinstance(name, float) and name != name):
        return f"invalid_input: model column '{column}' is empty"
    if model is None:
        return f"unsupported_model: unknown model '{name}'"
    if model.error:
        return f"unsupported_model: {model.error}"
    if model.served:
        return (f"unsupported_model: '{name}' is served; use_ledger=False scores in-process "
                "models only (pass use_ledger=True)")
    return None


_NUMERIC = {"double": True, "float": True}


def _numeric_predictions(model: ResolvedModel, features: pd.DataFrame) -> np.ndarray | None:
    """One plain ``predict``, as ``spark_udf`` makes it, when its answer is one number per row
    (an array or a Series): the values as they are. None otherwise, and when the model
    rejects the batch or cannot be loaded: the caller then scores it the general way, which
    isolates the rejected rows and says why (a rejected batch is predicted once more)."""
    try:
        predictions = load_model(model).predict(features)
    except Exception:
        return None
    if isinstance(predictions, pd.Series):
        predictions = predictions.to_numpy()
    if (isinstance(predictions, np.ndarray) and predictions.ndim == 1
            and predictions.dtype.kind in "biuf" and len(predictions) == len(features)):
        return predictions
    return None


def _as_column(values: list[Any], result_type: str) -> Any:
    """A double or float column as one float64 array (a row without a prediction as NaN, which
    the Arrow conversion writes as null, as ``_as_type``'s None): no Python call per row. None
    for other types, or values that are not all numbers (they go through ``_as_type``)."""
    if result_type.lower() not in ("double", "float"):
        return None
    try:
        column = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return column if column.shape == (len(values),) else None  # not rows of lists


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
    """The pandas UDF body: a task's batches of the features (a struct, one field per
    feature), one after another, so the ledger writes of one overlap the next and the task
    ends only once every prediction is written."""

    def predict_batches(batches):
        writes = job.background_writes()
        try:
            with fewer_collections():  # a task's per-row keys and records are not garbage
                for features in batches:
                    frame = features.copy(deep=False)
                    frame.columns = feature_names
                    values, errors = job.score(frame.reset_index(drop=True), writes,
                                               column=True)
                    if job.fail_on_error:
                        yield pd.Series(values, dtype=None if isinstance(values, np.ndarray)
                                        else object)
                    else:
                        yield pd.DataFrame({RESULT_FIELD: values, ERROR_FIELD: errors})
        finally:  # also when Spark stops reading early (a limit): what was scored is kept
            if writes is not None:
                writes.close()

    # Iterator hints make it Spark's scalar-iterator UDF (one call per task, not per batch).
    out = pd.Series if job.fail_on_error else pd.DataFrame
    predict_batches.__annotations__ = {"batches": Iterator[pd.DataFrame],
                                       "return": Iterator[out]}
    return predict_batches


def columns_function(job: ModelJob, feature_names: list[str], result_type: Any):
    """The Arrow UDF body of ``model_udf``: a task's batches of the feature columns (passed as
    separate columns, where a struct of them would be built on the JVM for every row), scored
    as :func:`scalar_function` scores them, the column built in Arrow (``result_type``, the
    prediction's Arrow type): no pandas frame between Spark and the result, and a batch without
    errors sends its ``errorMessage`` field as one all-null array."""
    import pyarrow as pa

    def predict_columns(batches):
        writes = job.background_writes()
        try:
            with fewer_collections():
                for columns in batches:  # one Array for one feature, else a tuple of them
                    parts = columns if isinstance(columns, tuple) else (columns,)
                    frame = pd.DataFrame({name: part.to_pandas() for name, part in
                                          zip(feature_names, parts, strict=True)}, copy=False)
                    values, errors = job.score(frame, writes, column=True)
                    result = pa.array(values, type=result_type, from_pandas=True)  # NaN: null
                    if job.fail_on_error:
                        yield result
                        continue
                    failed = (pa.nulls(len(errors), pa.string()) if not any(errors)
                              else pa.array(errors, type=pa.string()))
                    yield pa.StructArray.from_arrays([result, failed],
                                                     names=[RESULT_FIELD, ERROR_FIELD])
        finally:  # also when Spark stops reading early (a limit): what was scored is kept
            if writes is not None:
                writes.close()

    # Iterator hints make it Spark's scalar-iterator UDF (one call per task, not per batch).
    predict_columns.__annotations__ = {"batches": Iterator[tuple[pa.Array, ...]],
                                       "return": Iterator[pa.Array]}
    return predict_columns


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
