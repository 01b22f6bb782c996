"""``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>`` writes a defs.yaml that
loads as it is (Dagster's default would write ``attributes: {}``, which cannot), also in a fresh
``dg`` project whose definitions hold nothing else: ``dg check defs`` passes there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

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


BIN = Path(sys.executable).parent
PROJECT_PYPROJECT = textwrap.dedent("""\
    [project]
    name = "fresh_project"
    version = "0.1.0"
    requires-python = ">=3.10,<3.14"
    dependencies = ["dagster", "dagster-batchllm"]

    [build-system]
    requires = ["hatchling"]
    build-backend = "hatchling.build"

    [tool.dg]
    directory_type = "project"

    [tool.dg.project]
    root_module = "fresh_project"
    registry_modules = ["fresh_project.components.*"]
""")
PROJECT_DEFINITIONS = textwrap.dedent("""\
    from pathlib import Path

    from dagster import definitions, load_from_defs_folder


    @definitions
    def defs():
        return load_from_defs_folder(path_within_project=Path(__file__).parent)
""")


def _fresh_dg_project(root: Path) -> Path:
    """The files ``create-dagster project fresh_project`` writes (create-dagster is not
    installed with the package, and the test installs nothing): a src layout whose definitions
    load the defs folder, empty."""
    package = root / "src" / "fresh_project"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(PROJECT_DEFINITIONS)
    return root


def _dg(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           # What create-dagster's `uv sync` does by installing the project: its package
           # importable (dg list defs imports it; dg check defs finds src/ itself).
           "PYTHONPATH": str(project / "src")}
    done = subprocess.run([str(BIN / "dg"), *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


def _check_defs(project: Path) -> None:
    done = _dg(project, "check", "defs")
    assert "All definitions loaded successfully" in done.stdout + done.stderr


@pytest.mark.slow
def test_dg_check_defs_passes_on_the_scaffolds_in_a_fresh_dg_project(tmp_path):
    project = _fresh_dg_project(tmp_path / "fresh_project")
    # Two inference scaffolds: each its own placeholder source, one shared resource.
    for name in ("summaries", "classifications"):
        _dg(project, "scaffold", "defs", "dagster_batchllm.BatchInferenceComponent", name)
    _check_defs(project)
    listed = json.loads(_dg(project, "list", "defs", "--json").stdout)
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert set(assets) == {"summaries", "summaries_source", "classifications",
                           "classifications_source"}
    assert assets["summaries"]["dependency_keys"] == ["summaries_source"]
    assert not assets["summaries_source"]["is_executable"]

    # The scoring scaffold alone (its resource differs from the inference scaffolds': two
    # resources under one key are Dagster's error, not the scaffold's).
    for name in ("summaries", "classifications"):
        shutil.rmtree(project / "src" / "fresh_project" / "defs" / name)
    _dg(project, "scaffold", "defs", "dagster_batchllm.ModelScoringComponent", "scores")
    _check_defs(project)
