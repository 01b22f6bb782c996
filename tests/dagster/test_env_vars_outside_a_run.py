"""``dg.EnvVar`` in the resource's config works outside a Dagster run too (a script, a
notebook), the way it does inside one; a variable that is not set is a clear error, raised
before anything is sent."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, InferenceConfigError
from dagster_batchllm.testing import SimulatedEndpoint

KEY = "sk-test-outside-a-run"


@pytest.fixture
def keyed_sim():
    with SimulatedEndpoint(api_key=KEY) as sim:
        yield sim


def _resource(sim, tmp_path, **endpoint) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="gpu-b", base_url=sim.base_url, models=["sim-model"],
                            **endpoint)],
        store_url=dg.EnvVar("BATCHLLM_TEST_LEDGER_URL"), progress_interval_s=60.0)


def test_env_vars_are_read_when_the_resource_is_used_outside_a_run(keyed_sim, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("GPU_B_KEY", KEY)
    monkeypatch.setenv("BATCHLLM_TEST_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    llm = _resource(keyed_sim, tmp_path, api_key=dg.EnvVar("GPU_B_KEY"))
    try:
        result = llm.infer(pd.DataFrame({"text": ["hello"]}), prompt="Echo {text}",
                           model="sim-model", output_column="out")
    finally:
        llm.close()
    assert result.df["out_error"].isna().all()
    assert (tmp_path / "ledger.db").exists()
    assert keyed_sim.stats(log=False)["requests"] == 1


def test_a_missing_env_var_names_itself_before_anything_is_sent(keyed_sim, tmp_path,
                                                               monkeypatch):
    monkeypatch.delenv("GPU_B_KEY", raising=False)
    monkeypatch.setenv("BATCHLLM_TEST_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    llm = _resource(keyed_sim, tmp_path, api_key=dg.EnvVar("GPU_B_KEY"))
    with pytest.raises(InferenceConfigError, match=r"Endpoint 'gpu-b': api_key=dg.EnvVar\('GPU_B"
                       r"_KEY'\) but the environment variable GPU_B_KEY is not set"):
        llm.infer(pd.DataFrame({"text": ["hello"]}), prompt="Echo {text}", model="sim-model",
                  output_column="out")
    assert keyed_sim.stats(log=False)["requests"] == 0
