"""Run config given at launch merges over the resource's values set in code: a launch that sets
one field keeps the endpoints, the ledger and the default model (it once reset them to the class
defaults, failed with "Pass exactly one of model=" and created an empty ./batchllm.db)."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, Ledger, build_inference_asset

pytestmark = pytest.mark.timeout(60)
SEEN: dict[str, object] = {}


@dg.asset
def questions() -> pd.DataFrame:
    return pd.DataFrame({"q": ["where is my order", "can I get a refund"]})


answers = build_inference_asset(name="answers", source=questions, prompt="Answer: {q}",
                                output_column="answer", max_tokens=16)


@dg.asset(deps=[answers])
def resource_seen(llm: BatchInferenceResource) -> None:
    SEEN.update(store_url=llm.store_url, default_model=llm.default_model,
                progress_interval_s=llm.progress_interval_s, api_key=llm.endpoints[0].api_key,
                max_attempts=llm.max_attempts)


@pytest.fixture
def job(sim, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the class default's ./batchllm.db would appear
    monkeypatch.setenv("TEST_GPU_KEY", "key-from-env")
    llm = BatchInferenceResource(
        endpoints=[Endpoint(name="sim", base_url=sim.base_url, models=list(sim.models),
                            api_key=dg.EnvVar("TEST_GPU_KEY"))],
        default_model="sim-model", store_url=f"sqlite:///{tmp_path / 'code_ledger.db'}",
        max_attempts=2,
    )
    defs = dg.Definitions(assets=[questions, answers, resource_seen], resources={"llm": llm},
                          jobs=[dg.define_asset_job("all", selection="*")])
    SEEN.clear()
    return defs.resolve_job_def("all")


def _launch(job, run_config: dict) -> dg.ExecuteInProcessResult:
    result = job.execute_in_process(run_config=run_config, raise_on_error=False)
    assert result.success, [str(e.step_failure_data.error) for e in result.all_events
                            if e.is_step_failure]
    return result


def test_config_for_one_field_keeps_the_values_set_in_code(job, tmp_path):
    _launch(job, {"resources": {"llm": {"config": {"progress_interval_s": 1}}}})
    assert {"store_url": f"sqlite:///{tmp_path / 'code_ledger.db'}",
                    "default_model": "sim-model", "progress_interval_s": 1.0,
                    "api_key": "key-from-env", "max_attempts": 2} == SEEN
    assert not (tmp_path / "batchllm.db").exists()
    ledger = Ledger(f"sqlite:///{tmp_path / 'code_ledger.db'}")
    try:
        assert ledger.status_counts(scope="answers")["ok"] == 2
    finally:
        ledger.dispose()


def test_config_given_at_launch_wins_field_by_field(job, tmp_path):
    other = f"sqlite:///{tmp_path / 'launch_ledger.db'}"
    _launch(job, {"resources": {"llm": {"config": {"store_url": other, "max_attempts": 3}}}})
    assert SEEN["store_url"] == other and SEEN["max_attempts"] == 3
    assert SEEN["default_model"] == "sim-model" and SEEN["progress_interval_s"] == 5.0
    _launch(job, {})  # no config: the code's values, as before
    assert SEEN["store_url"] == f"sqlite:///{tmp_path / 'code_ledger.db'}"
    assert SEEN["max_attempts"] == 2
