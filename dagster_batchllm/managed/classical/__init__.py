"""Classical ("traditional AI") models served over the OpenAI chat protocol.

The example pipeline's default endpoint: an extractive summarizer (``local-summarizer``), a
lexicon + VADER classifier with JSON-schema structured output (``local-classifier``), pattern
extraction and masking, and a hashed n-gram embedder (``local-embedder``), all offline and
deterministic.  Tasks they cannot do honestly (translation, grammar correction, free
generation) are refused with :class:`UnsupportedTask`.  See
:mod:`dagster_batchllm.managed.classical.models`.
"""

from .errors import RequestRefused, UnsupportedTask
from .models import EMBEDDING_MODELS, LOCAL_MODELS, ClassicalResponder
from .server import start_local_endpoint

__all__ = ["EMBEDDING_MODELS", "LOCAL_MODELS", "ClassicalResponder", "RequestRefused",
           "UnsupportedTask", "start_local_endpoint"]
