"""The Databricks AI functions in Spark SQL, over the SQL module's catalogue.

``register_ai_functions(spark, llm)`` registers, next to ``ai_query``: ``ai_summarize(content[,
max_words])``, ``ai_classify(content, labels)``, ``ai_extract(content, labels)``,
``ai_analyze_sentiment(content)``, ``ai_translate(content, to_lang)``,
``ai_fix_grammar(content)``, ``ai_mask(content, labels)``, ``ai_gen(prompt)`` and
``ai_similarity(expr1, expr2)``; each also takes an optional ``endpoint`` (a served model or an
endpoint serving one model; by default the settings' ``default_model``, else the only served
model). Arguments may be named (``ai_summarize(t, endpoint => 'llama-70b')``).

What a function sends and how its reply is read (system prompt, JSON schema, reader) comes from
:data:`dagster_batchllm.ai_functions.catalogue.FUNCTIONS`, so DuckDB, SQLite and Spark send
identical requests and share answers through the ledger. The executor path is ``ai_query``'s: a
nondeterministic pandas UDF answers each Arrow batch through the worker's cached client (shared
budget and limits included); executors import neither dagster nor pyspark-side code from here.

Result types:

* STRING: ``ai_summarize``, ``ai_translate``, ``ai_fix_grammar``, ``ai_mask``, ``ai_gen``,
  ``ai_classify`` (one of the labels) and ``ai_analyze_sentiment`` (positive, negative, neutral
  or mixed).
* ``ai_extract``: a JSON STRING, an object with one key per label (the entity found, or null).
  Databricks returns a STRUCT; read it as one with
  ``from_json(ai_extract(t, array('person', 'place')), 'person STRING, place STRING')``.
* ``ai_similarity``: DOUBLE, from 0 to 1.

NULL content, or content that is empty or only whitespace (either text of ``ai_similarity``),
gives NULL without a request. Option arguments (``max_words``, ``labels``, ``to_lang``) must be
constants; they are checked while the query is analysed, before any task starts. A reply that
cannot be read (``ai_classify``, ``ai_analyze_sentiment``, ``ai_extract``, ``ai_similarity`` ask
for JSON) is NULL, as Databricks documents for the first two. A request that fails fails the
task (Databricks' AI functions have no ``failOnError``) after the batch's answered rows are
written to the ledger, so a rerun sends only the failed rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..ai_functions.calls import sendable
from ..ai_functions.catalogue import AI_FUNCTIONS, REQUIRED, AIFunction, read_result
from ..ai_functions.outcomes import failure
from ..core import InferenceConfigError
from . import worker
from .builders import register_builder
from .job import MODEL_COLUMN, PROMPT_COLUMN, SparkJob

# The Spark type of each function's result; anything not listed is a STRING.
SPARK_TYPES = {"ai_similarity": "double", "ai_filter": "boolean"}
_NAMES = tuple(f.name for f in AI_FUNCTIONS)


def register(spark: Any, ai: Any, job: SparkJob) -> dict[str, Any]:
    """Register the nine AI functions in ``spark``'s SQL; returns name -> builder."""
    from pyspark.sql.functions import pandas_udf

    default = ai.settings.model_when_unnamed
    builders: dict[str, Any] = {}
    for function in AI_FUNCTIONS:
        body = ai_function(job, function.name, default)
        udf = pandas_udf(body, SPARK_TYPES.get(function.name, "string")).asNondeterministic()
        builder = AIFunctionBuilder(ai, function, default, udf._unwrapped._judf)
        register_builder(spark, function.name, builder)
        builders[function.name] = builder
    return builders


class AIFunctionBuilder:
    """Spark's ``FunctionBuilder`` for one AI function: checks the call on the driver while
    the query is analysed, then hands every argument to the function's pandas UDF."""

    def __init__(self, ai: Any, function: AIFunction, default_model: str | None, judf: Any):
        self.ai = ai
        self.function = function
        self.default_model = default_model
        self.judf = judf

    def apply(self, expressions: Any) -> Any:
        check_call(self.ai, self.function, self.default_model,
                   bind_arguments(self.function, expressions))
        return self.judf.builder(expressions)

    class Java:
        implements = ["scala.Function1"]


def check_call(ai: Any, function: AIFunction, default_model: str | None,
               arguments: dict[str, Any]) -> None:
    """Constant options bound (and so checked) as the SQL module does; the model served."""
    name = function.name
    options: dict[str, Any] = {}
    for param in function.option_params:
        if param.name in arguments:
            expr = arguments[param.name]
            if not expr.foldable():
                raise InferenceConfigError(
                    f"{name}: argument '{param.name}' must be a constant (the same for every "
                    "row).")
            options[param.name] = _constant(name, param.name, expr)
    call = function.bind(options)
    endpoint = arguments.get("endpoint")
    if call.cascade is not None:  # the cascade names its models
        if endpoint is not None:
            raise InferenceConfigError(
                f"{name}: pass 'endpoint' or 'cascade', not both: the cascade names its models.")
        call.cascade.check_models(ai.settings.models, name)
        return
    if endpoint is None:
        if default_model is None:
            raise InferenceConfigError(
                f"{name}: no default model; pass the argument 'endpoint' (one of "
                f"{sorted(ai.settings.models)}) or set default_model in the settings.")
    elif endpoint.foldable():
        model = _constant(name, "endpoint", endpoint)
        if not isinstance(model, str):
            raise InferenceConfigError(
                f"{name}: argument 'endpoint' must be a STRING naming a served model, got "
                f"{model!r}.")
        ai.check_model(model, where=name)


