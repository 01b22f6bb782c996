"""``ai_query_col``: ``ai_query`` as a DataFrame column expression.

The column is a pandas UDF: Spark hands it one Arrow batch at a time (up to
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) and the whole batch goes to ``infer``,
which sends its rows concurrently through the endpoint pool, not one by one.

Example::

    from pyspark.sql import functions as F
    from dagster_batchllm.spark import ai_query_col, register_ai_functions

    register_ai_functions(spark, llm)
    df = df.withColumn("summary", ai_query_col(
        "llama-70b", F.concat(F.lit("Summarize this call transcript: "), "transcript_text"),
        max_tokens=128))
    # Errors as data instead of a failed stage: a struct<result, errorMessage> column.
    df = df.withColumn("checked", ai_query_col("llama-70b", "transcript_text",
                                               fail_on_error=False))
    df.where("checked.errorMessage IS NOT NULL")
    # Images with the prompt: a BINARY column (spark.read.format("binaryFile")'s content), a
    # STRING path or URL, or an ARRAY of those; a NULL image gives NULL without a request.
    pages = spark.read.format("binaryFile").load("scans/*.png")
    pages.withColumn("fields", ai_query_col("llava", F.lit("Extract the invoice fields"),
                                            images="content", response_format=schema))
"""

from __future__ import annotations

from typing import Any

from . import worker
from .active import SparkBinding, active_ai
from .job import RESULT_STRUCT_DDL


def ai_query_col(model: Any, prompt: Any, *, images: Any = None, fail_on_error: bool = True,
                 max_tokens: int | None = None, temperature: float | None = None,
                 response_format: Any = None, system: str | None = None,
                 token_budget: int | None = None, partition_key: str | None = None,
                 run_id: str | None = None, scope: str | None = None,
                 ai: SparkBinding | None = None, **params: Any) -> Any:
    """A column answering ``prompt`` (a Column or column name) with ``model`` per row.

    ``model`` is a served model name (or an endpoint serving one model), or a Column to route
    each row to its own model. With ``fail_on_error`` (the default, as in Databricks) a failed
    row fails the task; with ``fail_on_error=False`` the column is
    ``struct<result: string, errorMessage: string>`` and no row fails the stage. Other keyword
    arguments are generation parameters (``top_p``, ``stop``, ``seed`` ...). A
    ``response_format`` (JSON schema) makes each result the reply's JSON text. ``images`` (a
    Column or column name: BINARY bytes, STRING paths or URLs, or ARRAYs of them) goes with
    each row's prompt as image parts (see ``infer(images=...)``); a bad file fails only its row.
    A pandas UDF holds its whole Arrow batch, and Spark's default batch is 10,000 rows (2 GB
    of 200 KB images): for BINARY images lower ``spark.sql.execution.arrow.maxRecordsPerBatch``
    (256 keeps a task's images near 50 MB); paths hold only their text.
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    ai = ai or active_ai()
    if isinstance(model, Column):
        model_col = model
    else:
        model_col = F.lit(ai.check_model(str(model), "ai_query_col"))
    prompt_col = prompt if isinstance(prompt, Column) else F.col(prompt)
    job = ai.job(fail_on_error=fail_on_error, max_tokens=max_tokens, temperature=temperature,
                 response_format=response_format, system=system, token_budget=token_budget,
                 partition_key=partition_key, run_id=run_id, scope=scope, **params)
    struct = not fail_on_error
    udf = pandas_udf(worker.column_function(job, struct),
                     RESULT_STRUCT_DDL if struct else "string").asNondeterministic()
    if images is None:
        return udf(model_col, prompt_col)
    return udf(model_col, prompt_col, images if isinstance(images, Column) else F.col(images))
