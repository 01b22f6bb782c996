"""A script run with the venv's Python needs no PYSPARK_PYTHON: Spark's workers get the
driver's interpreter unless the user chose one, even for a session created before the
library was imported (the README's Spark example, run as written)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

SCRIPT = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession

    # The session first, as users do; the library comes after.
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    from dagster_batchllm import InferenceClient, InferenceSettings, EndpointSpec
    from dagster_batchllm.spark import register_ai_functions

    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=sys.argv[1], models=("sim-model",)),),
        store_url=None, default_model="sim-model")
    register_ai_functions(spark, settings)
    [row] = spark.sql("SELECT ai_query('sim-model', 'Say hi') AS s").collect()
    print("ANSWER", row.s)
    spark.stop()
""")


def test_spark_workers_run_the_drivers_python_without_pyspark_python(sim, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    # python3 on PATH is another interpreter than the driver's (the system one here).
    env["PATH"] = "/usr/bin:/bin:" + env.get("PATH", "")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    script = tmp_path / "spark_script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), sim.base_url], env=env,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ANSWER [sim] Say hi" in done.stdout
