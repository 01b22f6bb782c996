"""What ``BatchInferenceComponent``'s YAML can say comes from where each concept lives: the call's
attributes are InferenceCall's fields, ``asset_attributes`` are Dagster's, ``resource`` is the
resource's fields; and the docstring's example ``defs.yaml`` loads."""

from __future__ import annotations

import dataclasses
import inspect

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from dagster_batchllm import BatchInferenceComponent, BatchInferenceResource, build_inference_asset
from dagster_batchllm.core.tasks.chat.call import InferenceCall

pytestmark = pytest.mark.timeout(60)

PER_RUN = {"scope", "partition_key"}
SECRET = "sk-component-secret-0123456789"


def _load(sandbox, attributes: dict, folder: str = "inferred"):
    path = sandbox.defs_folder_path / folder
    path.mkdir()
    (path / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "dagster_batchllm.BatchInferenceComponent", "attributes": attributes}))
    return sandbox.load_component_and_build_defs(defs_path=path)


def test_call_attributes_are_inference_call_fields():
    call_fields = {f.name: f for f in dataclasses.fields(InferenceCall)
                   if f.name not in PER_RUN}
    properties = BatchInferenceComponent.model().model_json_schema()["properties"]
    assert not PER_RUN & set(properties)  # set per run, not in YAML
    for name, call_field in call_fields.items():
        assert properties[name]["description"] == call_field.metadata["description"], name

    component_fields = {f.name: f for f in dataclasses.fields(BatchInferenceComponent)}
    component = BatchInferenceComponent(name="a", source=dg.AssetKey("b"))
    assert set(component.call_attributes()) == set(call_fields)
    defaults = InferenceCall.__dataclass_fields__
    for name in call_fields:
        attribute = "model_name" if name == "model" else name
        assert attribute in component_fields, name
        expected = defaults[name].default
        if expected is dataclasses.MISSING:
            expected = defaults[name].default_factory()
        assert component.call_attributes()[name] == expected, name


def test_every_call_attribute_reaches_the_call():
    attributes = {
        "name": "answers", "source": "questions", "prompt": "Answer: {q}",
        "system": "Be brief.", "model": "sim-model", "output_column": "answer",
        "error_column": "answer_problem", "max_tokens": 16, "temperature": 0.5,
        "generation_params": {"seed": 7}, "response_format": {"type": "text"},
        "token_budget": 5000,
    }
    with create_defs_folder_sandbox() as sandbox, _load(sandbox, attributes) as (component, _):
        call = InferenceCall(**component.call_attributes())
    assert call == InferenceCall(
        prompt="Answer: {q}", system="Be brief.", model="sim-model", output_column="answer",
        error_column="answer_problem", max_tokens=16, temperature=0.5,
        generation_params={"seed": 7}, response_format={"type": "text"}, token_budget=5000)


def test_component_covers_the_factory_arguments():
    # The factory's own arguments are attributes; AssetSpec's come as asset_attributes, the
    # call's as InferenceCall's fields; a Python transform has no YAML form.
    not_attributes = {"call", "call_fields", "transform", "group_name", "description", "kinds",
                      "tags", "owners"}
    parameters = set(inspect.signature(build_inference_asset).parameters) - not_attributes
    assert parameters <= {f.name for f in dataclasses.fields(BatchInferenceComponent)}


def test_asset_attributes_reach_the_asset():
    attributes = {
        "name": "answers", "source": "questions", "prompt": "{q}",
        "asset_attributes": {
            "group_name": "support", "owners": ["team:support"], "tags": {"tier": "gold"},
            "metadata": {"owner_note": "daily"}, "deps": ["reference/faq"],
            "code_version": "3", "description": "Answers to questions.",
        },
    }
    with create_defs_folder_sandbox() as sandbox, _load(sandbox, attributes) as (_, defs):
        spec = next(iter(defs.get_assets_def("answers").specs))
    assert spec.group_name == "support" and spec.owners == ["team:support"]
    assert spec.tags["tier"] == "gold" and spec.code_version == "3"
    assert spec.description == "Answers to questions."
    assert spec.kinds == {"batchllm", "pandas"}  # not given: the factory's default
    assert spec.metadata["owner_note"] == "daily"
    assert spec.metadata["batchllm/output_column"] == "output"  # the factory's stays
    assert {d.asset_key for d in spec.deps} == {dg.AssetKey("questions"),
                                                dg.AssetKey(["reference", "faq"])}


