"""Embeddings on Spark: ``embed_col`` and ``ai_query('<embedding model>', text)`` in Spark SQL.

Both are pandas UDFs over :mod:`.embed_worker`: Spark hands them one Arrow batch at a time and
the batch's texts go through ``embed()`` (many inputs per request, each text keyed in the
ledger). The column is ``ARRAY<FLOAT>``, or ``STRUCT<result: ARRAY<FLOAT>, errorMessage:
STRING>`` with ``fail_on_error=False`` (``failOnError => false`` in SQL), as Databricks'
``ai_query`` on an embedding endpoint. The call's token budget is not applied to embeddings
on Spark: a SparkAI with a ``token_budget`` refuses them rather than overrun it.

Example::

    from dagster_batchllm.spark import embed_col, register_ai_functions

    register_ai_functions(spark, llm)
    df = df.withColumn("embedding", embed_col("bge-large", "transcript_text"))
    spark.sql("SELECT ai_query('bge-large', transcript_text) AS embedding FROM calls")
"""

from __future__ import annotations

from typing import Any

from ..ai_functions.embeddings import embedding_result_type
from ..core import InferenceConfigError
from . import embed_worker
from .active import SparkBinding, active_ai
from .embed_worker import VECTOR_DDL, VECTOR_STRUCT_DDL, EmbedJob, executor_embed_call


def embedding_job(ai: SparkBinding, *, fail_on_error: bool, model: str | None = None,
                  dimensions: int | None = None, inputs_per_request: int = 64,
                  partition_key: str | None = None, run_id: str | None = None,
                  scope: str | None = None, where: str = "embed_col") -> EmbedJob:
    """A checked :class:`~.embed_worker.EmbedJob` (mistakes raise here, on the driver)."""
    if ai.token_budget is not None:
        raise InferenceConfigError(
            f"{where}: this SparkAI has a token_budget, which embeddings on Spark do not "
            "apply yet; register the functions without one to embed.")
    if model is not None:
        check_embedding_model(ai, model, where)
    call = executor_embed_call(
        model=model, dimensions=dimensions, inputs_per_request=inputs_per_request,
        partition_key=partition_key if partition_key is not None else ai.partition_key,
        scope=scope if scope is not None else ai.scope)
    return EmbedJob(settings=ai.worker_settings, call=call, fail_on_error=fail_on_error,
                    run_id=run_id if run_id is not None else ai.run_id)


def check_embedding_model(ai: SparkBinding, model: str, where: str) -> str:
    served = ai.settings.embedding_models
    if model not in served:
        raise InferenceConfigError(
            f"{where}: no configured endpoint serves embedding model '{model}'; served "
            f"embedding models: {sorted(served)} (an Endpoint's embedding_models=[...]).")
    return model


def embed_col(model: str, text: Any, *, fail_on_error: bool = True,
              dimensions: int | None = None, inputs_per_request: int = 64,
              partition_key: str | None = None, run_id: str | None = None,
              scope: str | None = None, ai: SparkBinding | None = None) -> Any:
    """A column of ``model``'s vectors of ``text`` (a Column or column name): ``ARRAY<FLOAT>``,
    or ``STRUCT<result, errorMessage>`` with ``fail_on_error=False``. NULL or blank text is
    NULL without a request."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    ai = ai or active_ai()
    job = embedding_job(ai, fail_on_error=fail_on_error, model=model, dimensions=dimensions,
                        inputs_per_request=inputs_per_request, partition_key=partition_key,
                        run_id=run_id, scope=scope)
    struct = not fail_on_error
    udf = pandas_udf(embed_worker.column_function(job, struct),
                     VECTOR_STRUCT_DDL if struct else VECTOR_DDL).asNondeterministic()
    return udf(text if isinstance(text, Column) else F.col(text))


class EmbeddingQueries:
    """The SQL ``ai_query`` UDFs for embedding models, chosen by the query builder."""

    def __init__(self, ai: SparkBinding):
        from pyspark.sql.functions import pandas_udf

        self.ai = ai
        if not ai.settings.embedding_models or ai.token_budget is not None:
            self.as_vector = self.as_struct = None  # ai_query then refuses embedding models
            return
        job = embedding_job(ai, fail_on_error=True, where="ai_query")
        self.as_vector = pandas_udf(embed_worker.sql_function(job, False), VECTOR_DDL
                                    ).asNondeterministic()._unwrapped._judf
        self.as_struct = pandas_udf(
            embed_worker.sql_function(job.replace(fail_on_error=False), True),
            VECTOR_STRUCT_DDL).asNondeterministic()._unwrapped._judf

    def udf_for(self, model: Any, options: dict[str, Any]) -> Any:
        """The UDF that embeds for ``model`` (a constant endpoint), or None for a chat model."""
        if not isinstance(model, str) or model not in self.ai.settings.embedding_models:
            return None
        if self.as_vector is None:
            embedding_job(self.ai, fail_on_error=True, where="ai_query")  # raises, saying why
        fail = embedding_result_type(options, model).name == "ARRAY"
        return self.as_vector if fail else self.as_struct
