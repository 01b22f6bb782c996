"""``ai_query`` and the Databricks AI functions in SQL, on DuckDB and SQLite.

One call installs them on a connection, backed by the same inference core as
``BatchInferenceResource.infer`` (endpoint pool, retries, token budgets, results ledger)::

    import duckdb
    from dagster_batchllm.sql import register_ai_functions

    con = duckdb.connect()
    register_ai_functions(con, llm)  # a BatchInferenceResource, InferenceClient or settings
    con.sql(\"\"\"
        SELECT call_id,
               ai_query('llama-70b', 'Summarize this call transcript: ' || transcript) AS summary,
               ai_classify(transcript, ['refund', 'complaint', 'question']) AS topic,
               ai_query('llama-70b', transcript,
                        responseFormat := 'STRUCT<risk: STRING, score: INT>') AS assessment
        FROM call_center_transcripts
    \"\"\").df()

Functions: ``ai_query(endpoint, request, returnType, failOnError, modelParameters,
responseFormat, files)``, ``ai_summarize(content[, max_words])``, ``ai_classify(content, labels)``,
``ai_extract(content, labels)``, ``ai_analyze_sentiment(content)``, ``ai_translate(content,
to_lang)``, ``ai_fix_grammar(content)``, ``ai_mask(content, labels)``, ``ai_gen(prompt)``,
``ai_similarity(expr1, expr2)``; each AI function also takes an optional ``endpoint``.
``ai_query``'s ``files`` (Databricks' ``files => content``: a BLOB, or a path or URL) sends each
row's image with its request; ``ai_parse_document(content)`` reads a PDF's pages without a model
(a STRUCT on DuckDB, JSON text on SQLite).

Calls are batched: DuckDB passes whole vectors (see :mod:`.duckdb_engine`); on SQLite run
statements through :func:`execute` (see :mod:`.sqlite_engine` for the two-pass plan). Identical
requests are sent once, and answers already in the ledger are not sent again, so rerunning a
query sends nothing new. NULL inputs, and text that is empty or only whitespace, give NULL
without a request. ``ai_classify``, ``ai_analyze_sentiment``, ``ai_extract`` and
``ai_similarity`` ask the model for JSON: a reply they cannot read is NULL for that row (as
Databricks documents for the first two), not a failed query.

Databricks SQL runs as written with ``execute(con, query, dialect="databricks")``: sqlglot
translates it for the engine, and what cannot be translated faithfully is refused before anything
is sent (see :mod:`.dialects`). :mod:`dagster_batchllm.testing.databricks.documented` holds
Databricks' documented examples, which ``bench/sql_compat.py`` runs on every engine.
"""

from ..ai_functions.catalogue import FUNCTIONS
from ..ai_functions.outcomes import AIQueryError
from ..ai_functions.types import SQLType, parse_type
from .api import AIFunctions, execute, handle_for, register_ai_functions
from .dialects import TranslationError, translate

__all__ = [
    "FUNCTIONS",
    "AIFunctions",
    "AIQueryError",
    "SQLType",
    "TranslationError",
    "execute",
    "handle_for",
    "parse_type",
    "register_ai_functions",
    "translate",
]