@pytest.mark.parametrize(("asset_attributes", "message"), [
    ({"partitions_def": {"type": "static", "partition_keys": ["a"]}},
     "set partitions_def itself"),
    ({"skippable": True}, "do not apply to an inference asset"),
])
def test_asset_attributes_the_asset_cannot_take_name_the_fix(asset_attributes, message):
    with pytest.raises(dg.DagsterInvalidDefinitionError, match=message):
        build_inference_asset(name="a", source="b", prompt="{x}",
                              asset_attributes=asset_attributes)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="give each once"):
        build_inference_asset(name="a", source="b", prompt="{x}", group_name="g",
                              asset_attributes={"group_name": "h"})


def _docstring_example() -> str:
    """The indented block after "Example ``defs.yaml``::" in the component's docstring."""
    doc = inspect.cleandoc(BatchInferenceComponent.__doc__)
    lines = doc.split("Example ``defs.yaml``::", 1)[1].splitlines()[1:]
    block = []
    for line in lines:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    return inspect.cleandoc("\n".join(block))


def test_docstring_example_defs_yaml_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_A_API_KEY", SECRET)
    monkeypatch.setenv("BATCHLLM_STORE_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / "transcript_summaries"
        path.mkdir()
        (path / "defs.yaml").write_text(_docstring_example())
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            asset = defs.get_assets_def("transcript_summaries")
            [sensor] = defs.sensors
            resource = defs.resources["llm"]
    spec = next(iter(asset.specs))
    assert spec.group_name == "calls" and spec.owners == ["team:support"]
    assert [d.asset_key for d in spec.deps] == [dg.AssetKey("cleaned_transcripts")]
    assert sensor.name == "transcript_summaries_retry_partitions"
    assert isinstance(resource, BatchInferenceResource)
    [endpoint] = resource.endpoints
    assert endpoint.models == ["llama-70b"] and resource.default_model == "llama-70b"
    # {env: NAME} stays an EnvVar, read when a run starts: the key is not in the definitions.
    assert isinstance(endpoint.api_key, dg.EnvVar) and endpoint.api_key.env_var_name == (
        "GPU_A_API_KEY")
    assert isinstance(resource.store_url, dg.EnvVar)
    assert SECRET not in repr(component) + repr(resource)


@dg.asset(key="questions")
def questions() -> pd.DataFrame:
    return pd.DataFrame({"q": ["Where is my order?", "Can I get a refund?"]})


@pytest.mark.slow
def test_a_defs_yaml_alone_provides_the_resource(sim, tmp_path):
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    attributes = {
        "name": "answers", "source": "questions", "prompt": "Answer: {q}",
        "output_column": "answer", "resource_key": "assistant",
        "resource": {"endpoints": [{"name": "sim", "base_url": sim.base_url,
                                    "models": list(sim.models)}],
                     "default_model": "sim-model", "store_url": store_url},
    }
    with create_defs_folder_sandbox() as sandbox, _load(sandbox, attributes) as (_, defs):
        asset = defs.get_assets_def("answers")
        resources = dict(defs.resources)
    assert set(resources) == {"assistant"}
    result = dg.materialize_to_memory([questions, asset], resources=resources)
    assert result.success
    table = result.output_for_node("answers")
    assert table["answer_error"].isna().all() and table["answer"].str.len().gt(0).all()


def test_retry_sensor_without_store_url_needs_the_resource():
    attributes = {"name": "answers", "source": "questions", "prompt": "{q}",
                  "partitions_def": {"type": "static", "partition_keys": ["a"]},
                  "retry_partitions": {"max_rounds": 2}}
    with (create_defs_folder_sandbox() as sandbox, pytest.raises(Exception) as info,
          _load(sandbox, attributes)):
        pass
    causes, error = [], info.value
    while error is not None:
        causes.append(str(error))
        error = error.__cause__
    assert any("retry_partitions needs store_url" in c for c in causes), causes
