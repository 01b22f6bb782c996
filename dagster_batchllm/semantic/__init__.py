"""Semantic operators over tables: filter by a natural-language predicate, classify, and
model cascades that pay the large model only for the rows a small one is unsure of.

``Cascade`` (:mod:`dagster_batchllm.ai_functions.cascade_options`, beside the AI-function
catalogue that reads it) is the options object; :mod:`.cascade` the algorithm; :mod:`.scored`
the proxy's replies with their logprobs; :mod:`.filter` ``llm.filter`` and ``llm.classify``.
None of it imports dagster (Spark executors run cascades too).
"""

from ..ai_functions.cascade_options import Cascade
from .cascade import CascadeReport
from .filter import SemanticResult, classify_rows, filter_rows

__all__ = ["Cascade", "CascadeReport", "SemanticResult", "classify_rows", "filter_rows"]
