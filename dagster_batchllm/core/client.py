"""``InferenceClient``: the whole inference core behind two calls, ``infer`` and ``estimate``.

It imports no dagster, so plain scripts, the SQL functions and Spark executors use it directly;
``BatchInferenceResource`` is a thin Dagster door onto it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from .engine import InferenceRun, estimate_cost
from .errors import InferenceConfigError, RowError
from .ledger import Ledger, validate_identifier
from .pool import EndpointPool
from .prompts import build_prompt_spec, iter_row_requests, row_tuples
from .results import InferenceEstimate, InferenceResult
from .settings import InferenceSettings

log = logging.getLogger("dagster_batchllm")


class InferenceClient:
    """Run batch inference over pandas DataFrames.

    Example::

        from dagster_batchllm.core.client import InferenceClient
        from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

        client = InferenceClient(InferenceSettings(
            endpoints=(EndpointSpec(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                    models=("llama-70b",)),),
            store_url="sqlite:///batchllm.db",
        ))
        result = client.infer(df, prompt="Summarize: {text}", model="llama-70b",
                              output_column="summary")
    """

    def __init__(self, settings: InferenceSettings, *, logger: Any = None):
        self.settings = settings
        self.log = logger or log
        self._ledger: Ledger | None = None
        self._ledger_lock = threading.Lock()
        # The pool outlives calls so breaker state carries over between calls of one process.
        self.pool = EndpointPool(
            settings.endpoints,
            failure_threshold=settings.breaker_failure_threshold,
            cooldown_s=settings.breaker_cooldown_s,
        )

    @property
    def ledger(self) -> Ledger:
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = Ledger(self.settings.store_url, self.settings.ledger_table)
            return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.dispose()
            self._ledger = None

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the calls ---------------------------------------------------------------------------
    def infer(self, df: Any, **kwargs: Any) -> InferenceResult:
        """Sync door to :meth:`ainfer`; see ``BatchInferenceResource.infer`` for the arguments."""
        return run_sync(self.ainfer(df, **kwargs))

    async def ainfer(
        self,
        df: Any,
        *,
        prompt: str | None = None,
        prompt_column: str | None = None,
        messages_column: str | None = None,
        system: str | None = None,
        model: str | None = None,
        model_column: str | None = None,
        output_column: str = "output",
        error_column: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        response_format: Any = None,
        token_budget: int | None = None,
        partition_key: str | None = None,
        run_id: str | None = None,
        scope: str | None = None,
        supersede_stale: bool = False,
        logger: Any = None,
        **params: Any,
    ) -> InferenceResult:
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise InferenceConfigError(f"infer() takes a pandas DataFrame, got {type(df).__name__}")
        error_column = error_column or f"{output_column}_error"
        for name in (output_column, error_column):
            validate_identifier(name, "output column")
            if name in df.columns:
                raise InferenceConfigError(
                    f"The input already has a column '{name}'; choose another output_column."
                )
        spec = build_prompt_spec(
            prompt=prompt, prompt_column=prompt_column, messages_column=messages_column,
            system=system, model=model or self._default_model(model_column),
            model_column=model_column,
            params=_generation_params(max_tokens, temperature, params),
            response_format=response_format, columns=list(df.columns),
            served_models=self.settings.models,
        )
        budget = token_budget if token_budget is not None else self.settings.token_budget
        run = InferenceRun(
            self.settings, spec, df[spec.input_columns()],
            pool=self.pool, ledger=self.ledger, token_budget=budget,
            partition_key=partition_key, run_id=run_id, scope=scope, logger=logger or self.log,
            collect_keys=bool(supersede_stale and partition_key),
        )
        stats = await run.run()
        if supersede_stale and partition_key:
            await asyncio.to_thread(self.ledger.mark_superseded, partition_key, run.keys,
                                    scope or "")
        out = df.copy(deep=False)
        out[output_column] = pd.Series(run.outputs, index=df.index, dtype=object)
        out[error_column] = pd.Series(run.errors, index=df.index, dtype=object)
        (logger or self.log).info(f"batchllm: {stats.summary()}")
        return InferenceResult(df=out, stats=stats, output_column=output_column,
                               error_column=error_column)

    def estimate(
        self,
        df: Any,
        *,
        prompt: str | None = None,
        prompt_column: str | None = None,
        messages_column: str | None = None,
        system: str | None = None,
        model: str | None = None,
        model_column: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        response_format: Any = None,
        partition_key: str | None = None,
        scope: str | None = None,
        **params: Any,
    ) -> InferenceEstimate:
        """A dry run of ``infer`` with the same arguments: nothing is sent."""
        spec = build_prompt_spec(
            prompt=prompt, prompt_column=prompt_column, messages_column=messages_column,
            system=system, model=model or self._default_model(model_column),
            model_column=model_column,
            params=_generation_params(max_tokens, temperature, params),
            response_format=response_format, columns=list(df.columns),
            served_models=self.settings.models,
        )
        rows = row_tuples(df[spec.input_columns()])
        distinct: dict[str, Any] = {}
        invalid = duplicates = 0
        for item in iter_row_requests(rows, spec,
                                      default_max_tokens=self.settings.default_max_tokens):
            if isinstance(item, RowError) or not self.pool.serves(item.model):
                invalid += 1
            elif item.key in distinct:
                duplicates += 1
            else:
                distinct[item.key] = item
        hits = self.ledger.lookup_ok(list(distinct), partition_key or "", scope or "")
        answered = 0
        tokens_by_model: dict[str, dict[str, int]] = {}
        for key, item in distinct.items():
            if key in hits:
                answered += 1
                continue
            per_model = tokens_by_model.setdefault(
                item.model, {"prompt_tokens": 0, "completion_tokens": 0})
            per_model["prompt_tokens"] += item.typical_prompt_tokens
            per_model["completion_tokens"] += item.max_tokens
        return InferenceEstimate(
            rows=len(df),
            requests_to_send=len(distinct) - answered,
            rows_answered_by_ledger=answered,
            rows_deduplicated=duplicates,
            invalid_rows=invalid,
            estimated_prompt_tokens=sum(t["prompt_tokens"] for t in tokens_by_model.values()),
            max_completion_tokens=sum(t["completion_tokens"] for t in tokens_by_model.values()),
            tokens_by_model=tokens_by_model,
            estimated_cost_usd=estimate_cost(self.settings, tokens_by_model),
        )

    def _default_model(self, model_column: str | None) -> str | None:
        if model_column is not None:
            return None
        if self.settings.default_model:
            return self.settings.default_model
        models = self.settings.models
        return next(iter(models)) if len(models) == 1 else None


def _generation_params(max_tokens: int | None, temperature: float | None,
                       params: Mapping[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in params.items() if v is not None}
    if max_tokens is not None:
        if int(max_tokens) < 1:
            raise InferenceConfigError("max_tokens must be at least 1.")
        merged["max_tokens"] = int(max_tokens)
    if temperature is not None:
        merged["temperature"] = float(temperature)
    return merged


def run_sync(coro):
    """Run a coroutine to completion from sync code, also inside a running loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread below
            result["error"] = exc

    thread = threading.Thread(target=target, name="batchllm-infer")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
