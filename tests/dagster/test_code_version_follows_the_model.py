"""An asset's code version follows the model its resource answers with (issue 42, item 5):
switching the example's model from ``local`` to ``llama-70b`` kept the code version and the
old partition FRESH. Built with ``resource=`` (a Component passes its own), the version is the
call as that resource sends it: the call's model, else the resource's default model, its
default max_tokens, and the served version its MLflow endpoints declare. The same
configuration gives the same version in another process; a real Dagster instance calls the
partition stale after a switch, and fresh again under the old configuration; the description
says what the version covers."""

import os
import subprocess
import sys

import dagster as dg
import pandas as pd
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from dagster_batchllm import (
    BatchInferenceResource,
    Endpoint,
    ManagedEndpoint,
    build_embedding_asset,
    build_inference_asset,
    build_scoring_asset,
)
from dagster_batchllm.testing import SimulatedEndpoint
from tests.dagster.defs_yaml import loaded_defs_yaml

DAY = "2026-11-05"
DAYS = dg.DailyPartitionsDefinition(start_date="2026-11-01")


def _embedded(**fields) -> BatchInferenceResource:
    """The example's default: the embedded endpoint, default_model local."""
    return BatchInferenceResource(managed_endpoints=[ManagedEndpoint()],
                                  **{"default_model": "local", **fields})


def _served(*models: str, base_url: str = "http://10.0.0.5:8000/v1", **fields
            ) -> BatchInferenceResource:
    """The example on real endpoints (BATCHLLM_ENDPOINTS, BATCHLLM_MODEL)."""
    return BatchInferenceResource(
        endpoints=[Endpoint(name="gpu-a", base_url=base_url, models=list(models),
                            api_key=dg.EnvVar("NOT_SET_WHERE_DEFINITIONS_LOAD"))],
        **{"default_model": models[0], **fields})


def _summaries(resource: BatchInferenceResource | None, **call: object) -> dg.AssetsDefinition:
    return build_inference_asset(name="summaries", source="calls", prompt="Sum up: {text}",
                                 output_column="summary", resource=resource, **call)


def _version(asset: dg.AssetsDefinition) -> str:
    return asset.code_versions_by_key[asset.key]


def test_switching_the_model_changes_the_code_version_and_an_equal_config_keeps_it():
    local, remote = _version(_summaries(_embedded())), _version(_summaries(_served("llama-70b")))
    assert local != remote  # the example's switch: BATCHLLM_MODEL=llama-70b
    # The resource's default model, among the models it serves.
    assert _version(_summaries(_served("llama-70b", "llama-8b", default_model="llama-8b"))) \
        != _version(_summaries(_served("llama-70b", "llama-8b")))
    # The call's own model, over one resource.
    assert _version(_summaries(_embedded(), model="local-summarizer")) != local
    # What is sent decides, not how it is said: naming the default model and max_tokens.
    assert _version(_summaries(_served("llama-70b"), model="llama-70b", max_tokens=512)) == remote
    # The default max_tokens is sent too.
    assert _version(_summaries(_served("llama-70b", default_max_tokens=64))) != remote
    # The same configuration in another object, another address, with its key unset: equal.
    assert _version(_summaries(_served("llama-70b", base_url="http://10.9.9.9/v1"))) == remote
    assert _version(_summaries(_embedded())) == local
    # Without resource= the default model is no part of it, and the description says so.
    bare = _summaries(None)
    assert _version(bare) == _version(_summaries(None))
    assert "are no part of it: build the asset with resource=" in bare.descriptions_by_key[
        bare.key]


def test_the_description_says_what_the_code_version_covers():
    asset = _summaries(_served("llama-70b"))
    description = asset.descriptions_by_key[asset.key]
    assert f"Code version `{_version(asset)}`: a hash of the prompt" in description
    assert "as the resource under `llm` sends it (it fills in model `llama-70b` and " \
           "max_tokens `512`)" in description
    named = _summaries(_served("llama-70b"), model="llama-70b", max_tokens=32)
    assert "fills in" not in named.descriptions_by_key[named.key]
    given = _summaries(_served("llama-70b"), asset_attributes={"code_version": "7"})
    assert "Code version `7`: given with the asset's attributes." in given.descriptions_by_key[
        given.key]


def test_an_embedding_asset_follows_the_only_embedding_model_served():
    def embeddings(model: str) -> str:
        resource = BatchInferenceResource(endpoints=[Endpoint(
            name="e", base_url="http://10.0.0.5:8000/v1", embedding_models=[model])])
        return _version(build_embedding_asset(name="vectors", source="calls",
                                              input_column="text", resource=resource))

    assert embeddings("bge-small") != embeddings("bge-large")
    assert embeddings("bge-small") == embeddings("bge-small")


