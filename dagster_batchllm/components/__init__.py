"""Components: inference and scoring assets declared in ``defs.yaml``."""

from .inference import BatchInferenceComponent
from .scoring import ModelScoringComponent

__all__ = ["BatchInferenceComponent", "ModelScoringComponent"]
