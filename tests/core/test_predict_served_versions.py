"""A served model's version in its request keys, against a real local MLflow registry and a
real `mlflow models serve`: an endpoint that declares what it serves (``served_model_uri``,
read from the registry when a call starts, or ``served_model_version``) has its predictions
keyed by that version, so a redeploy of a new version under the same name scores every row
again and the same version is answered from the ledger; undeclared, the old answers would be
reused."""

from __future__ import annotations

import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.core.tasks.predict import resolve

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    FEATURES,
    ModelServer,
    feature_frame,
    fit_risk_model,
    two_risk_versions,
)


@pytest.fixture
def registry(tmp_path):
    """Its own registry: these tests move ``champion``, which the session's must keep."""
    registry = two_risk_versions(tmp_path / "registry")
    return registry


def _settings(registry, tmp_path, base_url, **declared) -> InferenceSettings:
    return InferenceSettings(
        endpoints=(EndpointSpec(name="scoring", base_url=base_url, models=("risk-served",),
                                protocol="mlflow", max_concurrency=2, **declared),),
        mlflow_registry_uri=registry.uri, store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        ledger_flush_interval_s=0.05, progress_interval_s=60.0)


def _score(settings, frame):
    with InferenceClient(settings) as client:
        return client.predict(frame, model="risk-served", input_columns=FEATURES,
                              output_column="risk", rows_per_request=100)


@pytest.mark.slow
def test_a_redeploy_of_a_new_version_scores_afresh_and_the_same_version_is_reused(
        registry, tmp_path):
    frame = feature_frame(300, seed=61)
    v1, v2 = (fit_risk_model(v).predict(frame).tolist() for v in (1, 2))
    assert v1 != v2
    with ModelServer("models:/risk@champion", tracking_uri=registry.uri) as server:
        declared = _settings(registry, tmp_path, server.base_url,
                             served_model_uri="models:/risk@champion")
        first = _score(declared, frame)
        assert first.df["risk"].tolist() == v1 and first.stats.requests >= 3
        described = first.models["risk-served"]
        assert (described["kind"], described["version"], described["alias"],
                described["registered_name"], described["uri"]) == \
            ("served", "1", "champion", "risk", "models:/risk/1")
        again = _score(declared, frame)  # the same version: from the ledger, nothing sent
        assert again.stats.requests == 0 and again.stats.cached == 300
        # An endpoint that does not say what it serves keys by name (its own records).
        _score(_settings(registry, tmp_path, server.base_url), frame)

    # The redeploy: the alias moves to version 2 and the server is restarted on it.
    registry.set_alias("risk", "champion", "2")
    with ModelServer("models:/risk@champion", tracking_uri=registry.uri) as server:
        declared = _settings(registry, tmp_path, server.base_url,
                             served_model_uri="models:/risk@champion")
        rerun = _score(declared, frame)
        assert rerun.stats.cached == 0 and rerun.stats.requests >= 3  # every row again
        assert rerun.df["risk"].tolist() == v2 and rerun.df["risk_error"].isna().all()
        assert rerun.models["risk-served"]["version"] == "2"
        assert _score(declared, frame).stats.cached == 300
        # Undeclared, the name alone is the key: version 1's answers come back, stale.
        stale = _score(_settings(registry, tmp_path, server.base_url), frame)
        assert stale.stats.requests == 0 and stale.df["risk"].tolist() == v1
    records = Ledger(declared.store_url).records()
    assert len(records) == 900  # versions 1 and 2 declared, and the undeclared name


