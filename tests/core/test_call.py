"""``InferenceCall``: built once, checked before a row is read, and versioned by what it sends."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.tasks.chat.call import InferenceCall, literal_template

BASE = InferenceCall(prompt="Summarize: {text}", model="m", output_column="summary")


@pytest.mark.parametrize("change", [
    {"prompt": "Summarise: {text}"},
    {"system": "Be brief."},
    {"model": "other"},
    {"max_tokens": 64},
    {"temperature": 0.5},
    {"generation_params": {"seed": 7}},
    {"response_format": {"type": "object", "properties": {"a": {"type": "string"}}}},
])
def test_code_version_changes_with_everything_that_changes_request_keys(change):
    assert dataclasses.replace(BASE, **change).code_version != BASE.code_version


@pytest.mark.parametrize("change", [
    {"output_column": "other"}, {"token_budget": 1000}, {"scope": "asset"},
    {"partition_key": "2026-11-05"},
])
def test_code_version_ignores_where_answers_go_and_what_to_spend(change):
    assert dataclasses.replace(BASE, **change).code_version == BASE.code_version


def test_unknown_keywords_are_generation_parameters_and_are_checked():
    call = InferenceCall.of(BASE, top_p=0.9)
    assert call.request_params == {"top_p": 0.9}
    with pytest.raises(InferenceConfigError, match="Unknown generation parameter"):
        InferenceCall.of(BASE, topp=0.9)


def _served(models: frozenset[str], default: str | None) -> SimpleNamespace:
    """What bind() reads of the settings: the served models and the default model."""
    return SimpleNamespace(models=models, model_when_unnamed=default)


def test_bind_fills_the_default_model_and_checks_columns_and_models():
    call = InferenceCall(prompt="{text}")
    assert call.bind(["text"], _served(frozenset({"m"}), "m")).model == "m"
    with pytest.raises(InferenceConfigError, match="Pass exactly one of model="):
        call.bind(["text"], _served(frozenset({"m", "n"}), None))
    with pytest.raises(InferenceConfigError, match=r"\['text'\] are not in the input"):
        call.bind(["body"], _served(frozenset({"m"}), "m"))
    with pytest.raises(InferenceConfigError, match="No configured endpoint serves model 'x'"):
        InferenceCall(prompt="{text}", model="x").bind(["text"], _served(frozenset({"m"}), None))


def test_a_literal_template_renders_to_itself():
    text = "Answer in JSON like {\"label\": ...}"
    assert literal_template(text).format() == text


@pytest.mark.parametrize(("name", "value", "match"), [
    ("max_tokens", "128", "max_tokens must be a whole number, got str"),
    ("max_tokens", 12.7, "max_tokens must be a whole number, got float"),
    ("max_tokens", True, "max_tokens must be a whole number, got bool"),
    ("max_tokens", 0, "max_tokens must be at least 1"),
    ("temperature", "0.2", "temperature must be a number, got str"),
    ("top_p", None, None),
    ("seed", 1.5, "seed must be a whole number"),
    ("stop", 3, "stop must be a string or a list of strings"),
])
def test_generation_parameters_are_checked_with_their_types(name, value, match):
    fields = {name: value} if name in ("max_tokens", "temperature") else {
        "generation_params": {name: value}}
    if match is None:
        InferenceCall.of(BASE, **fields)
        return
    with pytest.raises(InferenceConfigError, match=match):
        InferenceCall.of(BASE, **fields)


def test_numbers_from_sql_arrive_in_the_api_types():
    import decimal

    import numpy as np

    call = InferenceCall.of(BASE, max_tokens=np.int64(64), temperature=decimal.Decimal("0.5"),
                            generation_params={"seed": np.int32(3), "stop": ("\n",)})
    assert call.request_params == {"max_tokens": 64, "temperature": 0.5, "seed": 3,
                                   "stop": ["\n"]}
    assert type(call.request_params["max_tokens"]) is int


def test_literal_braces_in_a_prompt_are_explained_as_literal_braces():
    with pytest.raises(InferenceConfigError, match=r"double them: \{\{ and \}\}"):
        InferenceCall(prompt='Reply as {"label": "refund"} for: {text}', model="m")
    # Doubled, they are literal text.
    call = InferenceCall(prompt='Reply as {{"label": "refund"}} for: {text}', model="m")
    assert call.input_columns() == ["text"]
