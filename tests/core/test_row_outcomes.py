"""Each row's outcome as data (``error_types``, ``statuses``), and the closed error vocabulary.

The calls talk HTTP to a real simulated server; the retry policy and the reply parser are pure
functions, tested on the real error objects the transport raises.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.retries import RetryPolicy
from dagster_batchllm.core.delivery.transport import _connection_error, _timeout_error
from dagster_batchllm.core.errors import (
    ErrorType,
    NoHealthyEndpointError,
    StructuredOutputError,
    classify_http_error,
)
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.outputs import ReplyParser, cut_off_hint
from dagster_batchllm.core.tasks.chat.rendering import iter_row_requests

MODEL = "sim-model"


def infer(client, df, **kwargs):
    return client.infer(df, prompt="{text}", model=MODEL, output_column="out", max_tokens=16,
                        **kwargs)


def test_a_request_too_large_for_every_rate_window_fails_as_request_too_large(
    sim, make_settings
):
    settings = make_settings(sim)
    settings = settings.replace(endpoints=tuple(
        dataclasses.replace(e, tokens_per_minute=100) for e in settings.endpoints))
    long_text = "a long ticket " * 20
    df = pd.DataFrame({"text": ["short", long_text]}, index=["s", "l"])
    call = InferenceCall(prompt="{text}", model=MODEL, max_tokens=16).bind(
        ["text"], SimpleNamespace(models=frozenset({MODEL}), model_when_unnamed=None))
    size = [r.reserve_tokens for r in iter_row_requests(iter([(long_text,)]), call,
                                                        default_max_tokens=512)][0]
    assert size > 100

    with InferenceClient(settings) as client:
        result = infer(client, df)
        records = client.ledger.records().set_index("error_type")

    assert result.df.loc["s", "out"] == "[sim] short"
    error = result.df.loc["l", "out_error"]
    assert error.startswith("request_too_large: ")
    assert f"up to {size} tokens" in error  # the request's size
    assert "'ep0' tokens_per_minute=100 (100 tokens per 60 s window)" in error  # the limit
    assert result.error_types.tolist() == [None, "request_too_large"]
    assert result.stats.errors_by_type == {"request_too_large": 1}
    # Final at once: never sent, never retried, and the endpoint is not blamed.
    assert sim.stats(log=False)["requests"] == 1
    assert (result.stats.requests, result.stats.retries) == (1, 0)
    assert records.loc["request_too_large", "attempts"] == 1
    assert client.pool.endpoints[0].consecutive_failures == 0


def test_each_rows_error_type_and_status_are_data_aligned_with_the_index(sim, make_client):
    client = make_client(sim)
    first = pd.DataFrame({"text": ["alpha", "beta"]}, index=[7, 3])
    answered = infer(client, first)
    assert answered.statuses.tolist() == ["ok", "ok"]
    assert answered.error_types.isna().all() and answered.deferred_rows.empty

    # alpha and beta come from the ledger, the null cell fails, gamma is past the budget.
    df = pd.DataFrame({"text": ["gamma", "alpha", None, "beta", "alpha"]},
                      index=["g", "a", "n", "b", "a2"])
    result = infer(client, df, token_budget=0)

    assert result.error_types.index.equals(df.index)
    assert result.statuses.index.equals(df.index)
    assert result.statuses.tolist() == ["deferred", "cached", "failed", "cached", "cached"]
    assert result.error_types.tolist() == ["deferred", None, "invalid_input", None, None]
    # The error text is unchanged: "<error_type>: <reason>", the type as in error_types.
    errors = result.df["out_error"]
    assert errors["g"].startswith("deferred: the token budget (0) has 0 tokens left")
    assert errors["n"] == "invalid_input: column 'text' is null"
    for label, error_type in result.error_types.dropna().items():
        assert errors[label].startswith(f"{ErrorType(error_type).value}: ")
    assert result.deferred_rows.index.tolist() == ["g"]
    assert result.failed_rows.index.tolist() == ["g", "n"]  # every row with an error
    counts = result.statuses.value_counts()
    assert (counts["cached"], counts["failed"], counts["deferred"]) == (
        result.stats.cached, result.stats.failed, result.stats.deferred)


def test_an_empty_table_has_empty_outcome_columns(sim, make_client):
    result = infer(make_client(sim), pd.DataFrame({"text": pd.Series([], dtype=object)}))
    assert result.error_types.empty and result.statuses.empty


POLICY = RetryPolicy(max_attempts=4, initial_backoff_s=0.5, max_backoff_s=3.0,
                     max_retry_after_s=10.0)


@pytest.mark.parametrize("error", [
    classify_http_error(408, "", retry_after_s=None, endpoint="e"),
    classify_http_error(409, "", retry_after_s=None, endpoint="e"),
    classify_http_error(429, "", retry_after_s=None, endpoint="e"),
    classify_http_error(500, "", retry_after_s=None, endpoint="e"),
    classify_http_error(503, "", retry_after_s=None, endpoint="e"),
    _timeout_error("e", 5.0),
    _connection_error("e", ConnectionResetError("reset by peer")),
    NoHealthyEndpointError("all cooling down"),
])
def test_retryable_errors_are_retried_until_max_attempts_which_counts_the_first(error):
    assert [POLICY.should_retry(error, attempt) for attempt in (1, 2, 3, 4)] == [
        True, True, True, False]


@pytest.mark.parametrize("error", [
    classify_http_error(400, "", retry_after_s=None, endpoint="e"),
    classify_http_error(401, "", retry_after_s=None, endpoint="e"),
    classify_http_error(404, "", retry_after_s=None, endpoint="e"),
    classify_http_error(400, "maximum context length", retry_after_s=None, endpoint="e"),
    StructuredOutputError("not JSON"),
    ValueError("a bug"),
])
def test_errors_retrying_cannot_fix_are_never_retried(error):
    assert not POLICY.should_retry(error, 1)


def test_retry_after_is_honoured_up_to_its_cap():
    def delay(seconds):
        error = classify_http_error(429, "", retry_after_s=seconds, endpoint="e")
        return POLICY.retry_delay(error, 1)

    assert (delay(0.0), delay(2.5), delay(60.0)) == (0.0, 2.5, 10.0)


def test_backoff_doubles_from_initial_with_up_to_initial_of_jitter_capped_at_max():
    error = classify_http_error(500, "", retry_after_s=None, endpoint="e")
    for attempt, floor in [(1, 0.5), (2, 1.0), (3, 2.0)]:
        delays = [POLICY.retry_delay(error, attempt) for _ in range(200)]
        assert all(floor <= d <= min(floor + 0.5, 3.0) for d in delays)
        assert max(delays) - min(delays) > 0.1  # jittered
    assert {POLICY.retry_delay(error, n) for n in (4, 10, 1000)} == {3.0}


def test_replies_parse_as_text_or_schema_checked_json_and_say_when_they_were_cut_off():
    assert ReplyParser(structured=False, schema=None).parse("{not json") == "{not json"
    parser = ReplyParser(structured=True, schema={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert parser.parse('{"n": 3}') == {"n": 3}
    with pytest.raises(StructuredOutputError, match=r"does not match the schema at n: "):
        parser.parse('{"n": "three"}')
    with pytest.raises(StructuredOutputError, match="is not valid JSON") as broken:
        parser.parse('{"n": ')
    same = cut_off_hint(broken.value, finish_reason="stop", max_tokens=8)
    assert same is broken.value
    hinted = cut_off_hint(broken.value, finish_reason="length", max_tokens=8)
    assert hinted.as_cell() == (
        f"invalid_structured_output: {broken.value.message} "
        "(the reply was cut off at max_tokens=8; raise max_tokens)")
