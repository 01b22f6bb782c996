"""dagster-batchllm: batch LLM inference over tables, as Dagster assets.

The Dagster-facing names are imported lazily, so ``import dagster_batchllm.client`` (as Spark
executors and subprocesses do) does not pay for importing dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "build_inference_asset": "dagster_batchllm.asset_factory",
    "BatchInferenceComponent": "dagster_batchllm.component",
    "build_retry_partitions_sensor": "dagster_batchllm.sensors",
    "build_new_data_sensor": "dagster_batchllm.sensors",
    "stats_metadata": "dagster_batchllm.metadata",
    "BatchInferenceResource": "dagster_batchllm.resource",
    "Endpoint": "dagster_batchllm.resource",
    "ModelPrice": "dagster_batchllm.resource",
    "ManagedEndpoint": "dagster_batchllm.resource",
    "InferenceClient": "dagster_batchllm.client",
    "InferenceResult": "dagster_batchllm.results",
    "InferenceStats": "dagster_batchllm.results",
    "InferenceEstimate": "dagster_batchllm.results",
    "EndpointSpec": "dagster_batchllm.settings",
    "InferenceSettings": "dagster_batchllm.settings",
    "Ledger": "dagster_batchllm.ledger",
    "BatchLLMError": "dagster_batchllm.errors",
    "InferenceConfigError": "dagster_batchllm.errors",
    "ErrorType": "dagster_batchllm.errors",
}

__all__ = [
    "BatchInferenceComponent",
    "BatchInferenceResource",
    "BatchLLMError",
    "Endpoint",
    "EndpointSpec",
    "ErrorType",
    "InferenceClient",
    "InferenceConfigError",
    "InferenceEstimate",
    "InferenceResult",
    "InferenceSettings",
    "InferenceStats",
    "Ledger",
    "build_inference_asset",
    "build_new_data_sensor",
    "build_retry_partitions_sensor",
    "stats_metadata",
    "ManagedEndpoint",
    "ModelPrice",
]

if TYPE_CHECKING:
    from .asset_factory import build_inference_asset
    from .client import InferenceClient
    from .component import BatchInferenceComponent
    from .errors import BatchLLMError, ErrorType, InferenceConfigError
    from .ledger import Ledger
    from .metadata import stats_metadata
    from .resource import BatchInferenceResource, Endpoint, ManagedEndpoint, ModelPrice
    from .results import InferenceEstimate, InferenceResult, InferenceStats
    from .sensors import build_new_data_sensor, build_retry_partitions_sensor
    from .settings import EndpointSpec, InferenceSettings


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_batchllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
