"""The inference core: rows in, requests through a pool of endpoints, answers in a ledger.

Nothing here imports dagster or pyspark (a test checks it), so the same code serves plain
scripts, the SQL functions and Spark executors. Read it in the order the data flows:
:mod:`.settings` and :mod:`.tasks` (what to do: each job a call and a task),
:mod:`.requests` (what every layer passes on), :mod:`.ledger` (what is answered already),
:mod:`.delivery` (the endpoint pool, limits, retries, the HTTP transport and the batch APIs),
:mod:`.run` (one run, whatever the job), :mod:`.batch` (the offline batch APIs' passes),
:mod:`.results` (what comes back), :mod:`.client` (every job's call and its estimate).

The layers outside the core (the Dagster resource, factories and sensors, SQL, Spark, the
semantic operators, the AI functions, the harness) import it only from here: ``__all__`` is
what they use, and what ``dagster_batchllm`` re-exports, nothing more (``tests/test_layout.py``
keeps it so). The names are imported on first use (PEP 562), so importing one, or a core
module such as :mod:`.client` as Spark executors do, loads no more of the core than that
needs: an error class alone does not import pandas, SQLAlchemy or the HTTP clients.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name's home, by module. The groups say what the outer layers use them for.
_HOMES: dict[str, tuple[str, ...]] = {
    # Running calls and what comes back: the resource, SQL, Spark, the operators.
    ".client": ("InferenceClient", "token_reservations"),
    ".results": ("InferenceEstimate", "InferenceResult", "InferenceStats"),
    ".run.plan": ("Plan",),
    ".run.sync": ("run_sync",),
    ".tasks.predict.task": ("PredictionResult",),
    # Settings, mirrored into Dagster config (a field's description written once).
    ".settings": ("DEFAULT_LEDGER_TABLE", "EndpointSpec", "InferenceSettings", "MlflowModelSpec"),
    ".descriptions": ("DESCRIPTION", "described"),
    ".pricing": ("EVERY_MODEL", "Price"),
    # The jobs: their calls, and what a job defined outside the core is made of.
    ".tasks.base": ("CallBase", "register_task", "task_type_for"),
    ".tasks.chat.call": ("GENERATION_PARAMS", "InferenceCall", "checked_param",
                         "literal_template", "normalize_response_format", "template_fields"),
    ".tasks.chat.task": ("ChatTask",),
    ".tasks.cells": ("cell_text",),
    ".tasks.embed.call": ("EmbedCall",),
    ".tasks.predict.call": ("PredictCall",),
    ".requests": ("Completion",),
    ".delivery.transport": ("json_reply",),
    # MLflow models: resolved on a driver, loaded and scored once per process (Spark's UDFs).
    ".tasks.predict.models": ("ResolvedModel", "load_model", "looks_like_uri", "mlflow_uris",
                              "resolve_models", "single_required_input"),
    ".tasks.predict.registry": ("ready_registry",),
    ".tasks.predict.resolve": ("ModelsUnresolvedError",),
    ".tasks.predict.scoring": ("predict_isolating_errors",),
    ".tasks.predict.keyed": ("BackgroundWrites", "score_keyed"),
    ".run.gc_pacing": ("fewer_collections",),
    # Errors: raised before anything is sent, and a row's error as data.
    ".errors": ("BatchLLMError", "ContextLengthExceededError", "DeferredError", "ErrorType",
                "FileRefusedError", "InferenceConfigError", "RowError",
                "StructuredOutputError"),
    ".file_policy": ("FilePolicy",),
    # The ledger and its store, as the sensors and Spark's shared budget read them.
    ".ledger.table": ("Ledger",),
    ".ledger.stores": ("StoreLocation", "validate_identifier"),
    ".ledger.deferrals": ("unfinished_partitions",),
    # Delivery and batch passes, as the factories and sensors check and watch them.
    ".batch.mode": ("check_delivery", "check_mode"),
    ".batch.waits": ("poll_waiting_partitions",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "DEFAULT_LEDGER_TABLE",
    "DESCRIPTION",
    "EVERY_MODEL",
    "GENERATION_PARAMS",
    "BackgroundWrites",
    "BatchLLMError",
    "CallBase",
    "ChatTask",
    "Completion",
    "ContextLengthExceededError",
    "DeferredError",
    "EmbedCall",
    "EndpointSpec",
    "ErrorType",
    "FilePolicy",
    "FileRefusedError",
    "InferenceCall",
    "InferenceClient",
    "InferenceConfigError",
    "InferenceEstimate",
    "InferenceResult",
    "InferenceSettings",
    "InferenceStats",
    "Ledger",
    "MlflowModelSpec",
    "ModelsUnresolvedError",
    "Plan",
    "PredictCall",
    "PredictionResult",
    "Price",
    "ResolvedModel",
    "RowError",
    "StoreLocation",
    "StructuredOutputError",
    "cell_text",
    "check_delivery",
    "check_mode",
    "checked_param",
    "described",
    "fewer_collections",
    "json_reply",
    "literal_template",
    "load_model",
    "looks_like_uri",
    "mlflow_uris",
    "normalize_response_format",
    "poll_waiting_partitions",
    "predict_isolating_errors",
    "ready_registry",
    "register_task",
    "resolve_models",
    "run_sync",
    "score_keyed",
    "single_required_input",
    "task_type_for",
    "template_fields",
    "token_reservations",
    "unfinished_partitions",
    "validate_identifier",
]

if TYPE_CHECKING:
    from .batch.mode import check_delivery, check_mode
    from .batch.waits import poll_waiting_partitions
    from .client import InferenceClient, token_reservations
    from .delivery.transport import json_reply
    from .descriptions import DESCRIPTION, described
    from .errors import (
        BatchLLMError,
        ContextLengthExceededError,
        DeferredError,
        ErrorType,
        FileRefusedError,
        InferenceConfigError,
        RowError,
        StructuredOutputError,
    )
    from .file_policy import FilePolicy
    from .ledger.deferrals import unfinished_partitions
    from .ledger.stores import StoreLocation, validate_identifier
    from .ledger.table import Ledger
    from .pricing import EVERY_MODEL, Price
    from .requests import Completion
    from .results import InferenceEstimate, InferenceResult, InferenceStats
    from .run.gc_pacing import fewer_collections
    from .run.plan import Plan
    from .run.sync import run_sync
    from .settings import (
        DEFAULT_LEDGER_TABLE,
        EndpointSpec,
        InferenceSettings,
        MlflowModelSpec,
    )
    from .tasks.base import CallBase, register_task, task_type_for
    from .tasks.cells import cell_text
    from .tasks.chat.call import (
        GENERATION_PARAMS,
        InferenceCall,
        checked_param,
        literal_template,
        normalize_response_format,
        template_fields,
    )
    from .tasks.chat.task import ChatTask
    from .tasks.embed.call import EmbedCall
    from .tasks.predict.call import PredictCall
    from .tasks.predict.keyed import BackgroundWrites, score_keyed
    from .tasks.predict.models import (
        ResolvedModel,
        load_model,
        looks_like_uri,
        mlflow_uris,
        resolve_models,
        single_required_input,
    )
    from .tasks.predict.registry import ready_registry
    from .tasks.predict.resolve import ModelsUnresolvedError
    from .tasks.predict.scoring import predict_isolating_errors
    from .tasks.predict.task import PredictionResult


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
