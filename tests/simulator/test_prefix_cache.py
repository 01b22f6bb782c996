"""The simulated endpoint's prefix cache: vLLM's blocks of 16 tokens, an LRU, OpenAI's field."""

from __future__ import annotations

import time

import pytest

from dagster_batchllm.simulator.prefix_cache import BLOCK_CHARS, BLOCK_TOKENS, PrefixCache
from dagster_batchllm.testing import SimulatedEndpoint, openai_client

MODEL = "sim-model"
INSTRUCTION = "Classify the ticket below by urgency and product area. " * 80  # ~1,100 tokens


def ask(client, user: str, system: str = INSTRUCTION):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return client.chat.completions.create(model=MODEL, messages=messages)


def test_a_shared_head_is_served_from_the_cache_in_whole_blocks():
    cache = PrefixCache(capacity_tokens=100_000)
    head = "h" * (BLOCK_CHARS * 10)
    assert cache.serve(head + "first row", 700) == 0
    assert cache.serve(head + "second row", 700) == 10 * BLOCK_TOKENS  # the head's ten blocks
    assert cache.serve("another head" + head, 700) == 0  # a prefix, not any shared text
    # The last character is always computed (vLLM needs its logits), so never all of it.
    assert cache.serve(head, 640) == 9 * BLOCK_TOKENS
    assert cache.stats()["requests"] == 4
    assert cache.stats()["cached_tokens"] == 19 * BLOCK_TOKENS


def test_least_recently_used_blocks_go_first_and_a_shared_head_outlives_tails():
    cache = PrefixCache(capacity_tokens=20 * BLOCK_TOKENS)
    head = "h" * (BLOCK_CHARS * 8)
    cache.serve(head + "t" * (BLOCK_CHARS * 8) + "!", 1000)
    # A second prompt fills the cache past its 20 blocks: the first prompt's tail goes, its
    # head stays, as it was touched last (tail first) and again now.
    cache.serve(head + "u" * (BLOCK_CHARS * 8) + "!", 1000)
    assert cache.stats()["blocks"] == 20
    assert cache.serve(head + "v" * (BLOCK_CHARS * 8) + "!", 1000) == 8 * BLOCK_TOKENS
    # Other prompts' blocks push a head out once it is the least recently used.
    for i in range(3):
        cache.serve(str(i) * (BLOCK_CHARS * 20) + "!", 1000)
    assert cache.serve(head + "w!", 1000) == 0


def test_off_by_default_and_the_usage_then_has_no_details(sim):
    reply = ask(openai_client(sim), "hello")
    assert reply.usage.prompt_tokens_details is None
    assert sim.stats(log=False)["prefix_cache"]["requests"] == 0


def test_replies_report_cached_tokens_in_openais_field_and_stats_total_them():
    with SimulatedEndpoint(prefix_cache_tokens=50_000) as sim:
        client = openai_client(sim)
        first, second = ask(client, "ticket one"), ask(client, "ticket two")
        other = ask(client, "ticket three", system="Something else entirely. " * 100)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached % BLOCK_TOKENS == 0
        assert 0.9 * first.usage.prompt_tokens < cached < first.usage.prompt_tokens
        assert other.usage.prompt_tokens_details.cached_tokens == 0
        stats = sim.stats(log=False)["prefix_cache"]
        assert stats["requests"] == 3 and stats["cached_tokens"] == cached
        assert stats["prompt_tokens"] == sim.stats(log=False)["prompt_tokens"]
        sim.reset_stats()  # counters go, the blocks stay
        assert ask(client, "ticket four").usage.prompt_tokens_details.cached_tokens == cached
        sim.restart()  # a restarted server lost its GPU memory
        assert ask(client, "ticket five").usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.slow
def test_prefill_latency_falls_with_cached_tokens_in_a_subprocess_too():
    # 1,100 prompt tokens at 0.2 ms each: ~0.22 s uncached, ~0 once the instruction is cached.
    with SimulatedEndpoint(process=True, prefix_cache_tokens=50_000,
                           prefill_s_per_token=0.0002) as sim:
        client = openai_client(sim)
        timings = []
        for user in ("one", "two"):
            start = time.perf_counter()
            ask(client, user)
            timings.append(time.perf_counter() - start)
        assert timings[0] > 0.2 > 0.1 > timings[1]
        assert sim.stats(log=False)["prefix_cache"]["cached_tokens"] > 1000
