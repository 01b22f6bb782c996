"""From row outcomes to SQL values, and the error a query fails with.

A row's outcome is ``(value, error)``. With ``failOnError`` true (the default, as in Databricks)
any row error fails the whole query with :class:`AIQueryError`; the rows answered before it stay
in the ledger, so the rerun sends only what failed. With ``failOnError`` false every row gets
``{"result": value, "errorMessage": error}`` and the query goes on. The other AI functions have
no ``failOnError``: a failed request fails the query, an unreadable reply is NULL.

Example::

    >>> from dagster_batchllm.ai_functions.outcomes import as_json
    >>> as_json({"risk": "high"})
    '{"risk": "high"}'
"""

from __future__ import annotations

import json
from typing import Any

from ..core import BatchLLMError


class AIQueryError(BatchLLMError, RuntimeError):
    """Rows of an AI function call failed while ``failOnError`` was true.

    The one class for every engine: a DuckDB or SQLite query fails with it, and so does a Spark
    task (and with it the query), as ``dagster_batchllm.sql.AIQueryError`` and
    ``dagster_batchllm.spark.AIQueryError`` alike.
    """


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def with_error(value: Any, error: str | None) -> str:
    """Databricks' ``failOnError => false`` result, as JSON text."""
    return as_json({"result": value, "errorMessage": error})


def failure(function: str, errors: list[str], rows: int) -> AIQueryError:
    """The error a query fails with when rows of ``function`` failed.

    ``ai_query`` fails because its ``failOnError`` is true; the other AI functions have no
    such argument (as in Databricks), so the message does not offer one. Their replies that
    cannot be read are NULL, not failures (see ``BoundCall.null_when_unreadable``): what fails
    them is the request itself (an HTTP error after retries, a prompt over the context length).
    """
    kept = "Answered rows are kept in the ledger, so a rerun sends only the failed ones"
    if function == "ai_query":
        return AIQueryError(
            f"ai_query failed for {len(errors)} of the {rows} rows in a batch (failOnError is "
            f"true); first error: {errors[0]}. {kept}; pass failOnError => false (Databricks "
            "SQL), failOnError := false (DuckDB) or a false fourth argument (SQLite) to get "
            "the errors as data.")
    return AIQueryError(
        f"{function} failed for {len(errors)} of the {rows} rows in a batch; first error: "
        f"{errors[0]}. {function} has no failOnError argument (as in Databricks): a request "
        f"that fails fails the query, while a reply that cannot be read is NULL. {kept}.")
