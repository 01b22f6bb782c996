"""dagster-batchllm: batch LLM inference over tables, as Dagster assets.

The Dagster-facing names are imported lazily, so ``import dagster_batchllm.core.client`` (as Spark
executors and subprocesses do) does not pay for importing dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._moved import install as _install_moved_module_paths

__version__ = "0.1.0"
_install_moved_module_paths()

_LAZY = {
    "build_inference_asset": "dagster_batchllm.asset_factory",
    "BatchInferenceComponent": "dagster_batchllm.components.inference",
    "ModelScoringComponent": "dagster_batchllm.components.scoring",
    "build_retry_partitions_sensor": "dagster_batchllm.sensors",
    "build_new_data_sensor": "dagster_batchllm.sensors",
    "build_batch_collect_sensor": "dagster_batchllm.sensors",
    "stats_metadata": "dagster_batchllm.metadata",
    "BatchInferenceResource": "dagster_batchllm.resource",
    "Endpoint": "dagster_batchllm.resource",
    "ModelPrice": "dagster_batchllm.resource",
    "MlflowModel": "dagster_batchllm.resource",
    "build_scoring_asset": "dagster_batchllm.scoring_assets",
    "build_model_version_asset": "dagster_batchllm.scoring_assets",
    "build_model_alias_sensor": "dagster_batchllm.scoring_assets",
    "PredictionResult": "dagster_batchllm.core.predict",
    "ManagedEndpoint": "dagster_batchllm.resource",
    "InferenceClient": "dagster_batchllm.core.client",
    "InferenceResult": "dagster_batchllm.core.results",
    "InferenceStats": "dagster_batchllm.core.results",
    "InferenceEstimate": "dagster_batchllm.core.results",
    "EndpointSpec": "dagster_batchllm.core.settings",
    "InferenceSettings": "dagster_batchllm.core.settings",
    "Ledger": "dagster_batchllm.core.ledger",
    "BatchLLMError": "dagster_batchllm.core.errors",
    "InferenceConfigError": "dagster_batchllm.core.errors",
    "ErrorType": "dagster_batchllm.core.errors",
    "build_embedding_asset": "dagster_batchllm.embedding_asset",
    "EmbedCall": "dagster_batchllm.core.embed_call",
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
    "build_batch_collect_sensor",
    "build_inference_asset",
    "build_new_data_sensor",
    "build_retry_partitions_sensor",
    "stats_metadata",
    "ManagedEndpoint",
    "ModelPrice",
    "ModelScoringComponent",
    "MlflowModel",
    "PredictionResult",
    "build_scoring_asset",
    "build_model_version_asset",
    "build_model_alias_sensor",
    "EmbedCall",
    "build_embedding_asset",
]

if TYPE_CHECKING:
    from .asset_factory import build_inference_asset
    from .components.inference import BatchInferenceComponent
    from .components.scoring import ModelScoringComponent
    from .core.client import InferenceClient
    from .core.embed_call import EmbedCall
    from .core.errors import BatchLLMError, ErrorType, InferenceConfigError
    from .core.ledger import Ledger
    from .core.predict import PredictionResult
    from .core.results import InferenceEstimate, InferenceResult, InferenceStats
    from .core.settings import EndpointSpec, InferenceSettings
    from .embedding_asset import build_embedding_asset
    from .metadata import stats_metadata
    from .resource import BatchInferenceResource, Endpoint, ManagedEndpoint, MlflowModel, ModelPrice
    from .scoring_assets import (
        build_model_alias_sensor,
        build_model_version_asset,
        build_scoring_asset,
    )
    from .sensors.batches import build_batch_collect_sensor
    from .sensors.retry_partitions import build_new_data_sensor, build_retry_partitions_sensor


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_batchllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