def bind_arguments(function: AIFunction, expressions: Any) -> dict[str, Any]:
    """Parameter name -> expression, for positional and ``name => value`` arguments alike, by
    the catalogue's signature of ``function`` (``ai_query``'s too)."""
    names = [p.name for p in function.params]
    arguments: dict[str, Any] = {}
    for i in range(expressions.length()):
        expr = expressions.apply(i)
        if expr.getClass().getSimpleName() == "NamedArgumentExpression":
            key = str(expr.key())
            if key not in names:
                raise InferenceConfigError(
                    f"{function.name} has no parameter '{key}'; its signature is "
                    f"{function.signature()}.")
            arguments[key] = expr.value()
        elif i < len(names):
            arguments[names[i]] = expr
        else:
            raise InferenceConfigError(
                f"{function.name} takes at most {len(names)} arguments: {function.signature()}.")
    for param in function.params:
        if param.default is REQUIRED and param.name not in arguments:
            raise InferenceConfigError(
                f"{function.name} needs '{param.name}': {function.signature()}.")
    return arguments


def _constant(function: str, name: str, expression: Any) -> Any:
    """A foldable expression's value: None, bool, number, str or a list of strings."""
    value = expression.eval(None)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    data_type = expression.dataType()
    if data_type.getClass().getSimpleName() == "ArrayType":
        if data_type.elementType().typeName() != "string":
            raise InferenceConfigError(
                f"{function}: argument '{name}' must be an ARRAY<STRING> such as "
                f"array('a', 'b'), got {data_type.simpleString().upper()}.")
        return [None if value.isNullAt(i) else str(value.getUTF8String(i).toString())
                for i in range(value.numElements())]
    if data_type.typeName() == "decimal":
        return float(str(value.toString()))
    if data_type.getClass().getSimpleName() == "StructType":  # a cascade's named_struct
        fields = data_type.fields()
        return {str(f.name()): None if value.isNullAt(i) else _field_value(
            value.get(i, f.dataType()), f.dataType()) for i, f in enumerate(fields)}
    return str(value.toString())


def _field_value(value: Any, data_type: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    if data_type.typeName().startswith("decimal"):  # "decimal(2,1)": 0.9 as SQL writes it
        return float(str(value.toString()))
    return str(value.toString())


# -- the executor side ---------------------------------------------------------------------------
def run_function(job: SparkJob, name: str, default_model: str | None,
                 arguments: dict[str, pd.Series]) -> pd.Series:
    """Answer one Arrow batch of one AI function: a Series of SQL values (None for NULL)."""
    function = next(f for f in AI_FUNCTIONS if f.name == name)
    texts = [arguments[p.name] for p in function.text_params]
    n = len(texts[0])
    call = function.bind({p.name: _option(arguments.get(p.name))
                          for p in function.option_params})
    columns = [t.tolist() for t in texts]
    present = np.array([all(sendable(c[i]) for c in columns) for i in range(n)], dtype=bool)
    values: list[Any] = [None] * n
    if present.any() and call.cascade is not None:
        rows = present.nonzero()[0]
        prompts = [function.render(*(c[i] for c in columns)) for i in rows]
        failed = []
        for i, (value, error) in zip(rows, cascade_batch(job, call, prompts), strict=True):
            if error is not None:
                failed.append(error)
            values[i] = value
        if failed:
            raise failure(name, failed, len(rows))
    elif present.any():
        endpoints = arguments.get("endpoint")
        models = ([default_model] * n if endpoints is None else
                  [job.model_for(m) if isinstance(m, str) else default_model
                   for m in endpoints.tolist()])
        rows = present.nonzero()[0]
        frame = pd.DataFrame({
            MODEL_COLUMN: [models[i] for i in rows],
            PROMPT_COLUMN: [function.render(*(c[i] for c in columns)) for i in rows],
        })
        outputs, errors = worker.answer_frame(job.replace(call=call.inference_call(job.call)),
                                              frame)
        failed: list[str] = []
        for i, output, error in zip(rows, outputs, errors, strict=True):
            value, error = read_result(call, output, error)
            if error is not None:
                failed.append(error)
            values[i] = value
        if failed:
            raise failure(name, failed, len(rows))
    worker.count_batch(n)
    if SPARK_TYPES.get(name) == "boolean":
        return pd.Series([None if v is None else bool(v) for v in values], dtype=object)
    if SPARK_TYPES.get(name) == "double":
        return pd.Series([None if v is None else float(v) for v in values], dtype="float64")
    return pd.Series([worker.as_sql_text(v) for v in values], dtype=object)


def cascade_batch(job: SparkJob, call: Any, prompts: list[str]) -> list[tuple[Any, Any]]:
    """One Arrow batch's rows through the call's cascade (its thresholds learned on them)."""
    from ..semantic.cascade import cascade_outcomes

    return cascade_outcomes(worker.client_for(job.settings), call, prompts,
                            partition_key=job.call.partition_key, scope=job.call.scope,
                            run_id=job.run_id)


def _option(column: Any) -> Any:
    """The call's constant option from its column (an array arrives as a numpy array, a
    struct as a frame of its fields)."""
    if isinstance(column, pd.DataFrame):
        return {str(k): worker.plain_value(v) for k, v in column.iloc[0].items()}
    value = worker.first_value(column)
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:
        return [worker.plain_value(v) for v in value.tolist()]
    return worker.plain_value(value)


def ai_function(job: SparkJob, name: str, default_model: str | None):
    """The pandas UDF body of one AI function (a closure over plain data)."""
    names = tuple(p.name for f in AI_FUNCTIONS if f.name == name for p in f.params)

    def body(*args, **kwargs):
        arguments = dict(zip(names, args, strict=False))
        arguments.update(kwargs)
        return run_function(job, name, default_model, arguments)

    body.__name__ = name
    return body
