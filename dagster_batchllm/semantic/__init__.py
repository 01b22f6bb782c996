"""Semantic operators over tables: filter by a natural-language predicate, classify, and
model cascades that pay the large model only for the rows a small one is unsure of.

``Cascade`` (:mod:`.options`) is the options object; :mod:`.cascade` the algorithm;
:mod:`.scored` the proxy's replies with their logprobs; :mod:`.filter` ``llm.filter`` and
``llm.classify``. None of it imports dagster (Spark executors run cascades too). Names are
imported on first use: the AI-function catalogue imports ``Cascade`` from here, and this
package's operators import the catalogue.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Cascade": "dagster_batchllm.semantic.options",
    "CascadeReport": "dagster_batchllm.semantic.cascade",
    "SemanticResult": "dagster_batchllm.semantic.filter",
    "filter_rows": "dagster_batchllm.semantic.filter",
    "classify_rows": "dagster_batchllm.semantic.filter",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_batchllm.semantic' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
