"""The documented ``defs.yaml`` blocks as a newcomer uses them, in one project with the README's
partitioned ``calls``: the README's and docs/dagster.md's load together (each resource under
its own key), also under the real ``dg check defs``; the README's is the same asset as the
README's Python one and materializes a day over the partitioned calls; Components that declare
an equal resource share one object, and two configured differently under one key are refused,
naming both components, the key and ``resource_key:``."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from dagster_batchllm.testing import SimulatedEndpoint
from tests.dagster.dg_project import check_defs, fresh_dg_project

ROOT = Path(__file__).resolve().parents[2]
# The README's example addresses, pointed at simulated endpoints as tests/test_readme.py does.
ADDRESSES = ("http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1")
DAY = "2026-11-05"

pytestmark = pytest.mark.timeout(180)


def _blocks(page: str, language: str) -> list[str]:
    text = (ROOT / page).read_text()
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)


def _between(text: str, start: str, end: str) -> str:
    """From ``start`` to the first ``end`` after it."""
    begin = text.index(start)
    return text[begin:text.index(end, begin)]


README_YAML = _blocks("README.md", "yaml")[0]
DOCS_YAML = _blocks("docs/dagster.md", "yaml")[0]
# The README's Python: its resource `llm` and two rows, and the block that defines the
# partitioned `calls` and the `summaries` asset the YAML is "the same asset" as.
README_SETUP = _between(_blocks("README.md", "python")[0], "import os", "result = ")
README_ROWS = README_SETUP[README_SETUP.index("df = pd.DataFrame("):] + "\n"
README_ASSETS = next(b for b in _blocks("README.md", "python") if "build_inference_asset(" in b)
README_PYTHON_ASSET = README_SETUP + _between(README_ASSETS, "from dagster_batchllm import",
                                              "defs = ")
# The project's own `calls` (a Python file in the defs folder): the README's, without the asset
# the defs.yaml declares.
CALLS_MODULE = ("import dagster as dg\nimport pandas as pd\n\n" + README_ROWS
                + _between(README_ASSETS, "days = ", "summaries = "))


def _pointed_at(text: str, endpoints: tuple[SimulatedEndpoint, ...]) -> str:
    for address, sim in zip(ADDRESSES, endpoints, strict=True):
        text = text.replace(address, sim.base_url)
    return text


def _write_project(defs: Path, yaml_blocks: dict[str, str]) -> None:
    (defs / "calls.py").write_text(CALLS_MODULE)
    for folder, block in yaml_blocks.items():
        (defs / folder).mkdir()
        (defs / folder / "defs.yaml").write_text(block)


@contextmanager
def _project(yaml_blocks: dict[str, str]) -> Iterator[tuple[dg.Definitions, object]]:
    """The project's definitions, built as ``dg`` builds them (the whole defs folder's
    component tree), and the tree."""
    with create_defs_folder_sandbox() as sandbox:
        _write_project(sandbox.defs_folder_path, yaml_blocks)
        with sandbox.build_component_tree() as tree:
            yield tree.build_defs(), tree


@pytest.mark.slow
def test_the_readme_and_docs_yaml_load_together_each_resource_under_its_key():
    with _project({"summaries": README_YAML, "overnight": DOCS_YAML}) as (defs, _):
        keys = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
        assert {"calls", "call_summaries", "overnight_call_summaries"} <= keys
        assert set(defs.resources) == {"llm", "batch_llm"}
        assert defs.resources["batch_llm"].endpoints[0].batch_api
        overnight = defs.get_assets_def("overnight_call_summaries")
        assert overnight.required_resource_keys >= {"batch_llm"}


@pytest.mark.slow
def test_the_readme_yaml_is_the_readme_python_asset_and_materializes_a_day(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the YAML's ledger, sqlite:///batchllm.db, lands here
    monkeypatch.setenv("GPU_B_KEY", "sk-example")  # read when the run starts
    python: dict = {}
    # As the README runs it: without this module's `from __future__ import annotations`.
    exec(compile(README_PYTHON_ASSET, "README.md", "exec", dont_inherit=True), python)
    from_python = python["summaries"]
    with SimulatedEndpoint(models=("llama-70b",)) as a, \
            SimulatedEndpoint(models=("llama-70b",), api_key="sk-example") as b:
        with _project({"summaries": _pointed_at(README_YAML, (a, b))}) as (defs, _):
            from_yaml = defs.get_assets_def("call_summaries")
            assert from_yaml.key == from_python.key
            assert from_yaml.partitions_def == from_python.partitions_def
            assert from_yaml.backfill_policy == from_python.backfill_policy
            assert from_yaml.code_versions_by_key == from_python.code_versions_by_key
            assert from_yaml.descriptions_by_key == from_python.descriptions_by_key
            ours = [{k: v for k, v in asset.metadata_by_key[asset.key].items()
                     if k.startswith("batchllm/")} for asset in (from_yaml, from_python)]
            assert ours[0] == ours[1]  # Dagster adds the component's origin to the YAML one's
            assert set(from_yaml.keys_by_input_name.values()) == {dg.AssetKey("calls")}
            assert from_yaml.check_keys == from_python.check_keys
            with dg.instance_for_test() as instance:
                done = dg.materialize([defs.get_assets_def("calls"), from_yaml],
                                      resources=dict(defs.resources), partition_key=DAY,
                                      instance=instance)
        assert done.success
        assert a.stats(log=False)["requests"] + b.stats(log=False)["requests"] == 2
    table = done.output_for_node("call_summaries")
    assert table["call_date"].tolist() == [DAY, DAY]
    assert table["summary"].notna().all() and table["summary_error"].isna().all()
    metadata = done.asset_materializations_for_node("call_summaries")[0].metadata
    assert metadata["batchllm/rows_succeeded"].value == 2


def _inference_yaml(name: str, store_url: str, key: str | None = None) -> str:
    attributes = {"name": name, "source": "calls", "prompt": "Summarize: {transcript_text}",
                  "output_column": "summary",
                  "resource": {"managed_endpoints": [{}], "default_model": "local",
                               "store_url": store_url}}
    if key is not None:
        attributes["resource_key"] = key
    return yaml.safe_dump({"type": "dagster_batchllm.BatchInferenceComponent",
                           "attributes": attributes})


def _embedding_yaml(name: str, store_url: str) -> str:
    return yaml.safe_dump({"type": "dagster_batchllm.BatchEmbeddingComponent", "attributes": {
        "name": name, "source": "calls", "input_column": "transcript_text",
        "model": "local-embedder",
        "resource": {"managed_endpoints": [{}], "default_model": "local",
                     "store_url": store_url}}})


def test_components_declaring_an_equal_resource_share_one_object():
    blocks = {"summaries": _inference_yaml("summaries", "sqlite:///shared.db"),
              "embeddings": _embedding_yaml("embeddings", "sqlite:///shared.db")}
    with _project(blocks) as (defs, tree):
        declared = [tree.load_component(folder).resource for folder in blocks]
        assert declared[0] == declared[1] and declared[0] is not declared[1]
        assert defs.resources["llm"] in declared  # one object under the key, Dagster's merge


def test_two_resources_under_one_key_are_refused_naming_both_and_the_way_out():
    blocks = {"a_summaries": _inference_yaml("summaries", "sqlite:///one.db"),
              "b_embeddings": _embedding_yaml("embeddings", "sqlite:///other.db")}
    with pytest.raises(Exception) as info, _project(blocks):
        pass
    causes = []
    error: BaseException | None = info.value
    while error is not None:
        causes.append(error)
        error = error.__cause__
    [refusal] = [e for e in causes if isinstance(e, dg.DagsterInvalidDefinitionError)]
    message = str(refusal)
    assert "BatchInferenceComponent 'summaries'" in message
    assert "BatchEmbeddingComponent 'embeddings'" in message
    assert "under the key 'llm'" in message and "resource_key: " in message
    # Following it: another key for one of them, and the project loads with both.
    blocks["a_summaries"] = _inference_yaml("summaries", "sqlite:///one.db", key="summary_llm")
    with _project(blocks) as (defs, _):
        assert set(defs.resources) == {"llm", "summary_llm"}
        assert defs.get_assets_def("summaries").required_resource_keys >= {"summary_llm"}


@pytest.mark.slow
def test_dg_check_defs_passes_on_the_readme_and_docs_yaml_in_one_project(tmp_path):
    project = fresh_dg_project(tmp_path / "fresh_project")
    defs = project / "src" / "fresh_project" / "defs"
    _write_project(defs, {"summaries": README_YAML, "overnight": DOCS_YAML})
    check_defs(project)
    # And the README's alone beside a copy declaring another resource under `llm`: refused.
    shutil.rmtree(defs / "overnight")
    (defs / "other").mkdir()
    (defs / "other" / "defs.yaml").write_text(DOCS_YAML.replace("  resource_key: batch_llm\n", "")
                                              .replace("overnight_call_summaries", "other"))
    with pytest.raises(AssertionError, match="resource_key: "):
        check_defs(project)
