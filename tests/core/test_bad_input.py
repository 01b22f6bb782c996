"""Bad input and bad replies: each a clear per-row error, or an exception before any request.

No bad cell or bad reply may crash the call or drop a row.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from dagster_batchllm import InferenceConfigError
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.testing import EchoResponder, SimulatedEndpoint

MODEL = "sim-model"


def infer(client, df, **kwargs):
    kwargs.setdefault("prompt", "Echo {text}")
    return client.infer(df, model=MODEL, output_column="out", **kwargs)


def assert_every_row_has_one_outcome(result, df):
    out = result.df
    assert len(out) == len(df) and out.index.equals(df.index)
    answered = out["out"].notna()
    failed = out["out_error"].notna()
    assert (answered ^ failed).all()  # exactly one of output and error per row
    stats = result.stats
    assert stats.succeeded + stats.failed + stats.deferred == stats.rows == len(df)


def test_bad_cells_become_row_errors_and_no_row_is_dropped(sim, make_client):
    cells = {
        "none": None,
        "nan": float("nan"),
        "numpy_nan": np.nan,
        "pd_na": pd.NA,
        "nat": pd.NaT,
        "empty": "",
        "whitespace": " \t\n ",
        "dict": {"a": 1},
        "list": ["x", "y"],
        "bad_bytes": b"\xff\xfe",
        "int": 42,
        "float": 2.5,
        "bool": True,
        "utf8_bytes": "café".encode(),
        "braces": "keep {these} {{braces}} and {0} }{",
        "format_spec": "{text!r:>10}",
        "normal": "a normal sentence",
    }
    df = pd.DataFrame({"text": pd.Series(list(cells.values()), dtype=object,
                                         index=pd.Index(list(cells), name="case"))})

    result = infer(make_client(sim), df)

    assert_every_row_has_one_outcome(result, df)
    out = result.df
    errors = out["out_error"]
    for case in ("none", "nan", "numpy_nan", "pd_na", "nat"):
        assert errors[case] == "invalid_input: column 'text' is null", case
    for case in ("empty", "whitespace"):
        assert errors[case] == "invalid_input: column 'text' is empty", case
    assert errors["dict"] == "invalid_input: column 'text' holds a dict, not text"
    assert errors["list"] == "invalid_input: column 'text' holds a list, not text"
    # A number or bytes where a prompt expected text is usually the wrong column: an error that
    # says how to convert, unless the call asks for cells_as_text (below). Braces in data are
    # data, never template syntax.
    for case, kind in (("bad_bytes", "bytes"), ("int", "an int"), ("float", "a float"),
                       ("bool", "a bool"), ("utf8_bytes", "bytes")):
        assert errors[case] == (
            f"invalid_input: column 'text' holds {kind}, not text; convert the column "
            "(df['text'].astype(str)) or pass cells_as_text=True"), case
    assert out.loc["braces", "out"] == "[sim] Echo keep {these} {{braces}} and {0} }{"
    assert out.loc["format_spec", "out"] == "[sim] Echo {text!r:>10}"
    assert out.loc["normal", "out"] == "[sim] Echo a normal sentence"
    assert result.stats.failed == 14 and result.stats.succeeded == 3

    converted = infer(make_client(sim), df, cells_as_text=True)
    assert_every_row_has_one_outcome(converted, df)
    out, errors = converted.df, converted.df["out_error"]
    assert errors["bad_bytes"] == "invalid_input: column 'text' holds bytes that are not UTF-8"
    assert errors["dict"] == "invalid_input: column 'text' holds a dict, not text"
    assert out.loc["int", "out"] == "[sim] Echo 42"
    assert out.loc["float", "out"] == "[sim] Echo 2.5"
    assert out.loc["bool", "out"] == "[sim] Echo True"
    assert out.loc["utf8_bytes", "out"] == "[sim] Echo café"
    assert converted.stats.failed == 10 and converted.stats.succeeded == 7
    assert result.stats.errors_by_type == {"invalid_input": 14}
    assert converted.stats.errors_by_type == {"invalid_input": 10}
    # Bad rows never reach the server: 3 requests, then the 4 converted cells (the other 3
    # were answered already).
    assert sim.stats(log=False)["requests"] == 3 + 4


def test_bad_prompt_column_and_messages_cells_are_row_errors(sim, make_client):
    client = make_client(sim)
    prompts = pd.DataFrame({"p": ["fine prompt", None, "  "]})
    result = client.infer(prompts, prompt_column="p", model=MODEL, output_column="out")
    assert_every_row_has_one_outcome(result, prompts)
    assert result.df["out_error"].tolist() == [
        None, "invalid_input: column 'p' is null", "invalid_input: column 'p' is empty"]

    messages = pd.DataFrame({"m": [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}],
        json.dumps([{"role": "user", "content": "from a JSON string"}]),
        "not json at all",
        [],
        [{"role": "user"}],
        [{"role": "user", "content": "   "}],
    ]})
    result = client.infer(messages, messages_column="m", model=MODEL, output_column="out")
    assert_every_row_has_one_outcome(result, messages)
    assert result.df["out"].tolist()[:2] == ["[sim] hi there", "[sim] from a JSON string"]
    assert result.df["out_error"].tolist()[2:] == [
        "invalid_input: the messages cell is a string but not JSON",
        "invalid_input: the messages cell must be a non-empty list of {role, content}",
        "invalid_input: each message needs 'role' and 'content'",
        "invalid_input: a 'user' message has empty content",
    ]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(prompt="Summarize {missing_column}"), r"\['missing_column'\] are not in the input"),
        (dict(prompt="Summarize {text} {}"), "positional field"),
        (dict(prompt="Summarize {text"), "not a valid format string"),
        (dict(prompt="x", prompt_column="text"), "exactly one of prompt="),
        (dict(prompt_column="nope"), r"\['nope'\] are not in the input"),
        (dict(prompt="{text}", model_column="nope", model=None), r"\['nope'\]"),
        (dict(prompt="{text}", max_tokens=0), "max_tokens must be at least 1"),
        (dict(prompt="{text}", frequency_penaltyy=1.0), "Unknown generation parameter"),
        (dict(prompt="{text}", response_format={"type": "object", "properties": 5}),
         "not a valid JSON schema"),
        (dict(prompt="{text}", system="You are {persona}"), r"\['persona'\]"),
        (dict(prompt="Price: {text:.2f}"), "numeric format specs"),
        (dict(prompt="First letter: {text[0]}"), "attribute and index access"),
        (dict(prompt="{text.upper}"), "attribute and index access"),
    ],
)
def test_mistakes_in_the_call_raise_before_any_request(sim, make_client, kwargs, match):
    df = pd.DataFrame({"text": ["hello", "world"]})
    kwargs = {"model": MODEL, **kwargs}
    if kwargs["model"] is None:
        del kwargs["model"]
    with pytest.raises(InferenceConfigError, match=match):
        make_client(sim).infer(df, output_column="out", **kwargs)
    assert sim.stats(log=False)["requests"] == 0


def test_unknown_model_without_model_column_raises_before_any_request(sim, make_client):
    with pytest.raises(InferenceConfigError, match="No configured endpoint serves model 'gpt-9'"):
        make_client(sim).infer(pd.DataFrame({"text": ["a"]}), prompt="{text}", model="gpt-9")
    assert sim.stats(log=False)["requests"] == 0


def test_prompt_longer_than_the_configured_context_fails_that_row_before_sending(
    sim, make_settings
):
    settings = make_settings(sim)
    settings = settings.replace(endpoints=(
        dataclasses.replace(settings.endpoints[0], max_context_tokens=64),))
    df = pd.DataFrame({"text": ["short one", "word " * 200, "short two"]})
    with InferenceClient(settings) as client:
        result = infer(client, df, max_tokens=16)
    assert_every_row_has_one_outcome(result, df)
    error = result.df["out_error"][1]
    assert error.startswith("context_length_exceeded: ")
    assert "64-token context of 'sim-model'" in error
    assert result.df["out"][[0, 2]].tolist() == ["[sim] Echo short one", "[sim] Echo short two"]
    assert sim.stats(log=False)["requests"] == 2  # the long prompt was never sent


def test_prompt_longer_than_the_servers_context_is_a_row_error_not_a_retry(sim, make_client):
    sim.configure(max_context_tokens=60)
    df = pd.DataFrame({"text": ["short one", "word " * 200, "short two"]})
    client = make_client(sim)

    result = infer(client, df, max_tokens=16)

    assert_every_row_has_one_outcome(result, df)
    error = result.df["out_error"][1]
    assert error.startswith("context_length_exceeded: HTTP 400 from endpoint 'ep0'")
    assert "maximum context length is 60 tokens" in error
    server = sim.stats(log=False)
    assert server["requests"] == 3 and server["by_status"] == {"200": 2, "400": 1}
    record = client.ledger.records().set_index("error_type").loc["context_length_exceeded"]
    assert (record["status"], record["attempts"]) == ("failed", 1)


@pytest.mark.parametrize(
    ("fault", "error_start", "detail"),
    [
        ("malformed", "malformed_response: ", "body that is not JSON"),
        ("no_choices", "malformed_response: ", "without 'choices'"),
        ("empty", "malformed_response: ", "empty content"),
    ],
)
@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_broken_replies_are_row_errors(sim, make_client, fault, error_start, detail,
                                       http_client):
    sim.configure(latency_s=0.002)
    sim.script(fault)
    df = pd.DataFrame({"text": [f"row {i}" for i in range(6)]})
    client = make_client(sim, http_client=http_client, max_attempts=3)

    result = infer(client, df)

    assert_every_row_has_one_outcome(result, df)
    errors = result.df["out_error"].dropna()
    assert len(errors) == 1, errors.tolist()
    assert errors.iloc[0].startswith(error_start) and detail in errors.iloc[0]
    assert result.stats.succeeded == 5
    assert sim.stats(log=False)["requests"] == 6  # a broken 200 is not paid for again


def test_structured_reply_that_is_not_json_is_a_row_error(sim, make_client):
    sim.configure(latency_s=0.002)
    sim.script("bad_structured")
    schema = {"type": "object", "properties": {"label": {"type": "string"}},
              "required": ["label"]}
    df = pd.DataFrame({"text": [f"row {i}" for i in range(4)]})
    client = make_client(sim)

    result = infer(client, df, response_format=schema)

    assert_every_row_has_one_outcome(result, df)
    errors = result.df["out_error"].dropna()
    assert len(errors) == 1
    assert errors.iloc[0].startswith("invalid_structured_output: the reply is not valid JSON")
    assert all(isinstance(v, dict) for v in result.df["out"].dropna())
    # The raw reply is kept in the ledger for inspection.
    failed = client.ledger.records().query("status == 'failed'")
    assert failed["response"].iloc[0].startswith('{"sim": "bad_structured"')


class OffSchemaResponder(EchoResponder):
    """Answers JSON that breaks the schema for rows mentioning 'broken' (serves MODEL)."""

    def respond(self, model, messages, params) -> str:
        text = messages[-1]["content"]
        if "broken" in text:
            return json.dumps({"label": 7, "score": "high"})
        return json.dumps({"label": "fine", "score": 0.5})


def test_structured_reply_breaking_the_schema_is_a_row_error(make_client):
    schema = {"type": "object", "required": ["label", "score"],
              "properties": {"label": {"type": "string"}, "score": {"type": "number"}}}
    df = pd.DataFrame({"text": ["ok row", "broken row", "another ok row"]})
    with SimulatedEndpoint(responder=OffSchemaResponder()) as sim:
        result = infer(make_client(sim), df, response_format=schema)
    assert_every_row_has_one_outcome(result, df)
    assert result.df["out"][[0, 2]].tolist() == [{"label": "fine", "score": 0.5}] * 2
    error = result.df["out_error"][1]
    assert error.startswith("invalid_structured_output: the reply does not match the schema")
    assert "not of type" in error  # names the offending field and why
    assert ("at label" in error) or ("at score" in error)


def test_a_call_of_nothing_but_bad_rows_returns_instead_of_raising(sim, make_client):
    df = pd.DataFrame({"text": [None, "", float("nan")]})
    result = infer(make_client(sim), df)
    assert_every_row_has_one_outcome(result, df)
    assert result.stats.failed == 3 and sim.stats(log=False)["requests"] == 0


def test_an_empty_table_returns_an_empty_result(sim, make_client):
    df = pd.DataFrame({"text": pd.Series([], dtype=object)})
    result = infer(make_client(sim), df)
    assert len(result.df) == 0 and list(result.df.columns) == ["text", "out", "out_error"]
    assert result.stats.rows == 0 and sim.stats(log=False)["requests"] == 0
