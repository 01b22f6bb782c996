"""``ModelScoringComponent`` loads from a ``defs.yaml`` through Dagster's component loading and
materializes its scoring asset on a real MLflow model in a real local registry: the model
version asset, the alias sensor, the resource and Dagster's asset attributes come from the
YAML; the predictions are the model's, the metadata names its version, and the code version
follows the alias. The package registers it for ``dg``."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
from dagster.components.core.package_entry import get_package_objects_in_module
from dagster.components.testing import create_defs_folder_sandbox

import dagster_batchllm
from dagster_batchllm import ModelScoringComponent

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    feature_frame,
    fit_risk_model,
    two_risk_versions,
)
from tests.dagster.defs_yaml import loaded_defs_yaml

FEATURES = ["f1", "f2"]


@dg.asset(key=["warehouse", "features"])
def features() -> pd.DataFrame:
    frame = feature_frame(30, seed=81)
    frame.insert(0, "row_id", range(30))
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[4, "f1"] = "four"  # the model cannot read it: fails alone
    return frame


@pytest.fixture
def registry(tmp_path):
    registry = two_risk_versions(tmp_path / "registry")
    return registry


def _attributes(registry, tmp_path) -> dict:
    return {
        "name": "risk_scores",
        "source": "warehouse/features",
        "model": "risk",
        "input_columns": FEATURES,
        "output_column": "risk",
        "key_columns": ["row_id"],
        "model_version": {"name": "risk_model"},  # the resource's model_uri and registry
        "alias_sensor": {"minimum_interval_seconds": 120},
        "asset_attributes": {"group_name": "scoring", "owners": ["team:risk"],
                             "tags": {"domain": "risk"}, "deps": ["training/risk_fit"]},
        "resource": {
            "mlflow_models": [{"name": "risk", "model_uri": "models:/risk@champion"}],
            "mlflow_registry_uri": registry.uri,
            "store_url": f"sqlite:///{tmp_path / 'ledger.db'}",
        },
    }


def _load(attributes):
    """The component and its definitions, as a code location loading ``defs.yaml`` builds
    them."""
    with loaded_defs_yaml("dagster_batchllm.ModelScoringComponent", attributes,
                          "risk_scores") as loaded:
        return loaded


@pytest.mark.slow
def test_the_scoring_component_loads_from_defs_yaml_and_materializes(registry, tmp_path):
    component, defs = _load(_attributes(registry, tmp_path))
    assert isinstance(component, ModelScoringComponent) and component.model_name == "risk"
    scores = defs.get_assets_def("risk_scores")
    spec = next(iter(scores.specs))
    assert spec.group_name == "scoring" and spec.owners == ["team:risk"]
    assert spec.tags["domain"] == "risk" and spec.kinds == {"mlflow", "pandas"}
    assert {dep.asset_key for dep in spec.deps} == {
        dg.AssetKey(["warehouse", "features"]), dg.AssetKey("risk_model"),
        dg.AssetKey(["training", "risk_fit"])}
    assert {a.key for a in defs.assets} >= {dg.AssetKey("risk_model"), scores.key}
    [sensor] = defs.sensors
    assert sensor.name == "risk_scores_model_alias" and sensor.minimum_interval_seconds == 120
    llm = defs.resources["llm"]

    result = dg.materialize([features, scores], resources={"llm": llm})
    assert result.success
    table = result.output_for_node("risk_scores")
    good = table.drop(index=4)
    assert good["risk"].tolist() == fit_risk_model(1).predict(
        good[FEATURES].astype(float)).tolist()
    assert table["risk_error"][4].startswith("invalid_input:")
    metadata = result.asset_materializations_for_node("risk_scores")[0].metadata
    assert metadata["batchllm/model/version"].value == "1"
    assert metadata["batchllm/model/alias"].value == "champion"
    assert metadata["batchllm/rows_failed"].value == 1

    # The definitions loaded again after the alias moved: a new code version.
    registry.set_alias("risk", "champion", "2")
    _, moved = _load(_attributes(registry, tmp_path))
    rescored = moved.get_assets_def("risk_scores")
    assert rescored.code_versions_by_key[rescored.key] != scores.code_versions_by_key[scores.key]


@pytest.mark.slow
def test_an_alias_sensor_without_model_version_names_the_fix(registry, tmp_path):
    attributes = _attributes(registry, tmp_path)
    del attributes["model_version"]
    with pytest.raises(Exception) as info:
        _load(attributes)
    causes, error = [], info.value
    while error is not None:
        causes.append(str(error))
        error = error.__cause__
    assert any("alias_sensor watches model_version's alias" in c for c in causes)


def test_the_scoring_component_is_in_the_dg_registry():
    registered = dict(get_package_objects_in_module(dagster_batchllm))
    assert registered["ModelScoringComponent"] is ModelScoringComponent
    schema = ModelScoringComponent.model().model_json_schema()
    assert {"model", "input_columns", "model_version", "alias_sensor", "asset_attributes",
            "resource"} <= set(schema["properties"])


@pytest.mark.slow
def test_the_scaffolded_defs_yaml_loads_and_scores_once_pointed_at_the_registry(registry,
                                                                                 tmp_path):
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=ModelScoringComponent, defs_path="risk_scores",
            scaffold_params={"source": "warehouse/features", "model": "risk",
                             "output_column": "risk"})
        text = (path / "defs.yaml").read_text()
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, _):
            assert (component.model_name, component.input_columns) == ("risk", FEATURES)
        # What the user edits: where the registry and the ledger are.
        (path / "defs.yaml").write_text(
            text.replace("sqlite:///mlflow.db", registry.uri)
            .replace("sqlite:///batchllm.db", f"sqlite:///{tmp_path / 'ledger.db'}"))
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            scores, llm = defs.get_assets_def("risk_scores"), defs.resources["llm"]
            result = dg.materialize([features, scores], resources={"llm": llm})
    assert result.success
    table = result.output_for_node("risk_scores")
    assert table["risk"].drop(index=4).tolist() == fit_risk_model(1).predict(
        table.drop(index=4)[FEATURES].astype(float)).tolist()
