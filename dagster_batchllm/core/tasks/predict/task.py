"""``predict()``: traditional ML models (MLflow) over rows, as a task of the same engine.

:class:`PredictCall` says what to score; :class:`PredictTask` turns each row into one request
item (its feature values, keyed by the model's pinned identity and the values) and reads
predictions back. It is a :class:`~.grouping.GroupedTask`: rows go to the model in groups (one
``predict()`` of a DataFrame in process, one ``POST /invocations`` with ``dataframe_split`` to a
served model), and a group the model rejects is split so only the bad row fails. So the ledger,
deduplication, resume, the pool's limits, retries and breakers are those of ``infer()``; the
engine does not know it is scoring.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...delivery.grouping import GroupingDelivery
from ...delivery.transport import json_reply
from ...errors import InvalidInputError, MalformedResponseError, RowError
from ...requests import Completion, RowRequest
from ...results import InferenceResult
from ..base import Task, register_task
from .call import INVOCATIONS_ROUTE, PredictCall
from .models import SERVED, ResolvedModel
from .resolve import resolve_for_call
from .scoring import InProcessScoring, ScoringRouter, plain_value

if TYPE_CHECKING:
    from ...delivery.base import Delivery

@dataclass
class PredictionResult(InferenceResult):
    """:class:`~.results.InferenceResult` plus, per model the call named, what it resolved to
    (kind, pinned URI, registered name, version, alias, run id)."""

    models: dict[str, dict[str, Any]] = field(default_factory=dict)


@register_task(PredictCall)
class PredictTask(Task):
    """One item per row: the row's feature values for its model, several rows per request."""

    route = INVOCATIONS_ROUTE
    max_request_tokens = None
    batch_refusal = ("predictions come from MLflow models, in process or served by `mlflow "
                     "models serve`, and neither has an offline batch API; score them online "
                     "(mode='online', the default), many rows per request")

    def __init__(self, call: PredictCall, models: dict[str, ResolvedModel], *,
                 in_process: Any = None):
        """``models``: each name the call uses, resolved; ``in_process``: the delivery that
        scores in-process models (:class:`~.scoring.InProcessScoring`), put in front of the
        one the engine gives for served models."""
        super().__init__(call)
        self.models = models
        self.in_process = in_process
        self.columns = list(call.input_columns)
        per_model = [m.rows_per_batch for m in models.values() if m.kind != SERVED]
        self.items_per_request = call.rows_per_request or max(per_model, default=256)

    @classmethod
    async def prepare(cls, call: PredictCall, frame: Any, client: Any, *,
                      models: dict[str, ResolvedModel] | None = None) -> PredictTask:
        """``models``: resolved already (a Spark executor gets them from the driver, so every
        worker scores the same versions); else resolved here, and in-process ones loaded."""
        if models is None:
            models = await resolve_for_call(client.settings, call, frame)
        return cls(call, models, in_process=InProcessScoring(models))

    def run_settings(self, settings: Any, capacity: int) -> Any:
        # A group's answers settle at once: a write batch smaller than a group would hold the
        # workers back (at the default 64, in-process scoring runs at half speed).
        return settings.replace(ledger_flush_rows=max(settings.ledger_flush_rows,
                                                      self.items_per_request))

    def result(self, df: Any, run: Any) -> PredictionResult:
        return PredictionResult.of_run(
            df, run, output_column=self.call.output_column, error_column=self.call.error_column,
            models={name: m.describe() for name, m in self.models.items()})

    # -- rows -> items -----------------------------------------------------------------------
    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        n = len(self.columns)
        fixed = self.call.model
        # The key: the model's pinned identity, the feature names and the row's values. repr of
        # plain Python values is exact and several times cheaper than JSON, per row.
        prefixes = {name: f"predict|{model.identity}|{self.columns!r}|"
                    for name, model in self.models.items() if not model.error}
        for row in rows:
            ref = fixed if fixed is not None else row[n]
            if ref is None or (isinstance(ref, float) and math.isnan(ref)):
                yield InvalidInputError(f"model column '{self.call.model_column}' is empty")
                continue
            ref = ref if isinstance(ref, str) else str(ref)
            prefix = prefixes.get(ref)
            if prefix is None:
                yield _unusable(ref, self.models.get(ref))
                continue
            try:
                values = [plain_value(v) for v in row[:n]]
            except (TypeError, ValueError) as exc:
                yield InvalidInputError(f"a feature value cannot be scored: {exc}")
                continue
            key = hashlib.sha256(f"{prefix}{values!r}".encode()).hexdigest()
            yield RowRequest(key=key, model=ref, body=b"", reserve_tokens=0,
                             typical_prompt_tokens=0, max_tokens=0, payload=values)

    # -- items -> one request, its reply -> items --------------------------------------------
    def group_request(self, items: list[RowRequest]) -> RowRequest:
        model = items[0].model
        body = b""
        if self.models[model].kind == SERVED:
            data = [[_json_safe(v) for v in item.payload] for item in items]
            if self.call.input_format == "dataframe_records":
                payload = {"dataframe_records": [dict(zip(self.columns, r, strict=True))
                                                 for r in data]}
            elif self.call.input_format == "inputs":
                payload = {"inputs": {column: [r[i] for r in data]
                                      for i, column in enumerate(self.columns)}}
            else:
                payload = {"dataframe_split": {"columns": self.columns, "data": data}}
            body = json.dumps(payload, ensure_ascii=False, default=str).encode()
        return RowRequest(key="", model=model, body=body, reserve_tokens=0,
                          typical_prompt_tokens=0, max_tokens=0,
                          payload=(self.columns, [item.payload for item in items]))

    def split_reply(self, reply: Completion, items: list[RowRequest]
                    ) -> list[Completion | RowError]:
        predictions = reply.payload
        if len(predictions) != len(items):
            raise MalformedResponseError(
                f"model '{items[0].model}' returned {len(predictions)} predictions for "
                f"{len(items)} rows")
        parts: list[Completion | RowError] = []
        dumps = json.dumps  # default arguments: the C encoder, cached
        for prediction in predictions:
            try:
                content = dumps(prediction)
            except (TypeError, ValueError) as exc:
                parts.append(MalformedResponseError(f"a prediction is not JSON data: {exc}"))
                continue
            parts.append(Completion(content=content, prompt_tokens=0, completion_tokens=0,
                                    usage_reported=True, finish_reason=None,
                                    latency_s=reply.latency_s, payload=prediction))
        return parts

    def parse_reply(self, raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
        """A served model's ``{"predictions": [...]}`` (or a bare list)."""
        payload = json_reply(raw, endpoint)
        predictions = payload.get("predictions") if isinstance(payload, dict) else payload
        if not isinstance(predictions, list):
            keys = sorted(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
            raise MalformedResponseError(
                f"endpoint '{endpoint}' answered 200 without a 'predictions' list ({keys})")
        if predictions and isinstance(predictions[0], dict) and len(predictions[0]) == 1:
            predictions = [next(iter(p.values())) if isinstance(p, dict) else p
                           for p in predictions]
        return Completion(content="", prompt_tokens=0, completion_tokens=0,
                          usage_reported=True, finish_reason=None, latency_s=latency_s,
                          payload=predictions)

    # -- values ------------------------------------------------------------------------------
    def value(self, content: str) -> Any:
        try:
            return json.loads(content)
        except ValueError:
            raise MalformedResponseError("a stored prediction is not JSON") from None

    def reply_value(self, completion: Completion, request: RowRequest) -> Any:
        return completion.payload if completion.payload is not None else \
            self.value(completion.content)

    def deliver(self, delivery: Delivery) -> Delivery:
        """Groups of rows per model; in-process models scored here, served ones sent by
        ``delivery`` (the pool)."""
        inner = delivery if self.in_process is None else ScoringRouter(self.in_process, delivery)
        return GroupingDelivery(inner, self)


def _unusable(ref: str, model: ResolvedModel | None) -> RowError:
    from ...errors import UnsupportedModelError

    return UnsupportedModelError(model.error if model is not None else
                                 f"unknown model '{ref}'")


def _json_safe(value: Any) -> Any:
    """NaN is not JSON: a missing number goes to a served model as null."""
    return None if isinstance(value, float) and math.isnan(value) else value
