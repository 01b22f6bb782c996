"""``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>`` writes a defs.yaml that
loads as it is (Dagster's default would write ``attributes: {}``, which cannot)."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from dagster_batchllm import BatchInferenceComponent

pytestmark = pytest.mark.timeout(120)


def test_the_scaffolded_defs_yaml_loads_without_edits():
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=BatchInferenceComponent,
                                          defs_path="summaries")
        written = yaml.safe_load((path / "defs.yaml").read_text())
        assert written["attributes"]["name"] == "summaries"
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            asset = defs.get_assets_def("summaries")
            assert component.prompt == "Summarize: {text}"
            assert [d.asset_key for d in next(iter(asset.specs)).deps] == [
                dg.AssetKey("upstream_table")]


def test_scaffold_params_reach_the_asset_and_it_materializes_on_the_embedded_default(tmp_path):
    prompt = 'Say "hi" to {name} in {{braces}}: ok?'
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=BatchInferenceComponent, defs_path="greetings",
            scaffold_params={"source": "people", "prompt": prompt, "output_column": "greeting",
                             "model": "local-summarizer"})
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
