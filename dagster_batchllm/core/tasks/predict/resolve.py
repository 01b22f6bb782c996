"""``predict()``'s models resolved, before a row is sent.

Everything that can be wrong with the call itself raises here, before anything is scored: a
missing column, a model that nobody serves and no registry knows, a model whose signature needs
inputs the call does not give. What can be wrong with one row (a value the model rejects, a
model column cell naming an unknown model) is that row's error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ...errors import InferenceConfigError
from .models import (
    IN_PROCESS,
    SERVED,
    ResolvedModel,
    input_problem,
    load_model,
    resolve_models,
)
from .models import short_error as _short

if TYPE_CHECKING:
    from .call import PredictCall

log = logging.getLogger("dagster_batchllm")
#: Served models this process has warned about (once each: a partitioned asset calls per day).
_warned_unversioned: set[str] = set()


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
        raise ModelsUnresolvedError(models[call.model].error,
                                    {call.model: models[call.model].error})
    if call.model is None and models and all(m.error for m in models.values()):
        # Each row would fail with its model's reason: nothing could be scored.
        said = "; ".join(m.error or "" for m in list(models.values())[:3])
        more = f"; and {len(models) - 3} more" if len(models) > 3 else ""
        raise ModelsUnresolvedError(
            f"no model that model column '{call.model_column}' names can be used "
            f"({len(models)} named), so no row can be scored: {said}{more}",
            {name: m.error or "" for name, m in models.items()})
    _warn_unversioned(models)
    return models


class ModelsUnresolvedError(InferenceConfigError):
    """No model a call names can be used (not registered yet, unknown, not loadable): no row
    could be scored, so the call raises before anything is sent. ``problems``: each model
    name's reason."""

    def __init__(self, message: str, problems: dict[str, str] | None = None):
        super().__init__(message)
        self.problems = problems or {}


def _warn_unversioned(models: dict[str, ResolvedModel]) -> None:
    """A served model keyed by its name alone answers a redeploy of another version from the
    ledger. The server cannot tell us its version (``mlflow models serve``'s ``/version`` is
    MLflow's own release), so only the endpoint's declaration can; say so once."""
    for name, model in models.items():
        if model.kind == SERVED and model.identity == f"served:{name}" \
                and name not in _warned_unversioned:
            _warned_unversioned.add(name)
            log.warning(
                f"batchllm: served model '{name}' is keyed by its name only: its endpoint "
                "declares neither served_model_uri nor served_model_version, and a scoring "
                "server does not say which model version it serves, so a redeploy of another "
                "version would be answered from the ledger. Declare what the endpoint serves.")


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
