"""Many models: ``groupBy(model).applyInPandas``, as Databricks recommends for per-group models.

Each group (all rows of one model, or of one model and one bucket) is one pandas frame in one
Python worker, sent through that worker's client for the settings: one client per model per
worker process, created once and reused by every group and task the process runs.

One group is one task, so a model with most of the rows would leave the other slots idle and
hold its rows in one worker's memory: ``buckets_per_model`` splits each model's rows over that
many groups by a hash of the prompt inputs. For a single model, ``ai_query_col`` parallelizes
by partition instead and needs no shuffle.

Example::

    from dagster_batchllm.spark import infer_grouped, register_ai_functions

    register_ai_functions(spark, llm)
    out = infer_grouped(df, model_column="model", prompt="Summarize: {transcript_text}",
                        output_column="summary", max_tokens=128)
    out.select("call_id", "model", "summary.result", "summary.errorMessage")
"""

from __future__ import annotations

from typing import Any

from ..core import InferenceConfigError, template_fields
from . import worker
from .active import SparkBinding, active_ai
from .job import RESULT_STRUCT_DDL, ROUTED_MODEL_COLUMN

_BUCKET = "_batchllm_bucket"


def infer_grouped(df: Any, *, model_column: str, prompt: str | None = None,
                  prompt_column: str | None = None, system: str | None = None,
                  output_column: str = "output", fail_on_error: bool = False,
                  buckets_per_model: int = 1, max_tokens: int | None = None,
                  temperature: float | None = None, response_format: Any = None,
                  token_budget: int | None = None, partition_key: str | None = None,
                  run_id: str | None = None, scope: str | None = None,
                  ai: SparkBinding | None = None, **params: Any) -> Any:
    """``df`` plus ``output_column``, each row answered by the model its ``model_column`` names.

    ``prompt`` is a template over columns (``"Summarize: {text}"``) or ``prompt_column`` names
    the column holding the prompt. Like ``infer``, rows are never dropped: by default
    ``output_column`` is ``struct<result: string, errorMessage: string>``; with
    ``fail_on_error=True`` it is a string and a failed row fails the task.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    ai = ai or active_ai()
    if (prompt is None) == (prompt_column is None):
        raise InferenceConfigError("infer_grouped: pass exactly one of prompt= or prompt_column=.")
    needed = [model_column, *(template_fields(prompt) if prompt else [prompt_column])]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"infer_grouped: column(s) {missing} are not in the DataFrame; it has {df.columns}.")
    if output_column in df.columns:
        raise InferenceConfigError(
            f"infer_grouped: the DataFrame already has a column '{output_column}'; choose "
            "another output_column.")
    if buckets_per_model < 1:
        raise InferenceConfigError("infer_grouped: buckets_per_model must be at least 1.")
    job = ai.job(fail_on_error=fail_on_error, prompt=prompt, prompt_column=prompt_column,
                 model_column=ROUTED_MODEL_COLUMN, max_tokens=max_tokens,
                 temperature=temperature, response_format=response_format, system=system,
                 token_budget=token_budget, partition_key=partition_key, run_id=run_id,
                 scope=scope, **params)
    struct = not fail_on_error
    output_type = StructType.fromDDL(RESULT_STRUCT_DDL) if struct else StringType()
    schema = StructType([*df.schema.fields, StructField(output_column, output_type, True)])
    keys = [model_column]
    drop: tuple[str, ...] = ()
    if buckets_per_model > 1:
        inputs = [F.col(c) for c in needed[1:]]
        df = df.withColumn(_BUCKET, F.pmod(F.xxhash64(*inputs), F.lit(buckets_per_model)))
        keys.append(_BUCKET)
        drop = (_BUCKET,)
    function = worker.group_function(job, model_column=model_column, output_column=output_column,
                                     struct=struct, drop_columns=drop)
    return df.groupBy(*keys).applyInPandas(function, schema=schema)
