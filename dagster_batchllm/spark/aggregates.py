"""``ai_agg(expr, instruction[, endpoint])`` and ``ai_summarize_agg(expr[, endpoint])`` in Spark
SQL: grouped aggregates.

Each is a grouped-aggregate pandas UDF (a Series of the group's values in, one answer out)
registered for SQL through a function builder (:mod:`.builders`), which Spark calls while it
analyses the query: it checks the arguments (their number; the endpoint a constant naming a
served model) before any task starts, and hands the UDF a NULL endpoint where none is given
(then the default model). So ``SELECT k, ai_agg(t, 'What do they ask for?') FROM v GROUP BY
k`` works as on DuckDB, with the same answers for the same rows (the group's rows are ordered
by content, not by arrival: see :mod:`dagster_batchllm.ai_functions.chunking`). The executors run
:mod:`.aggregate_worker` (no dagster). Every request asks for ``default_max_tokens``. Spark
hands a pandas aggregate each group on its own, so groups are reduced one at a time per task,
each group's levels concurrently.
"""

from __future__ import annotations

from typing import Any

from ..ai_functions.aggregates import AGGREGATES, AggregateFunction
from ..core import InferenceConfigError
from .aggregate_worker import AggregateJob, aggregate_function
from .builders import register_builder
from .model_sql import constant


def register(spark: Any, ai: Any) -> dict[str, Any]:
    """Register both aggregates in ``spark``'s SQL with ``ai``'s (a SparkAI) settings; returns
    name -> builder (Spark's registry holds only a py4j proxy of it: keep it alive)."""
    from pyspark.sql.functions import pandas_udf

    builders: dict[str, Any] = {}
    for spec in AGGREGATES.values():
        job = AggregateJob(function=spec.name, settings=ai.worker_settings,
                           model=ai.settings.model_when_unnamed, scope=ai.scope or "",
                           partition_key=ai.partition_key or "", run_id=ai.run_id,
                           aliases=dict(ai.aliases))
        udf = pandas_udf(aggregate_function(job), "string").asNondeterministic()
        builders[spec.name] = AggregateBuilder(ai, spec, udf._unwrapped._judf)
        register_builder(spark, spec.name, builders[spec.name])
    return builders


class AggregateBuilder:
    """Spark's ``FunctionBuilder`` for one aggregate: checks the call on the driver, then hands
    the UDF (expr, instruction, endpoint), NULL for those not given."""

    def __init__(self, ai: Any, spec: AggregateFunction, judf: Any):
        self.ai, self.spec, self.judf = ai, spec, judf

    def apply(self, expressions: Any) -> Any:
        spec = self.spec
        given = [expressions.apply(i) for i in range(expressions.length())]
        if any(e.getClass().getSimpleName() == "NamedArgumentExpression" for e in given):
            raise InferenceConfigError(
                f"{spec.name} takes its arguments by position: {spec.signature()}.")
        if not len(spec.params) - 1 <= len(given) <= len(spec.params):
            raise InferenceConfigError(
                f"{spec.name} takes {len(spec.params) - 1} to {len(spec.params)} arguments, "
                f"got {len(given)}: {spec.signature()}.")
        arguments = dict(zip(spec.params, given, strict=False))
        endpoint = arguments.get("endpoint")
        if endpoint is not None:
            if not endpoint.foldable() or not isinstance(constant(endpoint), str):
                raise InferenceConfigError(
                    f"{spec.name}: argument 'endpoint' must be a constant STRING naming a "
                    f"served model: {spec.signature()}.")
            self.ai.check_model(constant(endpoint), where=spec.name)
        elif self.ai.settings.model_when_unnamed is None:
            raise InferenceConfigError(
                f"{spec.name}: no default model; pass the argument 'endpoint' (one of "
                f"{sorted(self.ai.settings.models)}) or set default_model in the settings.")
        jvm = self.ai.spark._jvm
        null = _null_string(jvm)
        padded = [arguments.get(name, null) for name in ("expr", "instruction", "endpoint")]
        listed = jvm.java.util.ArrayList()
        for expression in padded:
            listed.add(expression)
        return self.judf.builder(
            jvm.scala.jdk.javaapi.CollectionConverters.asScala(listed).toSeq())

    class Java:
        implements = ["scala.Function1"]


def _null_string(jvm: Any) -> Any:
    """A Catalyst NULL of type STRING (a bare NULL's type has no Arrow form)."""
    string_type = getattr(getattr(jvm.org.apache.spark.sql.types, "StringType$"), "MODULE$")
    return jvm.org.apache.spark.sql.catalyst.expressions.Literal(None, string_type)
