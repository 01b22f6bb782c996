"""Spark's Python workers run the driver's interpreter unless the user chose another.

Spark starts workers with ``$PYSPARK_PYTHON``, else ``python3`` from PATH: from a script run
with ``.venv/bin/python`` that is another interpreter, without this package or pandas ("No
module named 'dagster_batchllm'" on the workers). So, when the user has not chosen one
(neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python``):

* importing :mod:`dagster_batchllm.spark` sets ``PYSPARK_PYTHON`` to the driver's interpreter,
  for sessions created afterwards;
* a session created before that, on a local master, gets the driver's interpreter for the UDFs
  this package registers (``SparkContext.pythonExec``, which each UDF captures). On a cluster
  the driver's path may not exist on the executors, so there it is left alone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_CHOSEN_BY_USER = "PYSPARK_PYTHON" in os.environ


def use_driver_python_by_default() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def align_worker_python(spark: Any) -> None:
    """Point a local session's Python workers at the driver's interpreter, unless chosen."""
    if _CHOSEN_BY_USER:
        return
    try:
        context = spark.sparkContext
        conf = context.getConf()
    except Exception:  # Spark Connect: no SparkContext on the client; the server decides
        return
    if conf.get("spark.pyspark.python", None) or not context.master.startswith("local"):
        return
    context.pythonExec = sys.executable
