"""``ai_query`` on an embedding model: each row's text becomes its vector, ``ARRAY<FLOAT>``.

Databricks' ``ai_query`` on an embedding endpoint returns ``ARRAY<FLOAT>``; here so does an
``ai_query`` whose endpoint is one of the endpoints' ``embedding_models``: DuckDB ``FLOAT[]``
(so ``list_cosine_similarity`` works on it), SQLite a JSON array text, Spark SQL
``ARRAY<FLOAT>``. The rows go through ``embed()`` (many inputs per request, each text keyed in
the ledger on its own). Only ``failOnError`` applies; the options of a chat request do not.

Example::

    >>> from dagster_batchllm.ai_functions.embeddings import embedding_result_type
    >>> embedding_result_type({"failOnError": True}).ddl()
    'ARRAY<FLOAT>'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import InferenceConfigError
from .calls import as_bool, result_struct
from .types import FLOAT, SQLType

EMBEDDING = SQLType("ARRAY", (FLOAT,))
# The ai_query options a chat request uses, which an embedding model has no use for.
_CHAT_OPTIONS = ("returnType", "modelParameters", "responseFormat")


def embedding_result_type(options: Mapping[str, Any], model: str = "") -> SQLType:
    """The SQL type of ``ai_query`` on an embedding model, its options checked."""
    given = [name for name in _CHAT_OPTIONS if options.get(name) not in (None, "", {})]
    if given and not (given == ["returnType"]
                      and str(options["returnType"]).replace(" ", "").upper() == "ARRAY<FLOAT>"):
        raise InferenceConfigError(
            f"ai_query: '{model}' is an embedding model: it returns ARRAY<FLOAT> and takes no "
            f"{', '.join(given)} (only failOnError).")
    fail = as_bool("ai_query", "failOnError", options.get("failOnError"), True)
    return EMBEDDING if fail else result_struct(EMBEDDING)


def literal_endpoint(text: str | None) -> str | None:
    """The model a SQL string literal names, from the literal as written (``'bge'``), or None
    when the argument is not a literal (a column, a parameter)."""
    if not text or len(text) < 2 or text[0] != "'" or text[-1] != "'":
        return None
    return text[1:-1].replace("''", "'")
