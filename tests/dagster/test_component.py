"""``BatchInferenceComponent`` loads from a ``defs.yaml`` and builds the same asset as the
factory; the package registers it for ``dg``."""

from __future__ import annotations

import importlib.metadata
import json

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster.components.core.package_entry import get_package_objects_in_module
from dagster.components.testing import create_defs_folder_sandbox

import dagster_batchllm
from dagster_batchllm import BatchInferenceComponent
from dagster_batchllm.testing import RISK_LEVEL_SCHEMA

pytestmark = pytest.mark.timeout(60)

DAY = "2026-11-03"
SCHEMA = RISK_LEVEL_SCHEMA
ATTRIBUTES = {
    "name": "classified_calls",
    "source": "warehouse/raw_calls",
    "system": "Classify the call's risk.",
    "prompt": "{text}",
    "model": "sim-model",
    "output_column": "classification",
    "response_format": SCHEMA,
    "max_tokens": 32,
    "temperature": 0.0,
    "partitions_def": {"type": "daily", "start_date": "2026-11-01", "end_date": "2026-11-08"},
    "partition_column": "call_date",
    "asset_attributes": {"group_name": "calls", "kinds": ["openai"]},
    "warn_failed_rate": 0.05,
    "error_failed_rate": 0.2,
    "retry_partitions": {"store_url": "{{ env.BATCHLLM_TEST_STORE_URL }}", "max_rounds": 2},
}


@dg.asset(key=["warehouse", "raw_calls"],
          partitions_def=dg.DailyPartitionsDefinition("2026-11-01", end_date="2026-11-08"))
def raw_calls(context) -> pd.DataFrame:
    return pd.DataFrame({"call_date": context.partition_key,
                         "text": [f"call {i}: where is my order?" for i in range(6)]})


def _write_defs(sandbox, attributes: dict) -> object:
    path = sandbox.defs_folder_path / "classified_calls"
    path.mkdir()
    (path / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "dagster_batchllm.BatchInferenceComponent", "attributes": attributes}))
    return path


@pytest.mark.slow
def test_component_loads_from_defs_yaml_and_materializes(sim, make_llm_resource, tmp_path,
                                                         monkeypatch):
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("BATCHLLM_TEST_STORE_URL", store_url)
    with create_defs_folder_sandbox() as sandbox:
        path = _write_defs(sandbox, ATTRIBUTES)
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, BatchInferenceComponent)
            assert component.model_name == "sim-model"
            asset = defs.get_assets_def("classified_calls")
            [sensor] = defs.sensors

    spec = next(iter(asset.specs))
    assert spec.group_name == "calls" and spec.kinds == {"openai"}
    assert [dep.asset_key for dep in spec.deps] == [dg.AssetKey(["warehouse", "raw_calls"])]
    assert asset.partitions_def.get_partition_keys()[:2] == ["2026-11-01", "2026-11-02"]
    assert asset.backfill_policy == dg.BackfillPolicy.single_run()
    assert {c.name for c in asset.check_specs} == {
        "failed_row_rate", "row_count_matches_input", "no_rows_deferred"}
    assert sensor.name == "classified_calls_retry_partitions"

    llm = make_llm_resource(sim, store_url=store_url)
    result = dg.materialize_to_memory([raw_calls, asset], partition_key=DAY,
                                      resources={"llm": llm})
    assert result.success
    table = result.output_for_node("classified_calls")
    assert table["classification_error"].isna().all()
    assert set(table["risk_level"]) <= {"High", "Medium", "Low"}
    assert json.loads(table["classification"].iloc[0]) == {"risk_level": table["risk_level"][0]}
    records = llm.ledger.records(scope="classified_calls")
    assert set(records["partition_key"]) == {DAY} and len(records) == 6


def test_component_definition_errors_name_the_fix():
    bad = {**ATTRIBUTES, "prompt_column": "text"}
    del bad["retry_partitions"]
    with create_defs_folder_sandbox() as sandbox:
        path = _write_defs(sandbox, bad)
        # Dagster wraps the factory's error in one that says which defs.yaml failed.
        with pytest.raises(Exception) as info, sandbox.load_component_and_build_defs(
                defs_path=path):
            pass
    causes = []
    error: BaseException | None = info.value
    while error is not None:
        causes.append(error)
        error = error.__cause__
    assert "classified_calls" in str(info.value)  # where: the component's defs.yaml
    [cause] = [e for e in causes if isinstance(e, dg.DagsterInvalidDefinitionError)]
    assert "pass exactly one of prompt=" in str(cause)  # what to fix


def test_component_is_in_the_dg_registry():
    entry_points = importlib.metadata.entry_points(group="dagster_dg_cli.registry_modules")
    assert any(ep.value == "dagster_batchllm" for ep in entry_points)
    registered = dict(get_package_objects_in_module(dagster_batchllm))
    assert registered == {"BatchInferenceComponent": BatchInferenceComponent,
                          "BatchEmbeddingComponent": dagster_batchllm.BatchEmbeddingComponent,
                          "ModelScoringComponent": dagster_batchllm.ModelScoringComponent}
    # Everything the YAML can say is in the component's schema, with `model` under its own name.
    schema = BatchInferenceComponent.model().model_json_schema()
    assert {"model", "prompt", "response_format", "partitions_def",
            "retry_partitions"} <= set(schema["properties"])
