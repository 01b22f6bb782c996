"""One SparkSession for every Spark test (the JVM takes ~10 s to start), and shared helpers."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

if importlib.util.find_spec("pyspark") is None:  # pip install -e '.[spark]' to run these
    collect_ignore_glob = ["test_*.py"]

# tests/conftest.py sets these too; repeated so this file also works when collected alone.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dagster-batchllm-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def model_echo():
    """A responder for SimulatedEndpoint(responder=...) that names the answering model."""
    return ModelEcho()


class ModelEcho:
    """A responder that says which model answered and remembers the generation parameters."""

    def __init__(self, models=("m1", "m2", "m3")):
        self._models = list(models)
        self.params: list[dict] = []

    def models(self) -> list[str]:
        return self._models

    def respond(self, model, messages, params) -> str:
        self.params.append(dict(params))
        return f"{model} says: {messages[-1]['content']}"
