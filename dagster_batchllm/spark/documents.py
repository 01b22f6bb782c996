"""``ai_parse_document(content)`` in Spark SQL: a PDF's pages and text layer, no model.

The same function as on DuckDB and SQLite (:mod:`dagster_batchllm.ai_functions.documents`):
``content`` is the PDF's bytes (a BINARY column, as ``read_files(..., format => 'binaryFile')``
or ``spark.read.format("binaryFile")`` gives in ``content``) or a STRING path to it, and the
result is ``STRUCT<page_count, pages: ARRAY<STRUCT<page, text, width, height>>, text, error>``.
A document that cannot be read (encrypted, corrupt, not a PDF, missing) fills ``error`` for its
row only; a NULL content gives a struct of NULL fields (a pandas UDF cannot return a NULL
struct). A pandas UDF (one Arrow batch at a time), deterministic (no model is
asked), so Spark may evaluate it as often as its plan needs.

Example::

    register_ai_functions(spark, llm)  # registers ai_parse_document too
    spark.read.format("binaryFile").load("/data/invoices/*.pdf").createOrReplaceTempView("pdfs")
    spark.sql('''
        SELECT path, ai_parse_document(content).page_count AS pages,
               ai_query('llama-70b', 'Extract the total: ' || ai_parse_document(content).text)
        FROM pdfs''')
"""

from __future__ import annotations

from typing import Any

from ..ai_functions import documents
from . import worker


def register_parse_document(spark: Any) -> Any:
    """Register ``ai_parse_document`` in ``spark``'s SQL; returns the UDF (a Column function)."""
    from pyspark.sql.functions import pandas_udf

    udf = pandas_udf(worker.parse_documents, documents.PARSED_DOCUMENT.ddl())
    spark.udf.register(documents.NAME, udf)
    return udf
