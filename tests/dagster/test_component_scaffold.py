"""``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>`` writes a defs.yaml that
loads as it is (Dagster's default would write ``attributes: {}``, which cannot), also in a fresh
``dg`` project whose definitions hold nothing else: ``dg check defs`` passes there."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from dagster_batchllm import BatchInferenceComponent
from tests.dagster.dg_project import check_defs, dg_cli, fresh_dg_project

pytestmark = pytest.mark.timeout(120)


def test_the_scaffolded_defs_yaml_loads_without_edits():
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=BatchInferenceComponent,
                                          defs_path="summaries")
        written = yaml.safe_load((path / "defs.yaml").read_text())
        assert written["attributes"]["name"] == "summaries"
        assert written["attributes"]["external_source"] is True
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            asset = defs.get_assets_def("summaries")
            assert component.prompt == "Summarize: {text}"
            # The placeholder source is declared an external asset, so the asset has an input.
            source = dg.AssetKey("summaries_source")
            assert [d.asset_key for d in next(iter(asset.specs)).deps] == [source]
            assert [a.key for a in defs.assets if isinstance(a, dg.AssetSpec)] == [source]


def test_scaffold_params_reach_the_asset_and_it_materializes_on_the_embedded_default(tmp_path):
    prompt = 'Say "hi" to {name} in {{braces}}: ok?'
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=BatchInferenceComponent, defs_path="greetings",
            scaffold_params={"source": "people", "prompt": prompt, "output_column": "greeting",
                             "model": "local-summarizer"})
        assert "external_source" not in yaml.safe_load((path / "defs.yaml").read_text())[
            "attributes"]  # a named source is the project's own asset (here: people)
        text = (path / "defs.yaml").read_text().replace(
            "sqlite:///batchllm.db", f"sqlite:///{tmp_path / 'ledger.db'}")
        (path / "defs.yaml").write_text(text)
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert (component.prompt, component.output_column, component.model_name) == (
                prompt, "greeting", "local-summarizer")
            asset = defs.get_assets_def("greetings")
            llm = defs.resources["llm"]

            @dg.asset(name="people")
            def people() -> pd.DataFrame:
                return pd.DataFrame({"name": ["Ada", "Grace"]})

            result = dg.materialize([people, asset], resources={"llm": llm})
    assert result.success
    table = result.output_for_node("greetings")
    assert table["greeting_error"].isna().all() and table["greeting"].notna().all()



@pytest.mark.slow
def test_dg_check_defs_passes_on_the_scaffolds_in_a_fresh_dg_project(tmp_path):
    project = fresh_dg_project(tmp_path / "fresh_project")
    # Two inference scaffolds: each its own placeholder source, one shared resource.
    for name in ("summaries", "classifications"):
        dg_cli(project, "scaffold", "defs", "dagster_batchllm.BatchInferenceComponent", name)
    check_defs(project)
    listed = json.loads(dg_cli(project, "list", "defs", "--json").stdout)
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert set(assets) == {"summaries", "summaries_source", "classifications",
                           "classifications_source"}
    assert assets["summaries"]["dependency_keys"] == ["summaries_source"]
    assert not assets["summaries_source"]["is_executable"]

    # The scoring scaffold alone (its resource differs from the inference scaffolds', and two
    # resources under one key are refused: see test_documented_components.py).
    for name in ("summaries", "classifications"):
        shutil.rmtree(project / "src" / "fresh_project" / "defs" / name)
    dg_cli(project, "scaffold", "defs", "dagster_batchllm.ModelScoringComponent", "scores")
    check_defs(project)
