"""``PredictCall``: what one ``predict()`` says, frozen and checked before a row is read.

The traditional-ML counterpart of :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`:
the model (or a column naming each row's), the feature columns, how rows are sent to a served
model and where the predictions go. ``predict()``, the scoring asset and the Spark model
functions all build one; :class:`~dagster_batchllm.core.tasks.predict.task.PredictTask` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InferenceConfigError
from ..base import CallBase

INVOCATIONS_ROUTE = "/invocations"
INPUT_FORMATS = ("dataframe_split", "dataframe_records", "inputs")


@dataclass(frozen=True)
class PredictCall(CallBase):
    """What to score: the model (or a column naming each row's), the feature columns, where the
    predictions go."""

    job, entry = "predict", "predict"

    input_columns: tuple[str, ...] = ()
    model: str | None = None
    model_column: str | None = None
    output_column: str = "prediction"
    error_column: str | None = None
    #: Most rows in one predict() / one /invocations request (None: the model's rows_per_batch).
    rows_per_request: int | None = None
    #: How a served model gets its rows, in MLflow's scoring protocol: ``dataframe_split``,
    #: ``dataframe_records``, or ``inputs`` (TF-serving's columnar form, ``{"inputs": {column:
    #: [values]}}``, for models whose signature takes tensors or a dict of columns).
    input_format: str = "dataframe_split"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if isinstance(self.input_columns, str):
            set_(self, "input_columns", (self.input_columns,))
        set_(self, "input_columns", tuple(self.input_columns))
        if not self.input_columns:
            raise InferenceConfigError(
                "predict() needs input_columns=[...]: the columns the model reads, named as "
                "its features")
        if len(set(self.input_columns)) != len(self.input_columns):
            raise InferenceConfigError(f"input_columns repeats a column: {self.input_columns}")
        if (self.model is None) == (self.model_column is None):
            raise InferenceConfigError(
                "predict() needs model= (a configured MLflow model, a served model or a URI "
                "such as models:/risk@champion) or model_column= (a column naming each row's)")
        if self.model_column in self.input_columns:
            raise InferenceConfigError(
                f"model_column '{self.model_column}' is also an input column")
        self._check_common()
        size = self.rows_per_request
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or size < 1):
            raise InferenceConfigError(
                f"rows_per_request must be a positive integer, got {self.rows_per_request!r}")
        if self.input_format not in INPUT_FORMATS:
            raise InferenceConfigError(
                f"input_format must be one of {list(INPUT_FORMATS)}, got {self.input_format!r}")

    def columns_read(self) -> list[str]:
        """The frame's columns a run reads, in row-tuple order: features, then the model."""
        return list(self.input_columns) + ([self.model_column] if self.model_column else [])

    def models_named(self, frame: Any) -> list[str]:
        """The distinct models the rows name (null cells are left out: they fail as rows)."""
        if self.model is not None:
            return [self.model]
        return [str(v) for v in frame[self.model_column].dropna().unique().tolist()]
