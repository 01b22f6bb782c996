"""Components: inference assets declared in ``defs.yaml``."""

from .inference import BatchInferenceComponent

__all__ = ["BatchInferenceComponent"]
