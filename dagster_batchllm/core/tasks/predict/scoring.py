"""Deliveries of ``predict()``: in-process MLflow models, and the router beside the pool.

:class:`InProcessScoring` scores a group of rows with the model's pyfunc ``predict`` on a
thread (the model loaded once per process, :func:`~.models.load_model`). A group the
model rejects raises :class:`~.errors.InvalidInputError`, so the grouping delivery splits it
until the bad row fails alone with the model's reason. :class:`ScoringRouter` sends each group
to the in-process scorer or, for a served model, to the delivery the engine built (the pool,
its limits, retries and breakers).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import os
import time
from collections.abc import Sequence
from typing import Any

from ...delivery.base import DelegatingDelivery, Delivery
from ...errors import InvalidInputError, MalformedResponseError, RowError, UnsupportedModelError
from ...requests import Completion, RowRequest
from .models import IN_PROCESS, ResolvedModel, load_model, short_error

IN_PROCESS_ENDPOINT = "in-process"


class InProcessScoring(Delivery):
    """Scores groups of rows with pyfunc models in this process, a few groups at a time."""

    def __init__(self, models: dict[str, ResolvedModel], *, threads: int | None = None):
        self.models = {name: m for name, m in models.items() if m.kind == IN_PROCESS}
        # predict() of numpy-backed models releases the GIL for much of its work; more threads
        # than cores only adds contention.
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self._slots: asyncio.Semaphore | None = None
        self.predict_calls = 0
        self.rows_scored = 0
        self.failed = 0

    def serves(self, model: str) -> bool:
        return model in self.models

    def capacity(self) -> int:
        return self.threads if self.models else 0

    def refusal(self, request: RowRequest) -> RowError | None:
        model = self.models.get(request.model)
        if model is None:
            return UnsupportedModelError(f"no in-process model '{request.model}'")
        return None

    async def open(self, writer: Any) -> None:
        self._slots = asyncio.Semaphore(self.threads)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        if not self.models:
            return {}
        return {IN_PROCESS_ENDPOINT: {"requests": self.predict_calls,
                                      "succeeded": self.predict_calls - self.failed,
                                      "failed": self.failed, "rows": self.rows_scored}}

    async def send(self, request: RowRequest, attempts: Any) -> Completion:
        model = self.models[request.model]
        columns, rows = request.payload
        assert self._slots is not None, "open() first"
        async with self._slots:
            attempts.count += 1
            attempts.sent += 1
            attempts.endpoint = IN_PROCESS_ENDPOINT
            self.predict_calls += 1
            started = time.perf_counter()
            try:
                predictions = await asyncio.to_thread(_predict, model, columns, rows)
            except RowError:
                self.failed += 1
                raise
            self.rows_scored += len(rows)
            return Completion(content="", prompt_tokens=0, completion_tokens=0,
                              usage_reported=True, finish_reason=None,
                              latency_s=time.perf_counter() - started, payload=predictions)


def _predict(model: ResolvedModel, columns: list[str], rows: list[list[Any]]) -> list[Any]:
    import pandas as pd

    try:
        pyfunc = load_model(model)
    except Exception as exc:  # every row of the model fails with this; no split helps
        raise UnsupportedModelError(
            f"model '{model.name}' ({model.uri}) could not be loaded: {short_error(exc)}"
        ) from None
    frame = pd.DataFrame(rows, columns=columns)
    try:
        predictions = pyfunc.predict(frame)
    except Exception as exc:  # a row the model rejects: the grouping delivery finds which
        raise InvalidInputError(
            f"model '{model.name}' rejected the input: {short_error(exc)}") from None
    return predictions_list(predictions, len(rows))


class ScoringRouter(DelegatingDelivery):
    """In-process models here, served models through ``served`` (the engine's delivery)."""

    def __init__(self, in_process: InProcessScoring, served: Delivery):
        super().__init__(served)
        self.in_process = in_process
        self.served = served

    def capacity(self) -> int:
        return self.in_process.capacity() + self.served.capacity()

    def refusal(self, request: RowRequest) -> RowError | None:
        if self.in_process.serves(request.model):
            return self.in_process.refusal(request)
        return self.served.refusal(request)

    async def open(self, writer: Any) -> None:
        await self.in_process.open(writer)
        await self.served.open(writer)

    async def close(self) -> None:
        try:
            await self.in_process.close()
        finally:
            await self.served.close()

    async def send(self, request: RowRequest, attempts: Any) -> Completion:
        if self.in_process.serves(request.model):
            return await self.in_process.send(request, attempts)
        return await self.served.send(request, attempts)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {**self.served.snapshot(), **self.in_process.snapshot()}


def plain_value(value: Any) -> Any:
    """A cell as plain Python data (numpy and pandas scalars unwrapped), for keys and bodies."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if value.__class__.__name__ in ("NAType", "NaTType"):
        return None
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [plain_value(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a number, text, boolean or list")


def predictions_list(predictions: Any, rows: int) -> list[Any]:
    """What ``pyfunc.predict`` returned, as one plain value per row: an array's items, a
    one-column frame's cells, a wider frame's rows as dicts."""
    import numpy as np
    import pandas as pd

    if isinstance(predictions, pd.DataFrame):
        if predictions.shape[1] == 1:
            predictions = predictions.iloc[:, 0]
        else:
            return [{k: plain_value(v) for k, v in r.items()}
                    for r in predictions.to_dict(orient="records")]
    if isinstance(predictions, pd.Series):
        predictions = predictions.to_numpy()
    if isinstance(predictions, dict) and "predictions" in predictions:
        predictions = predictions["predictions"]
    if isinstance(predictions, np.ndarray):
        if predictions.ndim == 1 and predictions.dtype.kind in "biuf":
            return predictions.tolist()  # already plain Python numbers
        return [plain_value(v) for v in predictions.tolist()]
    if isinstance(predictions, list):
        return [plain_value(v) for v in predictions]
    raise MalformedResponseError(
        f"the model returned {type(predictions).__name__}, not one prediction per row "
        f"({rows} rows)")


def predict_isolating_errors(pyfunc: Any, frame: Any, name: str
                             ) -> tuple[list[Any], list[str | None]]:
    """One pyfunc ``predict`` of ``frame`` (a plain vectorized call, as ``spark_udf`` makes);
    where the model rejects it, halves are scored again until each bad row fails alone with the
    model's reason: (prediction or None, ``"<error_type>: <reason>"`` or None) per row. For
    callers that keep no ledger (``model_udf``, ``predict_grouped`` by default)."""
    values, problems = predict_rows(pyfunc, frame, name)
    return values, [None if p is None else p.as_cell() for p in problems]


def predict_rows(pyfunc: Any, frame: Any, name: str
                 ) -> tuple[list[Any], list[RowError | None]]:
    """:func:`predict_isolating_errors` with each row's error as a :class:`RowError` (its type
    is what a ledger record keeps)."""
    rows = len(frame)
    if rows == 0:
        return [], []
    try:
        return predictions_list(pyfunc.predict(frame), rows), [None] * rows
    except MalformedResponseError as exc:
        return [None] * rows, [exc] * rows
    except Exception as exc:
        if rows == 1:
            return [None], [InvalidInputError(
                f"model '{name}' rejected the input: {short_error(exc)}")]
    half = rows // 2
    first = predict_rows(pyfunc, frame.iloc[:half], name)
    second = predict_rows(pyfunc, frame.iloc[half:], name)
    return first[0] + second[0], first[1] + second[1]
