"""``ai_parse_document(content)`` in Spark SQL: a PDF's pages and text layer, no model.

The same function as on DuckDB and SQLite (:mod:`dagster_batchllm.ai_functions.documents`):
``content`` is the PDF's bytes (a BINARY column, as ``read_files(..., format => 'binaryFile')``
or ``spark.read.format("binaryFile")`` gives in ``content``) or a STRING path to it, and the
result is ``STRUCT<page_count, pages: ARRAY<STRUCT<page, text, width, height>>, text, error>``.
A document that cannot be read (encrypted, corrupt, not a PDF, missing) fills ``error`` for its
row only, as does a path the registration's file policy refuses (outside ``files_roots``, by
default the working directory of the Python worker reading the row; a directory, a FIFO, a
device), which is never opened; a NULL content gives a struct of NULL fields (a pandas UDF
cannot return a NULL struct). A pandas UDF (one Arrow batch at a time), deterministic (no model is
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

import pandas as pd

from ..ai_functions import documents
from . import worker


def register_parse_document(spark: Any, settings: Any = None) -> Any:
    """Register ``ai_parse_document`` in ``spark``'s SQL; returns the UDF (a Column function).
    Path rows are read as ``settings``' file policy allows (None: the default policy)."""
    from pyspark.sql.functions import pandas_udf

    def parse_documents(content: pd.Series) -> pd.DataFrame:  # Spark reads the type hints
        return worker.parse_documents(content, settings)

    udf = pandas_udf(parse_documents, documents.PARSED_DOCUMENT.ddl())
    spark.udf.register(documents.NAME, udf)
    return udf
