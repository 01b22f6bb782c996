"""What an inference asset says about itself before it runs, and what its tables say after:
code version, description, kinds, column types, and which rows failed."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import (
    BatchInferenceResource,
    Endpoint,
    ManagedEndpoint,
    build_inference_asset,
)
from dagster_batchllm.core.errors import ErrorType
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.factories.error_kinds import KIND_BY_TYPE, ErrorKind, describe_errors
from dagster_batchllm.factories.metadata import column_schema

SCHEMA = {
    "type": "object",
    "properties": {"risk": {"type": "string", "enum": ["High", "Low"]},
                   "score": {"type": "integer"}},
    "required": ["risk", "score"],
}
pytestmark = pytest.mark.timeout(60)


def _asset(**kwargs) -> dg.AssetsDefinition:
    options = {"name": "summaries", "source": "calls", "prompt": "Summarize: {text}",
               "output_column": "summary", **kwargs}
    return build_inference_asset(**options)


def _spec(asset: dg.AssetsDefinition) -> dg.AssetSpec:
    return asset.specs_by_key[asset.key]


def test_the_code_version_is_the_calls_and_a_prompt_edit_changes_it():
    asset = _asset(max_tokens=64)
    call = InferenceCall(prompt="Summarize: {text}", output_column="summary", max_tokens=64)
    assert _spec(asset).code_version == call.code_version
    assert _spec(_asset(prompt="Summarize briefly: {text}", max_tokens=64)).code_version != (
        call.code_version)
    assert _spec(_asset(max_tokens=65)).code_version != call.code_version
    # One given explicitly is the user's to manage.
    assert _spec(_asset(asset_attributes={"code_version": "7"})).code_version == "7"


def test_the_description_names_the_model_and_shows_the_prompts_and_schema():
    described = _spec(_asset(system="You classify calls.", response_format=SCHEMA,
                             model="llama-70b", temperature=0.0)).description
    assert "model `llama-70b`" in described
    assert "`Summarize: {text}`" in described
    assert "```text\nYou classify calls.\n```" in described
    assert '"enum": [\n        "High"' in described  # the JSON schema, as JSON
    assert "`temperature=0.0`" in described
    assert "the resource's `default_model`" in _spec(_asset()).description
    assert "per-row models from column `model`" in _spec(_asset(model_column="model")).description


def test_the_resource_says_which_kinds_of_server_answer():
    def kinds(**fields) -> set[str]:
        return BatchInferenceResource(**fields).asset_kinds()

    assert kinds(endpoints=[Endpoint(name="o", base_url="https://api.openai.com/v1",
                                     models=["gpt-4o-mini"])]) == {"openai"}
    assert kinds(endpoints=[Endpoint(name="v", base_url="http://10.0.0.5:8000/v1",
                                     models=["llama"])]) == {"batchllm"}
    assert kinds(managed_endpoints=[ManagedEndpoint(kind="vllm")]) == {"vllm"}
    assert kinds(managed_endpoints=[ManagedEndpoint()]) == {"batchllm"}


def test_column_types_are_the_values_types():
    df = pd.DataFrame({
        "text": ["a", None], "n": [1, 2], "x": [0.5, None], "flag": [True, False],
        "at": pd.to_datetime(["2026-11-01", "2026-11-02"]),
        "day": [dt.date(2026, 11, 1), None], "reply": [{"a": 1}, None],
        "ints_as_objects": pd.Series([1, None], dtype=object),
    })
    types = {c.name: c.type for c in column_schema(df, {"text": "The text."}).columns}
    assert types == {"text": "string", "n": "int", "x": "float", "flag": "bool",
                     "at": "timestamp", "day": "date", "reply": "json",
                     "ints_as_objects": "int"}
    described = {c.name: c.description for c in column_schema(df, {"text": "The text."}).columns}
    assert described["text"] == "The text." and described["n"] is None


@dg.asset
def calls() -> pd.DataFrame:
    return pd.DataFrame({"call_id": [f"c{i}" for i in range(6)],
                         "text": ["where is my order", None, "refund please", " ", "hi", "ok"]})


def _materialize(sim, make_llm_resource, **kwargs) -> dict:
    asset = build_inference_asset(name="classified", source=calls, prompt="{text}",
                                  output_column="label", response_format=SCHEMA, **kwargs)
    result = dg.materialize_to_memory([calls, asset], resources={
        "llm": make_llm_resource(sim, default_model="sim-model")})
    assert result.success
    [materialization] = result.asset_materializations_for_node("classified")
    return {k: v.value for k, v in materialization.metadata.items()}


def test_structured_columns_are_typed_and_described(sim, make_llm_resource):
    metadata = _materialize(sim, make_llm_resource, key_columns=["call_id"])
    columns = {c.name: c for c in metadata["dagster/column_schema"].columns}
    assert columns["label"].type == "json"
    assert columns["risk"].type == "string" and "one of High, Low" in columns["risk"].description
    assert columns["score"].type == "int"
    assert "'<error_type>: <reason>'" in columns["label_error"].description
    assert columns["call_id"].type == "string" and columns["call_id"].description is None


@pytest.mark.slow
def test_failed_rows_are_listed_with_their_keys_or_positions(sim, make_llm_resource):
    keyed = _materialize(sim, make_llm_resource, key_columns=["call_id"])["batchllm/failed_rows"]
    assert [(r.data["call_id"], r.data["error_type"], r.data["retryable"])
            for r in keyed.records] == [("c1", "invalid_input", False),
                                        ("c3", "invalid_input", False)]
    assert keyed.records[0].data["reason"] == "column 'text' is null"
    positions = _materialize(sim, make_llm_resource)["batchllm/failed_rows"]
    assert [r.data["row"] for r in positions.records] == [1, 3]


@pytest.mark.slow
def test_key_columns_missing_from_the_input_fail_before_anything_is_sent(sim, make_llm_resource):
    asset = build_inference_asset(name="classified", source=calls, prompt="{text}",
                                  output_column="label", key_columns=["ticket_id"])
    result = dg.materialize_to_memory([calls, asset], raise_on_error=False, resources={
        "llm": make_llm_resource(sim, default_model="sim-model")})
    assert not result.success
    assert sim.stats(log=False)["requests"] == 0
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "key_columns ['ticket_id'] are not in the input table" in str(
        failure.step_failure_data.error)


def test_every_error_type_says_whether_a_retry_can_fix_it():
    # A new error type must be classified on purpose (the sensor, checks and metadata read it).
    assert {t.value for t in ErrorType} == set(KIND_BY_TYPE)
    not_retryable = {t for t, kind in KIND_BY_TYPE.items() if not kind.retryable}
    assert not_retryable == {"invalid_input", "context_length_exceeded", "request_too_large",
                             "unsupported_task"}
    assert describe_errors({"timeout": 1, "invalid_input": 3, "rate_limited": 2}) == (
        f"invalid_input 3 - {ErrorKind.INPUT.advice}. "
        f"rate_limited 2, timeout 1 - {ErrorKind.TRANSIENT.advice}")