@pytest.mark.slow
def test_a_long_lived_client_follows_a_redeploy_under_the_same_url(registry, tmp_path):
    """A resource's client outlives deploys: each call reads the registry again, so the server
    restarted on the same port with the moved alias is scored afresh, half a frame at a time:
    only the rows not yet answered under the running version are sent."""
    frame = feature_frame(200, seed=63)
    v1, v2 = (fit_risk_model(v).predict(frame).tolist() for v in (1, 2))
    first_half = frame.iloc[:100]
    with ModelServer("models:/risk@champion", tracking_uri=registry.uri) as server:
        port = server.port
        settings = _settings(registry, tmp_path, server.base_url,
                             served_model_uri="models:/risk@champion")
        client = InferenceClient(settings)
        try:
            assert _predict(client, first_half).df["risk"].tolist() == v1[:100]
            both = _predict(client, frame)  # only the second half is sent
            assert both.stats.cached == 100 and both.df["risk"].tolist() == v1
        finally:
            client.close()
    registry.set_alias("risk", "champion", "2")
    with ModelServer("models:/risk@champion", tracking_uri=registry.uri, port=port), \
            InferenceClient(settings) as client:
        moved = _predict(client, first_half)
        assert moved.stats.cached == 0 and moved.df["risk"].tolist() == v2[:100]
        assert moved.models["risk-served"]["version"] == "2"
        rest = _predict(client, frame)
        assert rest.stats.cached == 100 and rest.df["risk"].tolist() == v2


@pytest.mark.slow
def test_an_undeclared_served_model_is_warned_about_once(registry, tmp_path, caplog,
                                                         monkeypatch):
    monkeypatch.setattr(resolve, "_warned_unversioned", set())
    frame = feature_frame(20, seed=64)
    with ModelServer("models:/risk/1", tracking_uri=registry.uri) as server, \
            caplog.at_level("WARNING", logger="dagster_batchllm"):
        for declared in ({}, {}, {"served_model_version": "1"}):
            settings = _settings(registry, tmp_path, server.base_url, **declared)
            assert _score(settings, frame).df["risk_error"].isna().all()
    warnings = [r.getMessage() for r in caplog.records if "keyed by its name only" in
                r.getMessage()]
    assert len(warnings) == 1 and "'risk-served'" in warnings[0]


def _predict(client, frame):
    return client.predict(frame, model="risk-served", input_columns=FEATURES,
                          output_column="risk", rows_per_request=50)


@pytest.mark.slow
def test_a_declared_version_keys_the_answers_without_a_registry(registry, tmp_path):
    frame = feature_frame(50, seed=62)
    with ModelServer("models:/risk/1", tracking_uri=registry.uri) as server:
        def score(version):
            settings = _settings(registry, tmp_path, server.base_url,
                                 served_model_version=version)
            return _score(settings.replace(mlflow_registry_uri=None), frame)

        first = score("7")
        assert first.stats.requests >= 1 and first.models["risk-served"]["version"] == "7"
        assert score("7").stats.cached == 50
        assert score("8").stats.cached == 0  # another deploy: scored again


@pytest.mark.slow
def test_a_served_model_uri_that_does_not_resolve_raises_before_anything_is_sent(
        registry, tmp_path):
    # Nothing listens on port 9: a sent row would fail as unreachable instead of raising.
    settings = _settings(registry, tmp_path, "http://127.0.0.1:9",
                         served_model_uri="models:/risk@nobody")
    with pytest.raises(InferenceConfigError, match=r"served model 'risk-served' "
                                                   r"\(served_model_uri\).*nobody"):
        _score(settings, feature_frame(5))


def test_endpoints_of_one_model_must_declare_the_same_served_model(tmp_path):
    endpoints = tuple(EndpointSpec(name=f"scoring-{v}", base_url="http://127.0.0.1:9",
                                   models=("risk-served",), protocol="mlflow",
                                   served_model_version=v) for v in ("1", "2"))
    settings = InferenceSettings(endpoints=endpoints, store_url=f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(InferenceConfigError, match="declare different models"):
        _score(settings, feature_frame(5))


@pytest.mark.parametrize("fields, problem", [
    ({"served_model_uri": "models:/risk@champion", "served_model_version": "1"}, "not both"),
    ({"served_model_uri": "models:/risk@champion", "protocol": "openai"}, "protocol='mlflow'"),
    ({"served_model_version": ""}, "is empty"),
])
def test_a_contradictory_declaration_is_refused(fields, problem):
    with pytest.raises(ValueError, match=problem):
        EndpointSpec(**{"name": "scoring", "base_url": "http://127.0.0.1:9",
                        "models": ("risk-served",), "protocol": "mlflow", **fields})
