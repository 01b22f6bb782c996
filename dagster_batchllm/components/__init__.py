"""Components: inference, embedding and scoring assets declared in ``defs.yaml``."""

from .embedding import BatchEmbeddingComponent
from .inference import BatchInferenceComponent
from .scoring import ModelScoringComponent

__all__ = ["BatchEmbeddingComponent", "BatchInferenceComponent", "ModelScoringComponent"]
