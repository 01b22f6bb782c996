"""``InferenceClient.predict``: checks and resolution before a row is sent, then the engine.

Everything that can be wrong with the call itself raises here, before anything is scored: a
missing column, a model that nobody serves and no registry knows, a model whose signature needs
inputs the call does not give. What can be wrong with one row (a value the model rejects, a
model column cell naming an unknown model) is that row's error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...run.engine import InferenceRun
from ...errors import InferenceConfigError
from .models import IN_PROCESS, ResolvedModel, input_problem, load_model, resolve_models
from .models import short_error as _short
from .task import PredictCall, PredictionResult, PredictTask
from .scoring import InProcessScoring

_CALL_FIELDS = {"input_columns", "model", "model_column", "output_column", "error_column",
                "rows_per_request", "input_format", "scope", "partition_key"}


def predict_call(call: PredictCall | None, fields: dict[str, Any]) -> PredictCall:
    unknown = sorted(set(fields) - _CALL_FIELDS)
    if unknown:
        raise InferenceConfigError(f"predict() got unknown argument(s) {unknown}; it takes "
                                   f"{sorted(_CALL_FIELDS)}")
    if call is None:
        return PredictCall(**fields)
    import dataclasses

    return dataclasses.replace(call, **fields)


async def resolve_for_call(settings: Any, call: PredictCall, frame: Any
                           ) -> dict[str, ResolvedModel]:
    """The call's models resolved and, in-process ones, loaded and checked against the inputs
    (a model ``call.model`` names that cannot be used raises; a model column's fails its rows)."""
    models = await asyncio.to_thread(resolve_models, settings, call.models_named(frame))
    for name, model in list(models.items()):
        if model.kind == IN_PROCESS and model.error is None:
            models[name] = await asyncio.to_thread(_loaded_and_checked, model,
                                                   list(call.input_columns))
    if call.model is not None and models[call.model].error:
        raise InferenceConfigError(models[call.model].error)
    return models


def _loaded_and_checked(model: ResolvedModel, columns: list[str]) -> ResolvedModel:
    import dataclasses

    try:
        pyfunc = load_model(model)
    except Exception as exc:
        return dataclasses.replace(
            model, error=f"model '{model.name}' ({model.uri}) could not be loaded: {_short(exc)}")
    problem = input_problem(pyfunc, columns)
    if problem:
        return dataclasses.replace(model, error=f"model '{model.name}': {problem}")
    return model


async def apredict(client: Any, df: Any, call: PredictCall, *, run_id: str | None = None,
                   logger: Any = None, supersede_stale: bool = False,
                   models: dict[str, ResolvedModel] | None = None) -> PredictionResult:
    """Score ``df``; ``models``: resolved already (a Spark executor gets them from the driver,
    so every worker scores the same versions)."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise InferenceConfigError(f"predict() takes a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in call.input_columns_read() if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"predict(): column(s) {missing} are not in the input (columns: "
            f"{list(df.columns)[:20]})")
    for name in (call.output_column, call.error_column):
        if name in df.columns:
            raise InferenceConfigError(
                f"The input already has a column '{name}'; choose another output_column.")
    if models is None:
        models = await resolve_for_call(client.settings, call, df)
    task = PredictTask(call, models, in_process=InProcessScoring(models))
    log = logger or client.log
    # A group's answers settle at once: a write batch smaller than a group would hold the
    # workers back (at the default 64, in-process scoring runs at half speed).
    settings = client.settings.replace(ledger_flush_rows=max(client.settings.ledger_flush_rows,
                                                             task.items_per_request))
    run = InferenceRun(
        settings, call, df[call.input_columns_read()],
        pool=client.pool, ledger=client.ledger, token_budget=None,
        partition_key=call.partition_key, run_id=run_id, scope=call.scope, logger=log,
        collect_keys=bool(supersede_stale and call.partition_key), task=task,
    )
    stats = await run.run()
    if supersede_stale and call.partition_key:
        await asyncio.to_thread(client.ledger.mark_superseded, call.partition_key, run.keys,
                                call.scope)
    log.info(f"batchllm: predict: {stats.summary()}")
    return PredictionResult.of_run(
        df, run, output_column=call.output_column, error_column=call.error_column,
        models={name: m.describe() for name, m in models.items()})
