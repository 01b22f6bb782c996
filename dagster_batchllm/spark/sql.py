"""``ai_query`` in Spark SQL, with Databricks' signature and result types.

Databricks' ``ai_query`` returns a STRING, or ``STRUCT<result: STRING, errorMessage: STRING>``
when called with ``failOnError => false``: the result type depends on an argument's value. A
Python UDF has one fixed type, so ``ai_query`` is registered with a function *builder* that Spark
calls while it analyses each query: it reads the constant arguments, checks them (an unserved
model, a non-constant ``failOnError``, a ``returnType`` that is no type, ``returnType`` and
``responseFormat`` together fail the query before any task starts) and hands the call to one of
the pandas UDFs, the STRING one or the STRUCT one. A ``returnType`` other than STRING
(``'BOOLEAN'``, ``'ARRAY<STRING>'``, ``'STRUCT<risk: STRING, score: INT>'`` ...) asks a chat
model for that type (the catalogue's JSON schema, as on DuckDB and SQLite): the typed UDF gives
each row's result and error as JSON text and ``from_json`` makes it the type
(:func:`typed_expression`), or ``STRUCT<result: T, errorMessage: STRING>`` with ``failOnError
=> false``; a reply that does not fit is the row's error.
The older form of Databricks' earlier reference page, options as name/value pairs
(``ai_query('qa_bot', prompt, 'returnType', 'STRING')``), is read as named options. A request
that is NULL, empty or only whitespace gives NULL without being sent. Spark calls the builder
through py4j's callback server (see :mod:`.builders`); so this needs a classic SparkSession (not
Spark Connect).

Both UDFs are nondeterministic to Spark, which keeps the optimizer from evaluating one
``ai_query`` twice (for a filter pushed below the projection, say) and sending its rows twice.

Example::

    from dagster_batchllm.spark import register_ai_functions

    register_ai_functions(spark, llm)  # llm: a BatchInferenceResource or InferenceSettings
    spark.sql('''
        SELECT call_id,
               ai_query('llama-70b', 'Summarize this call transcript: ' || transcript) AS summary,
               ai_query('llama-70b', transcript, failOnError => false,
                        modelParameters => named_struct('max_tokens', 64)) AS checked
        FROM call_center_transcripts
    ''')
"""

from __future__ import annotations

from typing import Any, Literal

from ..ai_functions.calls import result_struct, return_type
from ..ai_functions.catalogue import AI_QUERY, legacy_options
from ..ai_functions.types import SQLType
from ..core import InferenceConfigError
from . import aggregates, documents, functions, worker
from .builders import register_builder
from .embeddings import EmbeddingQueries
from .job import RESULT_FIELD, RESULT_STRUCT_DDL
from .model_sql import constant as _constant
from .model_sql import scala_seq, scoring_expression, scoring_model, string_literal
from .session import SparkAI

# files => content: each row's image, as BINARY (read_files/binaryFile's content) or a STRING
# path or URL, or an ARRAY of those (a document's pages).
_FILE_TYPES = frozenset({"binary", "string"})


