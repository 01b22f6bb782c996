"""Classical ("traditional AI") models served over the OpenAI chat protocol.

The example pipeline's default endpoint: an extractive summarizer (``local-summarizer``) and
a lexicon + VADER classifier with JSON-schema structured output (``local-classifier``), all
offline and deterministic.  See :mod:`dagster_batchllm.managed.classical.models`.
"""

from .models import LOCAL_MODELS, ClassicalResponder
from .server import start_local_endpoint

__all__ = ["LOCAL_MODELS", "ClassicalResponder", "start_local_endpoint"]
