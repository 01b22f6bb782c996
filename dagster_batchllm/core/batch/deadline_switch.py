"""A deadline's switch (see :mod:`.deadline`): the partition's unfinished batches cancelled,
the lines they answered collected, and the rows none answered sent online."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...results import RowStatus
from ...run.engine import InferenceRun
from .book import COLLECTED, SUBMIT_FAILED
from .deadline import (
    CANCEL_WAIT_S,
    LEFT_FOR_ONLINE,
    DeadlineKeeper,
    cancel_unfinished,
    duplicates,
    iso,
)

if TYPE_CHECKING:
    from .mode import BatchModeCall, _Merged

_CANCEL_POLL_S = 0.25


async def deadline_keeper(call: BatchModeCall, deadline: float) -> DeadlineKeeper:
    """The call's keeper, its online rate measured from the ledger (on a thread)."""
    settings, spec = call.settings, call.call
    max_tokens = getattr(spec, "max_tokens", None) or settings.default_max_tokens
    tokens_per_request = float(max_tokens)
    if any(e.tokens_per_minute for e in settings.endpoints):
        # A tokens-per-minute limit bounds the rate by the tokens a request takes: the plan's.
        plan = await asyncio.to_thread(call.client.plan, call.inputs, spec)
        if plan.requests_to_send:
            tokens_per_request = ((plan.input_tokens + plan.expected_output_tokens)
                                  / plan.requests_to_send)
    return await asyncio.to_thread(
        DeadlineKeeper, deadline, settings=settings, ledger=call.client.ledger, book=call.book,
        model=spec.model, max_tokens=max_tokens, tokens_per_request=tokens_per_request,
        wait=call.wait, scope=spec.scope, partition_key=spec.partition_key, log=call.log)


async def switch_to_online(call: BatchModeCall, rows: Sequence[int], merged: _Merged) -> None:
    """Answer ``rows`` (of the call's table) now: from the batches that end within the cancel
    wait, the rest online."""
    keeper = call.deadline
    assert keeper is not None
    scope, partition_key = call.call.scope, call.call.partition_key
    keeper.switched_at = time.time()
    cancelled = await cancel_unfinished(call.book, call.protocols, scope, partition_key,
                                        call.log)
    if cancelled:
        call.log.info(f"batchllm: the deadline {iso(keeper.deadline)} is near: "
                      f"{len(rows)} rows still unanswered; cancelled "
                      f"{len(cancelled)} batches, waiting up to {CANCEL_WAIT_S:.0f} s for what "
                      "they answered")
        await _wait_until_ended(call, cancelled)
    # What the ended batches answered, from the book; every other row is left for online.
    ended = await asyncio.to_thread(call.book.undelivered, scope, partition_key,
                                    (COLLECTED, SUBMIT_FAILED))
    await call._pass(rows, merged, delivered=ended, submits=False)
    left = [i for i in rows if LEFT_FOR_ONLINE in (merged.errors[i] or "")]
    # The batches still unfinished: their rows go online, so the partition no longer waits
    # for them, and what they answer from now on is a duplicate.
    answered = set(ended)
    late = await asyncio.to_thread(_unfinished_of, call,
                                   [sub for sub in cancelled if sub not in answered])
    await asyncio.to_thread(call.book.mark_overtaken, late)
    if left:
        await _send_online(call, left, merged)
    if late:  # one more look: a batch that ended meanwhile answered rows twice
        await call.collector.refresh(only=late)
    count, cost = await asyncio.to_thread(duplicates, call.book, call.settings, scope,
                                          partition_key)
    if count:
        call.log.warning(f"batchllm: {count} rows were answered by a batch after they went "
                         f"online (${cost:.6f} at the batch price); the ledger keeps the "
                         "online answers")


def _unfinished_of(call: BatchModeCall, subs: list[str]) -> list[str]:
    found = []
    for sub in subs:
        row = call.book.batch(sub)
        if row is not None and row["status"] not in (COLLECTED, SUBMIT_FAILED):
            found.append(sub)
    return found


async def _wait_until_ended(call: BatchModeCall, subs: list[str]) -> None:
    until = time.monotonic() + CANCEL_WAIT_S
    while True:
        rows = await call.collector.refresh(only=subs)
        if all(r["status"] in (COLLECTED, SUBMIT_FAILED) for r in rows):
            return
        if time.monotonic() >= until:
            return
        await asyncio.sleep(_CANCEL_POLL_S)


async def _send_online(call: BatchModeCall, rows: list[int], merged: _Merged) -> None:
    """An ordinary online run over ``rows``, within what the call's budgets have left (the
    batches' charges stay: their lines may still be answered, and paid)."""
    spec, task = call.call, call.task
    frame = call.inputs.iloc[rows]
    client = call.client
    run = InferenceRun(
        task.run_settings(call.settings, client.pool.capacity(spec.model)), frame, task=task,
        delivery=client._online_delivery(task, call.log), pool=client.pool,
        ledger=client.ledger,
        token_budget=call.budget.remaining if call.budget is not None else None,
        partition_key=spec.partition_key, run_id=call.run_id, scope=spec.scope,
        logger=call.log, collect_keys=call.collect_keys,
        budget_usd=call.cost_budget.remaining if call.cost_budget is not None else None)
    await run.run()
    merged.answered_online += run.row_status.count(RowStatus.OK)
    merged.add(run, rows, online=True)
    merged.add_endpoints(run.stats.endpoints)


__all__ = ["deadline_keeper", "switch_to_online"]