def test_a_scoring_asset_follows_the_served_version_its_endpoint_declares():
    def scores(version: str) -> str:
        resource = BatchInferenceResource(endpoints=[Endpoint(
            name="scorer", base_url="http://10.0.0.7:5000", models=["risk"], protocol="mlflow",
            served_model_version=version)])
        return _version(build_scoring_asset(name="risk_scores", source="features", model="risk",
                                            input_columns=["f1"], resource=resource))

    assert scores("3") != scores("4")
    assert scores("3") == scores("3")


def test_a_component_versions_its_asset_by_its_own_resource():
    def version(default_model: str, models: list[str]) -> str:
        attributes = {"name": "summaries", "source": "calls", "prompt": "Sum up: {text}",
                      "output_column": "summary", "resource": {
                          "endpoints": [{"name": "gpu-a", "base_url": "http://10.0.0.5:8000/v1",
                                         "models": models}],
                          "default_model": default_model}}
        with loaded_defs_yaml("dagster_batchllm.BatchInferenceComponent", attributes,
                              "summaries") as (_, defs):
            return _version(defs.get_assets_def("summaries"))

    models = ["llama-70b", "llama-8b"]
    assert version("llama-70b", models) != version("llama-8b", models)
    assert version("llama-70b", models) == _version(_summaries(_served(*models)))


@pytest.mark.slow
def test_the_same_configuration_gives_the_same_version_in_other_processes():
    script = ("from tests.dagster.test_code_version_follows_the_model import _served, "
              "_summaries, _version\nprint(_version(_summaries(_served('llama-70b'))))")
    seen = set()
    for seed in ("1", "2"):  # str hashes differ between the two: no hash() or id() in it
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120, check=True)
        seen.add(done.stdout.strip())
    assert seen == {_version(_summaries(_served("llama-70b")))}


@pytest.fixture
def two_models():
    with SimulatedEndpoint(models=("model-a", "model-b")) as sim:
        yield sim


def _resource(sim: SimulatedEndpoint, default_model: str, store_url: str
              ) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="sim", base_url=sim.base_url, models=["model-a", "model-b"])],
        default_model=default_model, store_url=store_url)


@dg.asset(partitions_def=DAYS)
def calls(context: dg.AssetExecutionContext) -> pd.DataFrame:
    return pd.DataFrame({"call_id": [1, 2], "call_date": context.partition_key,
                         "text": ["Refund for order 12, please.", "When do you close?"]})


def _daily(resource: BatchInferenceResource) -> dg.AssetsDefinition:
    return build_inference_asset(name="summaries", source=calls, prompt="Sum up: {text}",
                                 output_column="summary", partitions_def=DAYS,
                                 partition_column="call_date", resource=resource)


@pytest.mark.slow
def test_a_real_instance_calls_the_partition_stale_after_the_model_switch(two_models, tmp_path):
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    first = _resource(two_models, "model-a", store_url)
    with dg.instance_for_test() as instance:
        summaries = _daily(first)
        done = dg.materialize([calls, summaries], resources={"llm": first}, partition_key=DAY,
                              instance=instance)
        assert done.success

        def status(resource: BatchInferenceResource) -> StaleStatus:
            resolver = get_stale_status_resolver(instance, [calls, _daily(resource)])
            return resolver.get_status(summaries.key, DAY)

        assert status(first) == StaleStatus.FRESH
        switched = _resource(two_models, "model-b", store_url)
        assert status(switched) == StaleStatus.STALE
        # Built again from the same configuration (another process would build this one).
        assert status(_resource(two_models, "model-a", store_url)) == StaleStatus.FRESH

        # The switched definition answers with model-b: the rows are asked again.
        before = two_models.stats(log=False)["requests"]
        again = dg.materialize([calls, _daily(switched)], resources={"llm": switched},
                               partition_key=DAY, instance=instance)
        assert again.success and two_models.stats(log=False)["requests"] == before + 2
        assert status(switched) == StaleStatus.FRESH


@pytest.mark.slow
def test_a_run_whose_resource_is_configured_otherwise_warns(two_models, tmp_path):
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    built, running = (_resource(two_models, model, store_url) for model in ("model-a", "model-b"))
    with dg.instance_for_test() as instance:
        done = dg.materialize([calls, _daily(built)], resources={"llm": running},
                              partition_key=DAY, instance=instance)
        assert done.success
        messages = [entry.user_message for entry in instance.all_logs(done.run_id)]
    [warning] = [m for m in messages if "was read from a resource configured otherwise" in m]
    assert f"`{_version(_daily(built))}`" in warning
    assert f"`{_version(_daily(running))}`" in warning and "resource=" in warning
