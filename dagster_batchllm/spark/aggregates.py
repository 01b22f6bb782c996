"""``ai_agg(expr, instruction)`` and ``ai_summarize_agg(expr)`` in Spark SQL: grouped aggregates.

Each is a grouped-aggregate pandas UDF (a Series of the group's values in, one answer out)
registered for SQL, so ``SELECT k, ai_agg(t, 'What do they ask for?') FROM v GROUP BY k``
works as on DuckDB, with the same answers for the same rows (the group's rows are ordered by
content, not by arrival: see :mod:`dagster_batchllm.semantic.chunking`). The executors run
:mod:`.aggregate_worker` (no dagster). The model is the settings' default model (Spark's
fixed-arity UDFs take no optional endpoint); every request asks for ``default_max_tokens``.
Spark hands a pandas aggregate each group on its own, so groups are reduced one at a time per
task, each group's levels concurrently.
"""

from __future__ import annotations

from typing import Any

from .aggregate_worker import AggregateJob, agg_function, summarize_agg_function


def register(spark: Any, ai: Any) -> None:
    """Register both aggregates in ``spark``'s SQL with ``ai``'s (a SparkAI) settings."""
    from pyspark.sql.functions import pandas_udf

    for name, body in (("ai_agg", agg_function), ("ai_summarize_agg", summarize_agg_function)):
        job = AggregateJob(function=name, settings=ai.worker_settings,
                           model=ai.settings.model_when_unnamed, scope=ai.scope or "",
                           partition_key=ai.partition_key or "", run_id=ai.run_id)
        spark.udf.register(name, pandas_udf(body(job), "string").asNondeterministic())
