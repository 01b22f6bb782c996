"""Databricks' documented examples (dagster_batchllm.testing.databricks.documented) in Spark
SQL, as written.

The Spark side of tests/sql/test_documented_examples.py: Spark parses Databricks SQL itself, so
what differs here is what open-source Spark lacks and the result types this project's Spark
functions give (ai_extract a JSON STRING, ai_similarity a DOUBLE).
"""

from __future__ import annotations

import importlib.util

import pytest

from dagster_batchllm.spark import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint
from dagster_batchllm.testing.databricks.compat import sample_frames
from dagster_batchllm.testing.databricks.documented import EXAMPLES, SERVED_MODELS
from dagster_batchllm.testing.databricks.spark_compat import run_on_spark

pytestmark = pytest.mark.spark

PENDING: dict[str, str] = {}
if importlib.util.find_spec("mlflow") is None:  # qa_bot is then a chat model of the simulator
    PENDING["ai_query: a STRUCT request"] = "mlflow (pip install '.[mlflow]')"

# What does not run as documented in Spark SQL, and a piece of the reason given.
NOT_AS_DOCUMENTED = {
    "ai_query: a materialized view": "PARSE_SYNTAX_ERROR",
    "ai_query: the batch inference template": "PARSE_SYNTAX_ERROR",
    "ai_translate: batch inference over a Unity Catalog table": "local Spark has no catalog",
    # The Spark functions' own types (documented in dagster_batchllm.spark.functions):
    "ai_extract: person, location, organization": "types",
    "ai_extract: email, time": "types",
    "ai_similarity: a literal": "types",
}
SPARK_TYPES = {"ai_extract: person, location, organization": "STRING",
               "ai_extract: email, time": "STRING", "ai_similarity: a literal": "DOUBLE"}


@pytest.fixture(scope="module")
def registered(spark, tmp_path_factory, request):
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    store = tmp_path_factory.mktemp("documented") / "ledger.db"
    models, custom = SERVED_MODELS, {}
    if not PENDING:  # qa_bot as Databricks has it: a custom model endpoint (an MLflow model)
        models = tuple(m for m in SERVED_MODELS if m != "qa_bot")
        custom = request.getfixturevalue("qa_bot_models")
    with SimulatedEndpoint(models=models) as sim:
        register_ai_functions(spark, InferenceSettings(
            endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=models,
                                    max_concurrency=16),),
            store_url=f"sqlite:///{store}", default_model=SERVED_MODELS[0], **custom))
        yield spark


# The call-center pipeline runs over the whole dataset in tests/spark/test_call_center_dataset.py.
@pytest.mark.parametrize("example", [e for e in EXAMPLES
                                     if e.name != "ai_query: the call-center pipeline"],
                         ids=lambda e: e.name)
def test_documented_example_in_spark_sql(example, registered):
    if example.name in PENDING:
        pytest.skip(f"needs {PENDING[example.name]}")
    run = run_on_spark(registered, example, sample_frames())

    expected = NOT_AS_DOCUMENTED.get(example.name)
    assert run.translated is None  # Spark reads Databricks SQL as it is
    if expected is None:
        assert run.error is None and run.as_documented, run
    elif expected == "types":
        assert run.ran and run.types_match is False
        assert set(run.types.values()) == {SPARK_TYPES[example.name]}
    else:
        assert not run.ran and expected in (run.error or ""), run
        assert example.limitation or run.error.startswith("setup: ")
