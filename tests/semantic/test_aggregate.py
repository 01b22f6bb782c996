"""llm.aggregate against a simulated endpoint with a small context: every row reaches a level-1
request whole (counted at the server), reruns send nothing, a grown group re-sends only its
changed chunks, and failures are the group's data with a reason."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.semantic.reduce import CONTEXT_SHARE
from dagster_batchllm.simulator.aggregation import answer_text, rows_digest
from tests.semantic.aggregate_helpers import (
    CONTEXT,
    INSTRUCTION,
    aggregating_endpoint,
    complaints,
)


@pytest.fixture
def agg_sim():
    yield from aggregating_endpoint()


@pytest.fixture
def client(agg_sim, make_client):
    return make_client(agg_sim, endpoint_kwargs={"max_context_tokens": CONTEXT})


def test_a_group_ten_times_the_context_is_reduced_whole_and_a_rerun_sends_nothing(
        agg_sim, client):
    texts = complaints(400)
    assert sum(len(t) for t in texts) / 4 > 10 * CONTEXT  # the group is 10x the context
    df = pd.DataFrame({"body": texts})

    result = client.aggregate(df, instruction=INSTRUCTION, column="body", max_tokens=32)

    [answer] = result.df["answer"].tolist()
    assert result.df["answer_error"].tolist() == [None]
    # The server counted every row once, whole, in level-1 requests; the answer combines them.
    assert answer == answer_text(400, rows_digest(texts))
    assert agg_sim.responder.rows_seen == Counter(texts)
    figures = result.figures
    assert figures.levels >= 2 and sum(figures.rows_per_level1_request) == 400
    stats = agg_sim.stats(log=False)
    assert stats["requests"] == stats["ok"] == figures.requests_sent == sum(
        figures.requests_per_level)
    assert "400" not in stats["by_status"]  # no request over the context
    assert figures.sent_per_level[-1] == 1 and figures.requests_per_level[-1] == 1

    again = client.aggregate(df.sample(frac=1, random_state=3), instruction=INSTRUCTION,
                             column="body", max_tokens=32)  # shuffled: the same chunks
    assert again.df["answer"].tolist() == [answer]
    assert agg_sim.stats(log=False)["requests"] == stats["requests"]
    assert again.figures.sent_per_level == [0] * figures.levels


def test_a_grown_group_re_sends_only_the_chunks_its_new_rows_land_in(agg_sim, client):
    texts = complaints(400)
    first = client.aggregate(pd.DataFrame({"body": texts}), instruction=INSTRUCTION,
                             column="body", max_tokens=32)
    sent_first = first.figures.requests_sent
    level1 = first.figures.requests_per_level[0]
    grown = texts + complaints(3, seed=99, start=400)

    result = client.aggregate(pd.DataFrame({"body": grown}), instruction=INSTRUCTION,
                              column="body", max_tokens=32)

    assert result.df["answer"].tolist() == [answer_text(403, rows_digest(grown))]
    sent = result.figures.sent_per_level
    assert 1 <= sent[0] <= 3 + 1  # the chunks the 3 rows land in (one may split in two)
    assert sum(sent) < sent_first / 3 and sent[0] < level1 / 5
    assert agg_sim.responder.rows_seen.keys() == set(grown)


def test_groups_null_cells_and_keys_and_a_row_too_long_for_any_request(agg_sim, client):
    room = int((CONTEXT - 32) * CONTEXT_SHARE) * 4
    df = pd.DataFrame({
        "product": ["lamp", "lamp", "chair", None, "desk", "desk", "sofa"],
        "body": ["broken on arrival", None, "wobbly leg", "no product named", "  ",
                 None, "x" * room]})

    result = client.aggregate(df, instruction=INSTRUCTION, column="body", by="product",
                              max_tokens=32, output_column="verdict")

    out = result.df
    assert list(out.columns) == ["product", "verdict", "verdict_error"]
    by_product = {p: (v, e) for p, v, e in out.itertuples(index=False)}
    assert by_product["lamp"] == (answer_text(1, rows_digest(["broken on arrival"])), None)
    assert by_product["chair"][0] == answer_text(1, rows_digest(["wobbly leg"]))
    assert by_product["desk"] == (None, None)  # no text left: NULL, as SQL aggregates
    assert [v for p, v, _ in out.itertuples(index=False) if pd.isna(p)] == [
        answer_text(1, rows_digest(["no product named"]))]  # NULL keys are a group
    value, error = by_product["sofa"]
    assert value is None and error.startswith("context_length_exceeded: a row of this group")
    assert "never cut" in error
    assert agg_sim.responder.rows_at_level1 == 3  # nothing of the sofa's row was sent


def test_a_failed_request_fails_its_group_with_the_reason(agg_sim, client):
    agg_sim.script(400)  # a bad request: no retry fixes it
    df = pd.DataFrame({"g": ["a"], "body": ["one complaint"]})

    result = client.aggregate(df, instruction=INSTRUCTION, column="body", by=["g"],
                              max_tokens=32)

    [error] = result.df["answer_error"].tolist()
    assert error.startswith("bad_request: ") and "a level-1 request of this group" in error
    assert result.df["answer"].tolist() == [None]


def test_a_token_budget_defers_the_group_and_a_rerun_finishes_it(agg_sim, client):
    df = pd.DataFrame({"body": complaints(200)})

    short = client.aggregate(df, instruction=INSTRUCTION, column="body", max_tokens=32,
                             token_budget=2_000)

    [error] = short.df["answer_error"].tolist()
    assert error.startswith("deferred: ")
    spent = agg_sim.stats(log=False)["requests"]
    done = client.aggregate(df, instruction=INSTRUCTION, column="body", max_tokens=32)
    assert done.df["answer"].tolist() == [answer_text(200, rows_digest(df["body"]))]
    assert done.figures.sent_per_level[0] == done.figures.requests_per_level[0] - spent


def test_mistakes_in_the_call_raise_before_anything_is_sent(agg_sim, client):
    df = pd.DataFrame({"g": [1], "body": ["text"]})
    mistakes = [
        (dict(column="nope"), "not in the input table"),
        (dict(column="body", by=["body"]), "both the text column and a grouping column"),
        (dict(column="body", max_tokens=400), "lower max_tokens"),
        (dict(column="body", model="gpt-9"), "no configured endpoint serves"),
        (dict(column="body", instruction=" "), "pass instruction="),
        (dict(column="body", context_tokens=0), "context_tokens must be"),
        (dict(column="body", by="g", output_column="g"), "is a grouping column"),
        (dict(column="body", prompt="Summarize"), r"unknown argument\(s\) \['prompt'\]"),
        (dict(), "pass column="),
        (dict(column="body", order_by="day"), "order_by column"),
        (dict(column="body", mode="later"), "mode must be"),
    ]
    for kwargs, says in mistakes:
        with pytest.raises(InferenceConfigError, match=says):
            client.aggregate(df, **{"instruction": INSTRUCTION, **kwargs})
    assert agg_sim.stats(log=False)["requests"] == 0


def test_the_resource_aggregates_through_the_same_client(agg_sim, make_llm_resource):
    llm = make_llm_resource(agg_sim, endpoint_kwargs={"max_context_tokens": CONTEXT})
    df = pd.DataFrame({"product": ["lamp", "chair"], "body": ["broken", "wobbly"]})

    result = llm.aggregate(df, instruction=INSTRUCTION, column="body", by="product",
                           max_tokens=32)

    assert result.df["answer"].tolist() == [answer_text(1, rows_digest(["wobbly"])),
                                           answer_text(1, rows_digest(["broken"]))]
    assert result.stats.requests == 2


def test_rows_ordered_by_a_column_change_only_the_last_chunks_when_rows_are_appended(
        agg_sim, client):
    texts = complaints(400)
    df = pd.DataFrame({"ticket_id": range(400), "body": texts})
    first = client.aggregate(df.sample(frac=1, random_state=5), instruction=INSTRUCTION,
                             column="body", order_by="ticket_id", max_tokens=32)
    grown = pd.concat([df, pd.DataFrame({"ticket_id": range(400, 403),
                                         "body": complaints(3, seed=99, start=400)})])

    result = client.aggregate(grown, instruction=INSTRUCTION, column="body",
                              order_by="ticket_id", max_tokens=32)

    assert result.df["answer"].tolist() == [answer_text(403, rows_digest(grown["body"]))]
    # Only the tail changes: the last level-1 chunk (or a new one after it), then at most one
    # request a level above it.
    assert result.figures.sent_per_level[0] <= 2
    assert all(sent <= 1 for sent in result.figures.sent_per_level[1:])
    assert first.figures.requests_sent > 5 * result.figures.requests_sent


def test_through_a_batch_api_each_level_is_a_batch_and_a_rerun_sends_nothing(agg_sim,
                                                                              make_client):
    client = make_client(agg_sim, endpoint_kwargs={"max_context_tokens": CONTEXT,
                                                   "batch_api": True},
                         batch_poll_initial_s=0.02, batch_poll_max_s=0.05)
    texts = complaints(200)

    result = client.aggregate(pd.DataFrame({"body": texts}), instruction=INSTRUCTION,
                              column="body", max_tokens=32, mode="batch_api")

    assert result.df["answer"].tolist() == [answer_text(200, rows_digest(texts))]
    assert len(agg_sim.batches()) == result.figures.levels >= 2  # a batch per level
    assert agg_sim.stats(log=False)["requests"] == 0  # nothing online
    assert all(stats.mode == "batch_api" for stats in result.figures.stats_per_level)
    again = client.aggregate(pd.DataFrame({"body": texts}), instruction=INSTRUCTION,
                             column="body", max_tokens=32, mode="batch_api")
    assert again.figures.requests_sent == 0 and len(agg_sim.batches()) == result.figures.levels
