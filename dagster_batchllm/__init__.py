"""dagster-batchllm: batch LLM inference over tables, as Dagster assets.

The Dagster-facing names are imported lazily, so ``import dagster_batchllm.core.client`` (as Spark
executors and subprocesses do) does not pay for importing dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "build_inference_asset": "dagster_batchllm.factories.inference",
    "BatchInferenceComponent": "dagster_batchllm.components.inference",
    "BatchEmbeddingComponent": "dagster_batchllm.components.embedding",
    "ModelScoringComponent": "dagster_batchllm.components.scoring",
    "build_retry_partitions_sensor": "dagster_batchllm.sensors",
    "build_new_data_sensor": "dagster_batchllm.sensors",
    "build_batch_collect_sensor": "dagster_batchllm.sensors",
    "stats_metadata": "dagster_batchllm.factories.metadata",
    "BatchInferenceResource": "dagster_batchllm.resource",
    "Endpoint": "dagster_batchllm.resource",
    "Price": "dagster_batchllm.core",
    "MlflowModel": "dagster_batchllm.resource",
    "build_scoring_asset": "dagster_batchllm.factories.scoring",
    "build_model_version_asset": "dagster_batchllm.factories.scoring",
    "build_model_alias_sensor": "dagster_batchllm.factories.scoring",
    "PredictionResult": "dagster_batchllm.core",
    "ManagedEndpoint": "dagster_batchllm.resource",
    "InferenceClient": "dagster_batchllm.core",
    "InferenceResult": "dagster_batchllm.core",
    "InferenceStats": "dagster_batchllm.core",
    "InferenceEstimate": "dagster_batchllm.core",
    "Plan": "dagster_batchllm.core",
    "EndpointSpec": "dagster_batchllm.core",
    "InferenceSettings": "dagster_batchllm.core",
    "Ledger": "dagster_batchllm.core",
    "BatchLLMError": "dagster_batchllm.core",
    "InferenceConfigError": "dagster_batchllm.core",
    "ErrorType": "dagster_batchllm.core",
    "build_embedding_asset": "dagster_batchllm.factories.embedding",
    "EmbedCall": "dagster_batchllm.core",
    "build_call_asset": "dagster_batchllm.factories.calls",
    "Cascade": "dagster_batchllm.ai_functions.cascade_options",
}

__all__ = [
    "BatchEmbeddingComponent",
    "BatchInferenceComponent",
    "BatchInferenceResource",
    "BatchLLMError",
    "Cascade",
    "Endpoint",
    "EndpointSpec",
    "ErrorType",
    "InferenceClient",
    "InferenceConfigError",
    "InferenceEstimate",
    "Plan",
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
    "Price",
    "ModelScoringComponent",
    "MlflowModel",
    "PredictionResult",
    "build_scoring_asset",
    "build_model_version_asset",
    "build_model_alias_sensor",
    "EmbedCall",
    "build_embedding_asset",
    "build_call_asset",
]

if TYPE_CHECKING:
    from .components.embedding import BatchEmbeddingComponent
    from .components.inference import BatchInferenceComponent
    from .components.scoring import ModelScoringComponent
    from .core import (
        BatchLLMError,
        EmbedCall,
        EndpointSpec,
        ErrorType,
        InferenceClient,
        InferenceConfigError,
        InferenceEstimate,
        InferenceResult,
        InferenceSettings,
        InferenceStats,
        Ledger,
        Plan,
        PredictionResult,
        Price,
    )
    from .factories.calls import build_call_asset
    from .factories.embedding import build_embedding_asset
    from .factories.inference import build_inference_asset
    from .factories.metadata import stats_metadata
    from .factories.scoring import (
        build_model_alias_sensor,
        build_model_version_asset,
        build_scoring_asset,
    )
    from .resource import BatchInferenceResource, Endpoint, ManagedEndpoint, MlflowModel
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