def register_ai_functions(spark: Any, resource_or_settings: Any, *,
                          task_slots: int | None = None, token_budget: int | None = None,
                          partition_key: str | None = None, run_id: str | None = None,
                          scope: str | None = None, context: Any = None,
                          budget_wait_s: float = 30.0,
                          limits: Literal["split", "shared"] = "split") -> SparkAI:
    """Register ``ai_query`` and the AI functions in ``spark``'s SQL; activate these settings.

    The AI functions (``ai_summarize``, ``ai_classify``, ``ai_extract``,
    ``ai_analyze_sentiment``, ``ai_translate``, ``ai_fix_grammar``, ``ai_mask``, ``ai_gen``,
    ``ai_similarity``) are described in :mod:`dagster_batchllm.spark.functions`; they share
    ``ai_query``'s budget.

    Returns the :class:`SparkAI` (for ``ai_query_col``/``infer_grouped`` and the budget's
    figures). ``context`` (a Dagster asset context) records its partition key, run id and asset
    key in the ledger, as ``BatchInferenceResource.infer(context=...)`` does. Registering again
    replaces the function (use that to change what is recorded, or to start a fresh budget).
    """
    ai = SparkAI(spark, resource_or_settings, task_slots=task_slots,
                 token_budget=token_budget, partition_key=partition_key, run_id=run_id,
                 scope=scope, context=context, budget_wait_s=budget_wait_s, limits=limits)
    # One budget for every query of this registration, whichever UDF a query resolves to.
    job = ai.job(fail_on_error=True)
    from pyspark.sql.functions import pandas_udf

    as_text = pandas_udf(worker.sql_function(job, struct=False), "string").asNondeterministic()
    as_struct = pandas_udf(
        worker.sql_function(job.replace(fail_on_error=False), struct=True), RESULT_STRUCT_DDL,
    ).asNondeterministic()
    # failOnError is read from its argument: one typed UDF serves every returnType.
    as_typed = pandas_udf(worker.typed_sql_function(job), "string").asNondeterministic()
    builder = AIQueryBuilder(ai, as_text._unwrapped._judf, as_struct._unwrapped._judf,
                             embeddings=EmbeddingQueries(ai),
                             as_typed=as_typed._unwrapped._judf)
    register_builder(spark, "ai_query", builder)
    ai.sql_builder = builder  # Spark's registry holds only a py4j proxy of it
    ai.function_builders = functions.register(spark, ai, job)  # kept alive for the same reason
    ai.function_builders.update(aggregates.register(spark, ai))  # ai_agg, ai_summarize_agg
    documents.register_parse_document(spark, ai.settings)
    return ai.activate()


class AIQueryBuilder:
    """Spark's ``FunctionBuilder`` for ``ai_query`` (a ``scala.Function1`` implemented in Python).

    Called on the driver while a query is analysed, with the argument expressions; returns the
    STRING or the STRUCT pandas-UDF expression over the same arguments.
    """

    def __init__(self, ai: SparkAI, as_text: Any, as_struct: Any,
                 embeddings: EmbeddingQueries | None = None, as_typed: Any = None):
        self.ai = ai
        self.as_text = as_text
        self.as_struct = as_struct
        self.embeddings = embeddings  # the ARRAY<FLOAT> UDFs for embedding models
        self.as_typed = as_typed  # JSON text of result and error, for a returnType

    def apply(self, expressions: Any) -> Any:
        arguments, pairs = _arguments(expressions)
        model = scoring_model(self.ai, arguments)
        if model is not None:  # a traditional ML model: its features from a named_struct
            return scoring_expression(self.ai, model, arguments)
        chosen = self._embedding_udf(arguments)
        no_files, typed = False, None
        if chosen is None:
            fail_on_error = _check(self.ai, arguments)
            typed = _typed_result(arguments)
            if typed is not None:
                chosen = self.as_typed
            else:
                chosen = self.as_text if fail_on_error else self.as_struct
            no_files = _null_literal(arguments.get("files"))
            if no_files:  # files => NULL: no files (DuckDB's default), not NULL for every row
                del arguments["files"]
        if pairs or no_files:  # the UDF reads options by position or name: hand them by name
            expressions = _named_arguments(self.ai.spark, arguments)
        if typed is None:
            return chosen.builder(expressions)
        return typed_expression(self.ai.spark, chosen.builder(expressions), typed,
                                fail_on_error)

    def _embedding_udf(self, arguments: dict[str, Any]) -> Any:
        """The embedding UDF when the (constant) endpoint names an embedding model."""
        endpoint = arguments["endpoint"]
        if self.embeddings is None or not endpoint.foldable():
            return None
        options = {name: _constant(e) if e.foldable() else "(not a constant)"
                   for name, e in arguments.items() if name not in ("endpoint", "request")}
        return self.embeddings.udf_for(_constant(endpoint), options)

    class Java:
        implements = ["scala.Function1"]


def _arguments(expressions: Any) -> tuple[dict[str, Any], bool]:
    """Argument name -> expression, for positional and ``name => value`` arguments alike, and
    whether the options came as the older form's name/value pairs (``'returnType',
    'STRING'``, see :func:`~dagster_batchllm.ai_functions.catalogue.legacy_options`)."""
    given = [expressions.apply(i) for i in range(expressions.length())]
    arguments: dict[str, Any] = {}
    rest = given[2:]
    pairs = None
    if len(given) >= 2 and not any(_is_named(e) for e in given):
        pairs = legacy_options(AI_QUERY, rest, _literal_text)
    if pairs is not None:
        arguments.update(zip(("endpoint", "request"), given[:2], strict=True))
        arguments.update(pairs)
        return arguments, True
    return functions.bind_arguments(AI_QUERY, expressions), False


