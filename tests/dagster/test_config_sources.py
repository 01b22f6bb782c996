"""Each setting has one home: the Dagster config classes declare the fields of the plain-data
specs (names, defaults, descriptions) and convert to them field by field. A field added to one
side only, or a default or description changed on one side only, fails here."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest
from pydantic_core import PydanticUndefined

from dagster_batchllm.core import (
    DESCRIPTION,
    EndpointSpec,
    InferenceSettings,
    MlflowModelSpec,
    Price,
)
from dagster_batchllm.managed.start import MANAGED_KINDS, ManagedEndpointSpec
from dagster_batchllm.resource import (
    SETTINGS_BUILT_FROM,
    BatchInferenceResource,
    Endpoint,
    ManagedEndpoint,
    MlflowModel,
)
from dagster_batchllm.resource_config import PriceConfig

# (config class, spec, config fields converted explicitly, spec fields built from them)
PAIRS = [
    pytest.param(BatchInferenceResource, InferenceSettings,
                 {"endpoints", "managed_endpoints", "mlflow_models"},
                 {"endpoints", "mlflow_models"},
                 id="resource-settings"),
    pytest.param(Endpoint, EndpointSpec, set(), set(), id="endpoint"),
    pytest.param(ManagedEndpoint, ManagedEndpointSpec, set(), set(), id="managed-endpoint"),
    pytest.param(MlflowModel, MlflowModelSpec, set(), set(), id="mlflow-model"),
    pytest.param(PriceConfig, Price, set(), set(), id="price"),
]


def _spec_default(spec_field: dataclasses.Field):
    if spec_field.default is not dataclasses.MISSING:
        return spec_field.default
    if spec_field.default_factory is not dataclasses.MISSING:
        return spec_field.default_factory()
    return PydanticUndefined  # required, as a pydantic field without default says it


def _config_default(config_field):
    """As the spec holds it: config lists are the specs' tuples, config mappings (an
    endpoint's prices by model) the specs' sorted (key, value) pairs."""
    if config_field.default_factory is not None:
        value = config_field.default_factory()
    else:
        value = config_field.default
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return tuple(value) if isinstance(value, list) else value


@pytest.mark.parametrize(("config_class", "spec", "config_only", "spec_only"), PAIRS)
def test_config_declares_exactly_the_spec_fields(config_class, spec, config_only, spec_only):
    config_fields = config_class.model_fields
    spec_fields = {f.name: f for f in dataclasses.fields(spec)}
    # The known exceptions exist, so this list cannot go stale unnoticed.
    assert config_only <= set(config_fields) and spec_only <= set(spec_fields)
    assert set(config_fields) - config_only == set(spec_fields) - spec_only

    for name, spec_field in spec_fields.items():
        assert spec_field.metadata.get(DESCRIPTION), f"{spec.__name__}.{name}: no description"
    for name, config_field in config_fields.items():
        assert config_field.description, f"{config_class.__name__}.{name}: no description"
    for name in set(spec_fields) - spec_only:
        config_field, spec_field = config_fields[name], spec_fields[name]
        where = f"{config_class.__name__}.{name}"
        assert config_field.description == spec_field.metadata[DESCRIPTION], where
        assert _config_default(config_field) == _spec_default(spec_field), where
        assert config_field.repr == spec_field.repr, where  # secrets stay hidden on both


def test_settings_exceptions_are_the_ones_to_settings_converts():
    assert set(SETTINGS_BUILT_FROM) == {"endpoints", "prices", "mlflow_models"}
    assert {name for sources in SETTINGS_BUILT_FROM.values() for name in sources} == {
        "endpoints", "managed_endpoints", "prices", "mlflow_models"}


def test_config_choices_are_the_specs_choices():
    assert get_args(ManagedEndpoint.model_fields["kind"].annotation) == MANAGED_KINDS
    http_clients = get_args(BatchInferenceResource.model_fields["http_client"].annotation)
    assert InferenceSettings.__dataclass_fields__["http_client"].default in http_clients


def test_to_settings_and_to_spec_copy_every_field(tmp_path):
    endpoint = Endpoint(name="gpu-a", base_url="http://127.0.0.1:9/v1", models=["m1", "m2"],
                        max_concurrency=3, api_key="k", tokens_per_minute=100,
                        requests_per_minute=10, rate_limit_window_s=5.0,
                        max_context_tokens=2048, embedding_models=["e1"], batch_api=True,
                        max_requests_per_batch=10, max_bytes_per_batch=4096, protocol="mlflow")
    assert endpoint.to_spec() == EndpointSpec(
        name="gpu-a", base_url="http://127.0.0.1:9/v1", models=("m1", "m2"), max_concurrency=3,
        api_key="k", tokens_per_minute=100, requests_per_minute=10, rate_limit_window_s=5.0,
        max_context_tokens=2048, embedding_models=("e1",), batch_api=True,
        max_requests_per_batch=10, max_bytes_per_batch=4096, protocol="mlflow")
    mlflow_model = MlflowModel(name="risk", model_uri="models:/risk@champion",
                               registry_uri="sqlite:///r.db", rows_per_batch=7)
    assert mlflow_model.to_spec() == MlflowModelSpec(
        name="risk", model_uri="models:/risk@champion", registry_uri="sqlite:///r.db",
        rows_per_batch=7)
    vllm = dict(kind="vllm", name="llm", max_concurrency=2, process=True, model_path="/m",
                model_name="g", embedding=True, max_num_seqs=3, max_model_len=512,
                tensor_parallel_size=2, cpu_kv_cache_gib=3, startup_timeout_s=9.0)
    managed = ManagedEndpoint(aliases=["h"], gpus=[0, 1], extra_args=["--seed", "1"], **vllm)
    assert managed.to_spec() == ManagedEndpointSpec(
        aliases=("h",), gpus=(0, 1), extra_args=("--seed", "1"), **vllm)

    changed = dict(
        store_url=f"sqlite:///{tmp_path / 'l.db'}", ledger_table="other_table",
        max_attempts=2, request_timeout_s=7.0, retry_initial_backoff_s=0.1,
        retry_max_backoff_s=2.0, max_retry_after_s=3.0, breaker_failure_threshold=9,
        breaker_cooldown_s=4.0, default_max_tokens=64, token_budget=1000, default_model="m1",
        http_client="openai", coordinate_runs=False, coordination_interval_s=0.125,
        chunk_rows=10, ledger_flush_rows=3, ledger_flush_interval_s=0.5,
        progress_interval_s=9.0, batch_poll_initial_s=0.25, batch_poll_max_s=5.0,
        mlflow_registry_uri="sqlite:///registry.db",
        endpoint_unreachable_after_s=2.0, ledger_outage_s=5.0, ledger_statement_timeout_s=3.0,
        endpoint_failing_after_s=20.0,
        max_reply_bytes=4096,
        prefix_affinity=False,
        files_roots=("/data/scans",), allow_image_urls=False,
    )
    copied_by_name = {f.name for f in dataclasses.fields(InferenceSettings)} - set(
        SETTINGS_BUILT_FROM)
    assert set(changed) == copied_by_name  # every copied field is changed, so each is checked
    defaults = InferenceSettings(endpoints=(endpoint.to_spec(),))
    assert all(getattr(defaults, name) != value for name, value in changed.items())

    resource = BatchInferenceResource(
        endpoints=[endpoint], mlflow_models=[mlflow_model],
        prices={"m1": Price(input_per_mtok=1.0, output_per_mtok=2.0)},
        **changed,
    )
    settings = resource.to_settings()
    assert {name: getattr(settings, name) for name in changed} == changed
    assert settings.endpoints == (endpoint.to_spec(),)
    assert settings.prices == (("m1", Price(1.0, 2.0)),)
    assert settings.batch_price_for("m1") == (0.5, 1.0)  # half the online price, by default
    assert settings.mlflow_models == (mlflow_model.to_spec(),)
