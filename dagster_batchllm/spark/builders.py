"""Registering a Python function *builder* in Spark SQL's function registry.

``ai_query`` (:mod:`.sql`) and the AI functions (:mod:`.functions`) are registered as builders,
not as fixed UDFs: Spark calls a builder while it analyses each query, with the argument
expressions, so their constant arguments are checked (and the result type chosen) before any
task starts. Spark calls the builder through py4j's callback server, the mechanism PySpark itself
uses for ``foreachBatch``; so this needs a classic SparkSession (not Spark Connect).
"""

from __future__ import annotations

from typing import Any

from ..core import InferenceConfigError


def register_builder(spark: Any, name: str, builder: Any) -> None:
    """Register ``builder`` (a ``scala.Function1`` implemented in Python) as function ``name``.

    Spark's registry holds only a py4j proxy of ``builder``: the caller keeps it alive.
    """
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        raise InferenceConfigError(
            "register_ai_functions needs a classic SparkSession (Spark Connect cannot call back "
            "into Python while it analyses a query); use ai_query_col instead."
        )
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    jsession.sessionState().functionRegistry().createOrReplaceTempFunction(
        name, builder, "python_udf")