def _is_named(expression: Any) -> bool:
    return expression.getClass().getSimpleName() == "NamedArgumentExpression"


def _literal_text(expression: Any) -> str | None:
    """A constant STRING argument's value, else None."""
    if not expression.foldable() or expression.dataType().typeName() != "string":
        return None
    value = _constant(expression)
    return value if isinstance(value, str) else None


def _named_arguments(spark: Any, arguments: dict[str, Any]) -> Any:
    """The Scala ``Seq`` of expressions for the UDF: endpoint and request, the options named."""
    jvm = spark._jvm
    named = jvm.org.apache.spark.sql.catalyst.expressions.NamedArgumentExpression
    items = jvm.java.util.ArrayList()
    for name, expression in arguments.items():
        items.add(expression if name in ("endpoint", "request") else named(name, expression))
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toSeq()


def _check(ai: SparkAI, arguments: dict[str, Any]) -> bool:
    """Check the constant arguments; returns failOnError."""
    endpoint = arguments["endpoint"]
    if endpoint.foldable():
        name = _constant(endpoint)
        if not isinstance(name, str):
            raise InferenceConfigError(
                f"ai_query: 'endpoint' must be a STRING naming a served model, got {name!r}.")
        ai.check_model(name)
    for name in ("returnType", "failOnError", "modelParameters", "responseFormat"):
        if name in arguments and not arguments[name].foldable():
            raise InferenceConfigError(
                f"ai_query: '{name}' must be a constant (the same for every row).")
    # The options that shape the result, checked by the catalogue (as on DuckDB and SQLite).
    AI_QUERY.result_type({name: _constant(arguments[name]) for name in
                          ("returnType", "failOnError", "responseFormat") if name in arguments})
    if "files" in arguments and not _null_literal(arguments["files"]):
        data_type = arguments["files"].dataType()
        element = (data_type.elementType() if data_type.typeName() == "array" else data_type)
        if element.typeName() not in _FILE_TYPES:
            raise InferenceConfigError(
                f"ai_query: 'files' must be BINARY (the image's bytes, as read_files(..., "
                "format => 'binaryFile') gives in content), a STRING path or URL, or an ARRAY "
                f"of those; got {data_type.simpleString().upper()}.")
    fail_on_error = True
    if "failOnError" in arguments:
        value = _constant(arguments["failOnError"])
        if value is not None and not isinstance(value, bool):
            raise InferenceConfigError(
                f"ai_query: 'failOnError' must be true or false, got {value!r}.")
        fail_on_error = value is not False
    return fail_on_error


def _null_literal(expression: Any) -> bool:
    return expression is not None and expression.dataType().typeName() in ("void", "null")


def _typed_result(arguments: dict[str, Any]) -> SQLType | None:
    """The returnType a chat model is asked for; None for STRING (its plain reply) or none."""
    declared = return_type("ai_query", _constant(arguments["returnType"])
                           if "returnType" in arguments else None)
    return None if declared is None or declared.is_text else declared


def typed_expression(spark: Any, udf: Any, result: SQLType, fail_on_error: bool) -> Any:
    """``from_json`` of the typed UDF's JSON text: ``STRUCT<result: T, errorMessage: STRING>``,
    or its ``result`` field when failOnError is true (a failed row has failed the task then).

    Built from Spark's builtin ``from_json``, which the analyzer then resolves as any call.
    """
    jvm = spark._jvm
    catalyst = jvm.org.apache.spark.sql.catalyst
    schema = string_literal(jvm, result_struct(result).spark_ddl())
    parsed = catalyst.analysis.FunctionRegistry.builtin().lookupFunction(
        catalyst.FunctionIdentifier("from_json"), scala_seq(jvm, [udf, schema]))
    if not fail_on_error:
        return parsed
    return catalyst.expressions.GetStructField(parsed, 0, jvm.scala.Some(RESULT_FIELD))
