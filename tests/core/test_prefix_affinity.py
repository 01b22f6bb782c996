"""Prefix-affinity routing: rows that share a long head go where their prefix cache holds it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dagster_batchllm.core.requests import PREFIX_KEY_BYTES, prefix_key
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.rendering import _row_by_row, iter_row_requests
from dagster_batchllm.testing import SimulatedEndpoint, post_json

MODEL = "sim-model"
INSTRUCTIONS = 8
CACHE_TOKENS = 1536  # per endpoint: two of the instructions below with their rows' tails


def instruction(n: int) -> str:
    """~500 tokens (2,000 characters), distinct for each ``n`` from its first word on."""
    words = f"Instructions {n}: label the ticket with its urgency and product area. "
    return (words * 40)[:2000]


def tickets(rows: int, instructions: int, tag: str = "") -> pd.DataFrame:
    return pd.DataFrame({"instruction": [instruction(i % instructions) for i in range(rows)],
                         "text": [f"{tag}ticket {i}" for i in range(rows)]})


def cached_share(sims) -> float:
    caches = [sim.stats(log=False)["prefix_cache"] for sim in sims]
    return sum(c["cached_tokens"] for c in caches) / sum(c["prompt_tokens"] for c in caches)


def run(make_client, sims, df, *, affinity: bool, **kwargs):
    client = make_client(*sims, prefix_affinity=affinity, endpoint_kwargs={"max_concurrency": 8},
                         **kwargs)
    return client.infer(df, prompt="Ticket: {text}", system="{instruction}", model=MODEL,
                        output_column="label", max_tokens=8)


def fresh_caches(sims) -> None:
    for sim in sims:
        sim.configure(prefix_cache_tokens=0)
        sim.configure(prefix_cache_tokens=CACHE_TOKENS)
        sim.reset_stats()


@pytest.mark.slow
def test_affinity_keeps_each_instruction_cached_where_least_loaded_does_not(make_client):
    sims = [SimulatedEndpoint(latency_s=0.01, prefix_cache_tokens=CACHE_TOKENS).start()
            for _ in range(4)]
    try:
        shares, spread = {}, {}
        for affinity in (False, True):
            df = tickets(1600, INSTRUCTIONS, tag=f"{affinity} ")  # no answers from the ledger
            fresh_caches(sims)
            result = run(make_client, sims, df, affinity=affinity)
            assert result.stats.succeeded == len(df) and result.stats.failed == 0
            shares[affinity] = cached_share(sims)
            spread[affinity] = [sim.stats(log=False)["ok"] for sim in sims]
        # Each endpoint's cache holds two instructions: least-loaded sends it all eight.
        assert shares[True] >= 0.80, shares
        assert shares[False] < 0.55, shares
        # Rows of different instructions still spread over every endpoint.
        assert min(spread[True]) >= len(df) / 4 * 0.5, spread
    finally:
        for sim in sims:
            sim.stop()


def test_rows_with_their_own_long_heads_spread_as_least_loaded_does(make_client):
    sims = [SimulatedEndpoint(latency_s=0.01).start() for _ in range(4)]
    try:
        df = pd.DataFrame({"instruction": [f"{i} " + instruction(0) for i in range(400)],
                           "text": ["ticket"] * 400})
        result = run(make_client, sims, df, affinity=True)
        assert result.stats.succeeded == 400
        assert min(sim.stats(log=False)["ok"] for sim in sims) >= 50
    finally:
        for sim in sims:
            sim.stop()


def test_a_failing_owner_loses_its_prefix_to_the_others_and_no_row_fails(make_client):
    with SimulatedEndpoint(latency_s=0.005, prefix_cache_tokens=CACHE_TOKENS) as first, \
            SimulatedEndpoint(latency_s=0.005, prefix_cache_tokens=CACHE_TOKENS) as second:
        first.script(*(["ok"] * 30 + [500] * 200))  # serves 30 rows, then fails every request
        result = run(make_client, [first, second], tickets(300, 1), affinity=True,
                     breaker_failure_threshold=3, breaker_cooldown_s=60.0)
        assert result.stats.succeeded == 300 and result.stats.failed == 0
        assert result.stats.endpoints["ep0"]["failed"] >= 3  # its breaker opened
        # The rest went to the second endpoint, whose cache then held the instruction.
        taken_over = second.stats(log=False)
        assert taken_over["ok"] >= 270
        cache = taken_over["prefix_cache"]
        assert cache["cached_tokens"] >= 0.8 * cache["prompt_tokens"]


def test_the_servers_cached_tokens_are_openais_field_in_the_reply():
    with SimulatedEndpoint(prefix_cache_tokens=CACHE_TOKENS) as sim:
        body = {"model": MODEL, "messages": [{"role": "system", "content": instruction(1)},
                                             {"role": "user", "content": "ticket"}]}
        post_json(sim, "chat/completions", body)
        status, raw = post_json(sim, "chat/completions", body)
        usage = json.loads(raw)["usage"]
        assert status == 200
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]


def test_prefix_keys_are_the_bodies_heads_on_every_path():
    long = InferenceCall(prompt="Ticket: {text}", system=instruction(2), model="m",
                         output_column="out")
    rows = [("a",), ("b",)]
    blocks = list(iter_row_requests(iter(rows), long, default_max_tokens=8, prefix_keys=True))
    assert blocks[0].prefix_key == blocks[1].prefix_key == prefix_key(blocks[0].body) is not None
    assert blocks[0].body[:PREFIX_KEY_BYTES] == blocks[1].body[:PREFIX_KEY_BYTES]
    general = [r.body for r in _row_by_row(iter(rows), long, default_max_tokens=8)]
    assert general == [r.body for r in blocks]
    # A short head: each row's own key where its body is long enough, None where it is not.
    short = InferenceCall(prompt="Summarize: {text}", model="m", output_column="out")
    made = list(iter_row_requests(iter([("x" * 2000,), ("y" * 2000,), ("short",)]), short,
                                  default_max_tokens=8, prefix_keys=True))
    assert [r.prefix_key for r in made] == [prefix_key(r.body) for r in made]
    assert made[0].prefix_key != made[1].prefix_key and made[2].prefix_key is None
    # Without prefix_keys (the setting off), no keys: every request least-loaded.
    assert all(r.prefix_key is None
               for r in iter_row_requests(iter(rows), long, default_max_tokens=8))
    # The general path (a system prompt with fields) keys its rows the same way.
    fielded = InferenceCall(prompt="Ticket: {text}", system="{instruction}", model="m",
                            output_column="out")
    assert fielded.input_columns() == ["text", "instruction"]
    made = list(iter_row_requests(iter([("a", instruction(2)), ("a", instruction(3))]), fielded,
                                  default_max_tokens=8, prefix_keys=True))
    assert made[0].prefix_key == blocks[0].prefix_key != made[1].prefix_key
