"""``ai_query`` in Spark SQL on a traditional ML model (MLflow): Databricks' custom-model form,
``ai_query('<model>', named_struct('f1', a, 'f2', b), returnType => 'DOUBLE')``.

The ``ai_query`` builder hands a call whose endpoint names a scoring model (one of the settings'
``mlflow_models`` or a model an ``mlflow`` endpoint serves) to :func:`scoring_expression`: the
struct's field names are the model's features, and the expression is the pandas UDF of
:func:`~.models.model_udf` with ``use_ledger=True`` over the struct (the model loaded once per
Python worker, rows looked up in the ledger first, as every ``ai_query`` here). With
``failOnError => false`` the result is ``STRUCT<result, errorMessage>``.
"""

from __future__ import annotations

from typing import Any

from ..ai_functions.types import parse_type
from ..core import InferenceConfigError, PredictCall
from .model_worker import ERROR_FIELD, RESULT_FIELD, ModelJob, scalar_function


def constant(expression: Any) -> Any:
    """A foldable expression's value: str, bool or number (UTF8String becomes str)."""
    value = expression.eval(None)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value.toString())


def scoring_model(ai: Any, arguments: dict[str, Any]) -> str | None:
    """The scoring model a constant endpoint names, or None (a chat model: the usual path)."""
    endpoint = arguments["endpoint"]
    if not endpoint.foldable():
        return None
    name = constant(endpoint)
    return name if isinstance(name, str) and name in ai.settings.scoring_models else None


def scoring_expression(ai: Any, model: str, arguments: dict[str, Any]) -> Any:
    from pyspark.sql.functions import pandas_udf

    from ..core import resolve_models, single_required_input

    models = resolve_models(ai.settings, [model])
    if models[model].error:
        raise InferenceConfigError(f"ai_query: {models[model].error}")
    request = arguments["request"]
    kind = request.dataType()
    jvm = ai.spark._jvm
    if kind.typeName() == "struct":
        names = [str(n) for n in kind.fieldNames()]
    else:  # one plain value: the model's one required input (the seed's ai_query form)
        single = single_required_input(models[model])
        if single is None:
            raise InferenceConfigError(
                f"ai_query: '{model}' is a custom model that takes its inputs by name: pass "
                f"named_struct('feature', value, ...), got a {kind.simpleString()} request")
        names = [single]
        expressions = jvm.org.apache.spark.sql.catalyst.expressions
        request = expressions.CreateNamedStruct(
            scala_seq(jvm, [string_literal(jvm, single), request]))
    declared = constant(arguments["returnType"]) if "returnType" in arguments else None
    result_type = parse_type(str(declared)).ddl().lower() if declared else "string"
    fail = "failOnError" not in arguments or constant(arguments["failOnError"]) is not False
    call = PredictCall(input_columns=tuple(names), model=model, output_column="prediction",
                       partition_key=ai.partition_key or "", scope=ai.scope or "")
    job = ModelJob(settings=ai.worker_settings, call=call, models=tuple(models.items()),
                   result_type=result_type, fail_on_error=fail, run_id=ai.run_id,
                   # As every ai_query here: answers kept, so a rerun of the query is free.
                   use_ledger=True)
    output = result_type if fail else \
        f"struct<{RESULT_FIELD}: {result_type}, {ERROR_FIELD}: string>"
    udf = pandas_udf(scalar_function(job, names), output).asNondeterministic()
    return udf._unwrapped._judf.builder(scala_seq(jvm, [request]))


def string_literal(jvm: Any, text: str) -> Any:
    """A Catalyst STRING literal."""
    string_type = getattr(getattr(jvm.org.apache.spark.sql.types, "StringType$"), "MODULE$")
    return jvm.org.apache.spark.sql.catalyst.expressions.Literal(
        jvm.org.apache.spark.unsafe.types.UTF8String.fromString(text), string_type)


def scala_seq(jvm: Any, items: list[Any]) -> Any:
    """A Scala ``Seq`` of these Java objects (expressions, for a function builder)."""
    listed = jvm.java.util.ArrayList()
    for item in items:
        listed.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(listed).toSeq()
