"""Run Databricks' documented examples in Spark SQL as written (the Spark side of
:mod:`dagster_batchllm.testing.databricks.compat`).

Spark parses Databricks SQL itself, so nothing is translated: each example runs through
``spark.sql`` over temporary views holding the tables it reads, after
``register_ai_functions``. A table with a catalog or schema in its name (``user.batch.news``)
cannot be made a temporary view, and local Spark has no Unity Catalog to create it in: such an
example is reported as not run, its error saying so.

Example::

    from dagster_batchllm.testing.databricks.compat import sample_frames
    from dagster_batchllm.testing.databricks.documented import EXAMPLES
    from dagster_batchllm.testing.databricks.spark_compat import run_on_spark

    run = run_on_spark(spark, EXAMPLES[5], sample_frames())  # after register_ai_functions
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .compat import ExampleRun, compared_run, first_line
from .documented import DocumentedExample


def run_on_spark(spark: Any, example: DocumentedExample, tables: Mapping[str, Any]
                 ) -> ExampleRun:
    """Run ``example`` with ``spark.sql`` (the AI functions registered already)."""
    for name in example.tables:
        if "." in name:
            return ExampleRun(example.name, "spark", None, False, {}, None,
                              f"setup: local Spark has no catalog or schema to hold {name} "
                              "(a Unity Catalog name), and a temporary view has no dots")
        spark.createDataFrame(tables[name]).createOrReplaceTempView(name)
    try:
        frame = spark.sql(example.sql)
        frame.collect()
    except Exception as exc:  # Spark's error (or the AI functions') is the finding: report it
        return ExampleRun(example.name, "spark", None, False, {}, None, _spark_error(exc))
    fields = frame.schema.fields
    found = {i: spark_ddl(f.dataType) for i, f in enumerate(fields)}
    names = {f.name: i for i, f in enumerate(fields)}
    return compared_run(example, "spark", None, found, names)


def spark_ddl(data_type: Any) -> str:
    """A Spark ``DataType`` in Databricks' DDL (``STRUCT<a: STRING>``)."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        fields = ", ".join(f"{f.name}: {spark_ddl(f.dataType)}" for f in data_type.fields)
        return f"STRUCT<{fields}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{spark_ddl(data_type.elementType)}>"
    name = data_type.simpleString().upper()
    return {"INT": "INT", "STRING": "STRING"}.get(name, name)


_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


def _spark_error(exc: BaseException) -> str:
    """The line of a Spark (or py4j) error that says what went wrong: the last exception line
    of a Python worker's traceback where there is one, else Spark's first line."""
    raised = [m for line in str(exc).splitlines() if (m := _RAISED.match(line.strip()))]
    python = [m for m in raised if m.group(1) not in ("Py4JJavaError", "Py4JException")]
    if python:
        kind, message = python[-1].groups()
        return first_line(RuntimeError(f"{kind}: {message}"))
    return first_line(exc)
