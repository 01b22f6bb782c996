"""Chunk boundaries: within the room, independent of the rows' order, and stable when rows are
added (only the chunks the new rows land in change)."""

from __future__ import annotations

import random

from dagster_batchllm.ai_functions.aggregate_prompts import (
    PARTIALS,
    ROWS,
    read_request,
    user_message,
)
from dagster_batchllm.ai_functions.chunking import cut_chunks, item_cost


def texts(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"row {seed}-{i} " + "word " * rng.randint(2, 30) for i in range(n)]


def test_chunks_hold_every_item_once_within_the_room_whatever_the_order():
    items = texts(2_000)
    chunks = cut_chunks(items, room_chars=2_000)
    assert sorted(t for c in chunks for t in c) == sorted(items)
    assert all(sum(item_cost(t) for t in c) <= 2_000 for c in chunks)
    assert cut_chunks(list(reversed(items)), room_chars=2_000) == chunks
    assert len(chunks) < len(items) / 5


def test_appended_rows_change_only_the_chunks_they_land_in():
    items = texts(2_000)
    before = {tuple(c) for c in cut_chunks(items, room_chars=2_000)}
    added = texts(10, seed=2)

    after = {tuple(c) for c in cut_chunks(items + added, room_chars=2_000)}

    changed = after - before
    assert len(changed) <= 2 * len(added)  # a landing chunk, or it split in two
    assert all(any(t in added for t in c) or len(c) > 0 for c in changed)
    assert len(before - after) <= len(added)  # the rest are the very same requests


def test_a_level_of_few_large_items_still_makes_progress():
    items = ["x" * 400 + str(i) for i in range(5)]  # each a large share of the room
    chunks = cut_chunks(items, room_chars=1_000)
    assert len(chunks) < len(items)


def test_a_request_reads_back_as_its_items_whatever_they_hold():
    items = ['a "quoted"\nline', "{braces} and \\ backslashes", "ünïcode ✓"]
    for kind in (ROWS, PARTIALS):
        message = user_message(kind, items)
        assert read_request([{"role": "user", "content": message}]) == (kind, items)
    assert read_request([{"role": "user", "content": "Summarize: a call"}]) is None
