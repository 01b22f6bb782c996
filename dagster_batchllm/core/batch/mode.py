"""``infer(..., mode="batch_api")``: a call answered through a provider's offline batch API.

The call runs as passes of the ordinary engine over a :class:`~.batch_api.delivery.BatchDelivery`:

1. Before each pass the collector polls the book's unfinished batches and collects those that
   ended (see :mod:`dagster_batchllm.core.delivery.batch_api.collect`).
2. The pass answers what the ledger holds, turns collected lines into row outcomes (recorded
   in the ledger by the engine, as online), and writes every other row into a batch file,
   submitted as the file fills and at the end of the pass. Those rows are deferred, "waiting
   for batch <id>".
3. ``wait=False`` returns there: a later run (the batch sensor's) collects the answers without
   submitting anything. ``wait=True`` polls the batches the deferred rows wait for, with a
   growing interval and a progress line per poll, and runs the next pass over those rows only;
   lines that failed retryably or that an expired or cancelled batch never answered are
   submitted again in that pass, within ``max_attempts``.

The token budget is charged at submission (a line's reservation, which cannot be taken back
once the provider has it) and not again when its answer is collected. The result holds each
row's outcome from the pass that settled it; its figures add up every pass, and its cost is
priced at the batch price (``stats.online_cost_usd`` says what the same tokens cost online).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ..delivery.batch_api.book import COLLECTED, SUBMIT_FAILED, BatchBook
from ..delivery.batch_api.collect import BatchCollector, progress_line
from ..delivery.batch_api.delivery import LEFT_FOR_ONLINE, BatchDelivery
from ..delivery.batch_api.providers import batch_config_problem, protocol_for
from ..delivery.batch_api.submit import batch_name
from ..delivery.limits import CostBudget, TokenBudget
from ..errors import InferenceConfigError
from ..results import InferenceStats, RowStatus
from ..run.engine import InferenceRun
from ..run.figures import estimate_cost, finish_stats, paid_totals
from ..run.gc_pacing import BATCH_THRESHOLDS, fewer_collections
from ..tasks.base import CallBase, Task
from .deadline import (
    CANCEL_WAIT_S,
    DeadlineKeeper,
    cancel_unfinished,
    deadline_at,
    duplicates,
    iso,
)

MODES = ("online", "batch_api")
ENDED_HERE = (COLLECTED, SUBMIT_FAILED)  # batches with nothing more to collect
# Ledger writes of a batch pass come thousands a second (no network in between): written in
# larger batches than online's, which bound what a crash loses of answers arriving one by one
# (a pass loses none: they are in the book). A write of 16,384 records in key order shares
# B-tree pages among more of them than one of 4,096 (see in_key_order): about a tenth less
# CPU per collected row, for about 5 MiB more held at most.
_PASS_FLUSH_ROWS = 32768
_WAITING = "waiting for batch"
# Rows per engine run of a pass (see BatchModeCall._pass).
_SLICE_ROWS = 16_384
# How often the switch looks whether the batches it cancelled have ended.
_CANCEL_POLL_S = 0.25


def check_mode(mode: str, wait: bool) -> None:
    if mode not in MODES:
        raise InferenceConfigError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    if not isinstance(wait, bool):
        raise InferenceConfigError(f"wait must be True or False, got {wait!r}.")


def check_delivery(mode: str, wait: bool, deadline: Any) -> float | None:
    """How a call's requests go, checked before anything is sent; the deadline's epoch
    seconds (None without one)."""
    check_mode(mode, wait)
    due = deadline_at(deadline)
    if due is not None and mode != "batch_api":
        raise InferenceConfigError(
            "deadline= is for mode='batch_api' (the batch API first, online for what it "
            "has not answered in time); an online call sends every row now.")
    return due


class BatchModeCall:
    """One call in batch mode; :meth:`run` returns an object with the engine run's row arrays
    (``outputs``, ``errors``, ``error_types``, ``row_status``, ``keys``) and ``stats``."""

    def __init__(self, client: Any, call: CallBase, task: Task, inputs: Any, *, wait: bool,
                 token_budget: int | None, run_id: str | None, logger: Any,
                 budget_usd: float | None = None, deadline: float | None = None,
                 collect_keys: bool):
        settings = client.settings
        self.task = task
        if call.model is not None and settings.batch_endpoint_for(call.model) is None:
            raise InferenceConfigError(
                f"mode='batch_api' needs an endpoint with batch_api=True serving "
                f"'{call.model}'; set Endpoint(..., batch_api=True) on the provider's endpoint "
                "or use mode='online'.")
        if not any(e.batch_api for e in settings.endpoints):
            raise InferenceConfigError(
                "mode='batch_api' needs an endpoint with batch_api=True (a provider with a "
                "batch API: OpenAI, Azure OpenAI, Together, Groq, Mistral).")
        # Said before a row is read (e.g. embeddings through Anthropic's batches): of the
        # endpoint the call's model goes to, or of every batch endpoint (a model per row).
        for endpoint in ([settings.batch_endpoint_for(call.model)] if call.model is not None
                         else [e for e in settings.endpoints if e.batch_api]):
            problem = batch_config_problem(endpoint, task.route)
            if problem:
                raise InferenceConfigError(f"mode='batch_api': {problem}.")
        self.client, self.settings, self.call, self.inputs = client, settings, call, inputs
        self.wait, self.run_id, self.log = wait, run_id, logger
        self.collect_keys = collect_keys
        self.budget = TokenBudget(token_budget) if token_budget is not None else None
        # budget_usd: each line is charged its most possible cost at submission (the plan
        # was checked before this call; see BatchDelivery).
        self.cost_budget = CostBudget(budget_usd) if budget_usd is not None else None
        self.book = BatchBook(client.ledger)
        self.protocols = {e.name: protocol_for(e) for e in settings.endpoints if e.batch_api}
        self.collector = BatchCollector(self.book, self.protocols, log=logger,
                                        hold_for=(call.scope, call.partition_key))
        # No claims between runs: the book's (key, attempt) uniqueness keeps two runs from
        # submitting a key both, and nothing of a pass uses an endpoint's online limits.
        self._refused = 0  # passes in a row whose submissions all failed
        self.pass_settings = settings.replace(
            ledger_flush_rows=max(settings.ledger_flush_rows, _PASS_FLUSH_ROWS),
            coordinate_runs=False)
        self._deadline_at = deadline
        self.deadline: DeadlineKeeper | None = None  # made when the call runs (see _run)

    async def run(self) -> _Merged:
        # The collector's objects (a line result per answered line) are no more garbage than
        # the engine runs' (see gc_pacing): the whole call, not only its passes.
        with fewer_collections(BATCH_THRESHOLDS):
            return await self._run()

    async def _run(self) -> _Merged:
        merged = _Merged(len(self.inputs), self.collect_keys)
        rows: Sequence[int] = range(len(self.inputs))  # the rows this pass covers
        started = time.perf_counter()
        keeper = self.deadline = (await deadline_keeper(self, self._deadline_at)
                                  if self._deadline_at is not None else None)
        try:
            # A partition with nothing submitted yet whose rows would miss the deadline if they
            # waited for a batch first (or that even the online endpoints cannot answer in
            # time): online now. (With batches out, the first pass says how many rows wait.)
            done = keeper is not None and not await asyncio.to_thread(
                self._has_batches_out) and (keeper.say_if_out_of_reach(len(rows))
                                           or keeper.due(len(rows)))
            if done:
                await switch_to_online(self, rows, merged)
            while not done:
                await self.collector.refresh()
                # A pass over the whole table settles every row of the partition's ended
                # batches (from the book, or from the ledger where another run wrote them).
                ended = (await asyncio.to_thread(
                    self.book.undelivered, self.call.scope, self.call.partition_key, ENDED_HERE)
                    if isinstance(rows, range) else [])
                delivery = await self._pass(rows, merged, delivered=ended)
                if not delivery.waiting:
                    break
                waiting = len(merged.waiting_rows())
                if keeper is not None and (keeper.say_if_out_of_reach(waiting)
                                           or keeper.due(waiting)):
                    await switch_to_online(self, merged.waiting_rows(), merged)
                    break
                if not self.wait:
                    if keeper is not None:
                        await asyncio.to_thread(keeper.record_switch_time, waiting)
                    break
                if await self._wait_for(delivery.waiting, until=(
                        keeper.switch_at(waiting) if keeper is not None else None)):
                    await switch_to_online(self, merged.waiting_rows(), merged)
                    break
                rows = merged.waiting_rows()
                if not rows:
                    break
        finally:
            if self.collector.in_hand:  # collected while waiting, or a pass that did not end
                await asyncio.to_thread(self.collector.release_in_hand)
            for protocol in self.protocols.values():
                protocol.close()
        merged.finish(self.settings, started=started)
        if keeper is not None:
            s = merged.stats
            keeper.online_rows = merged.answered_online
            keeper.batch_rows = s.succeeded - s.cached - merged.answered_online
            # Of the partition, also those a later collection found (see deadline.duplicates).
            keeper.duplicate_rows, keeper.duplicate_cost_usd = await asyncio.to_thread(
                duplicates, self.book, self.settings, self.call.scope, self.call.partition_key)
            s.deadline = keeper.figures(finished_at=keeper.clock(), unanswered=s.deferred)
        return merged

    async def _pass(self, rows: Sequence[int], merged: _Merged,
                    delivered: Sequence[str] = (), *, submits: bool = True) -> BatchDelivery:
        """One pass over ``rows``: an engine run per slice of them, over one delivery (so
        files fill across slices). What an engine run keeps per row until it ends (a deferred
        row's key and outcome, its dictionaries' slots) is then a slice's, not the table's;
        a key met again in a later slice finds its line in the book and waits for that
        batch."""
        task = self.task
        delivery = BatchDelivery(
            self.settings, self.book, self.protocols, route=task.route,
            budget=self.budget, cost_budget=self.cost_budget, scope=self.call.scope,
            partition_key=self.call.partition_key,
            run_id=self.run_id, log=self.log, answered=self.collector.answers,
            in_hand=self.collector.in_hand, submits=submits)
        lines = task.batch_line(delivery)  # what the engine hands the rows to
        try:
            for start in range(0, max(1, len(rows)), _SLICE_ROWS):
                part = rows[start:start + _SLICE_ROWS]
                frame = (self.inputs.iloc[part.start:part.stop] if isinstance(part, range)
                         else self.inputs.iloc[part])
                run = InferenceRun(
                    self.pass_settings, frame, task=task, delivery=lines,
                    pool=self.client.pool, ledger=self.client.ledger, token_budget=None,
                    partition_key=self.call.partition_key, run_id=self.run_id,
                    scope=self.call.scope, logger=self.log, collect_keys=self.collect_keys)
                await run.run()
                merged.add(run, part)
        except BaseException:
            await delivery.wait_for_uploads()
            await delivery.discard()
            raise
        # Each engine run wrote its records before returning: the answers the collector had
        # in hand are in the ledger now, their batches collected.
        await asyncio.to_thread(self.collector.deliver_in_hand, delivery.taken)
        await delivery.submit_open_files()
        merged.add_endpoints(delivery.snapshot())  # the pass's figures (the runs' are running)
        await asyncio.to_thread(self._name_batches, merged, rows, delivery.submitted)
        # The outcomes of the ended batches' lines are in the ledger now (each engine run
        # wrote its records before returning): this partition no longer waits for them.
        await asyncio.to_thread(self.book.mark_delivered, {*delivery.consumed, *delivered},
                                self.call.scope, self.call.partition_key)
        return delivery

    def _has_batches_out(self) -> bool:
        """Whether the partition has batches its rows wait for (submitted by an earlier run)."""
        return any(row["delivered_at"] is None for row in self.book.all_batches(
            self.call.scope, self.call.partition_key))

    def _name_batches(self, merged: _Merged, rows: Sequence[int],
                      submitted: dict[str, str | None]) -> None:
        """Deferred rows of files submitted at the end of the pass name their batch id, in
        the result and in the ledger."""
        renamed: dict[str, str] = {}
        errors = merged.errors
        for row in rows:
            cell = errors[row]
            if cell is None:
                continue
            new = renamed.get(cell)
            if new is None:
                new = renamed[cell] = (batch_name(submitted, cell) or cell
                                       if "(file " in cell else cell)
            errors[row] = new
        self.book.deferrals.rename(self.call.scope, self.call.partition_key, renamed)

    async def _wait_for(self, submissions: set[str], until: float | None = None) -> bool:
        """Poll the batches until they end (False), or until the epoch time ``until`` (a
        deadline's switch time; True)."""
        delay = self.settings.batch_poll_initial_s
        while True:
            rows = await self.collector.refresh(only=submissions)
            pending = [r for r in rows if r["status"] not in ("collected", "submit_failed")]
            if not pending:
                if rows and all(r["status"] == "submit_failed" for r in rows):
                    # Nothing reached the provider (it refused or could not be reached): the
                    # next pass submits again, after a pause that grows with each such pass.
                    self._refused += 1
                    pause = min(self.settings.batch_poll_max_s,
                                self.settings.batch_poll_initial_s * 2 ** self._refused,
                                *(() if until is None else (max(0.0, until - time.time()),)))
                    self.log.warning(f"batchllm: no batch could be submitted; trying again in "
                                     f"{pause:.0f} s (within max_attempts)")
                    await asyncio.sleep(pause)
                return False
            if until is not None and time.time() >= until:
                return True  # (polled once more first: a batch that just ended is used)
            pause = delay if until is None else max(0.0, min(delay, until - time.time()))
            self.log.info(f"batchllm: {progress_line(rows)}; next poll in {pause:.0f} s")
            await asyncio.sleep(pause)
            delay = min(self.settings.batch_poll_max_s, delay * 1.5)


class _Merged:
    """The rows' outcomes over all passes and slices: each row's from the run that settled
    it last."""

    def __init__(self, n: int, collect_keys: bool):
        self.outputs: list[Any] = [None] * n
        self.errors: list[str | None] = [None] * n
        self.error_types: list[str | None] = [None] * n
        self.row_status = bytearray(n)
        self.keys: set[str] | None = set() if collect_keys else None
        self.stats = InferenceStats()  # the passes' figures added up (see finish)
        self._latency: tuple[float | None, float | None] = (None, None)
        self.online = InferenceStats()  # the figures of a deadline's online run
        self.answered_online = 0  # rows it answered

    def waiting_rows(self) -> list[int]:
        deferred = RowStatus.DEFERRED
        return [i for i, status in enumerate(self.row_status)
                if status == deferred and _WAITING in (self.errors[i] or "")]

    def add(self, run: InferenceRun, rows: Sequence[int], *, online: bool = False) -> None:
        """A run's outcomes, its row ``j`` being row ``rows[j]`` of the table (``online``:
        a deadline's online run, its tokens at the online price)."""
        if online:
            self.online.add(run.stats)
        if isinstance(rows, range) and rows.step == 1:  # a slice of the table: copied whole
            a, b = rows.start, rows.stop
            self.outputs[a:b] = run.outputs
            self.errors[a:b] = run.errors
            self.row_status[a:b] = run.row_status
            self.error_types[a:b] = run.error_types
        else:
            for j, i in enumerate(rows):
                self.outputs[i] = run.outputs[j]
                self.errors[i] = run.errors[j]
                self.row_status[i] = run.row_status[j]
                self.error_types[i] = run.error_types[j]
        if self.keys is not None and run.keys is not None:
            self.keys |= run.keys
        # Its requests, tokens and costs; the row counts are recounted at the end (a row
        # deferred by one pass is settled by a later one). A row is sent again only while
        # deferred, so each failure is counted by one run: errors_by_type adds up.
        self.stats.add(run.stats)
        if run.stats.latency_p50_s is not None:
            self._latency = (run.stats.latency_p50_s, run.stats.latency_p95_s)

    def add_endpoints(self, figures: dict[str, dict[str, Any]]) -> None:
        """A pass's figures per endpoint (its delivery's, which every run of it shares)."""
        for name, counters in figures.items():
            held = self.stats.endpoints.setdefault(name, {})
            for counter, value in counters.items():
                held[counter] = (held.get(counter, 0) + value
                                 if isinstance(value, int) else value)

    def finish(self, settings: Any, *, started: float) -> None:
        """The call's figures: the rows counted by how each ended, what was paid (the
        passes' costs added up per model), and the cost at the batch price of the tokens
        the batches answered plus the online price of those the online run did."""
        s = self.stats
        s.rows = len(self.row_status)
        finish_stats(s, self.row_status, (), started=started)
        s.latency_p50_s, s.latency_p95_s = self._latency
        paid_totals(s)
        s.mode = "batch_api"
        s.online_cost_usd = estimate_cost(settings, s.tokens_by_model)
        online = self.online.tokens_by_model
        by_batch = {model: {name: tokens.get(name, 0) - online.get(model, {}).get(name, 0)
                            for name in ("prompt_tokens", "completion_tokens")}
                    for model, tokens in s.tokens_by_model.items()}
        parts = [estimate_cost(settings, by_batch, batch=True)] + (
            [estimate_cost(settings, online)] if online else [])
        s.estimated_cost_usd = (round(sum(parts), 6) if None not in parts else None)


__all__ = ["MODES", "BatchModeCall", "check_delivery", "check_mode"]


# -- the deadline's switch (see :mod:`.deadline`): the partition's unfinished batches cancelled,
# the lines they answered collected, and the rows none answered sent online.
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
        DeadlineKeeper.measured, deadline, settings=settings, ledger=call.client.ledger,
        book=call.book, model=spec.model, max_tokens=max_tokens,
        tokens_per_request=tokens_per_request, wait=call.wait, scope=spec.scope,
        partition_key=spec.partition_key, log=call.log)


async def switch_to_online(call: BatchModeCall, rows: Sequence[int], merged: _Merged) -> None:
    """Answer ``rows`` (of the call's table) now: from the batches that end within the cancel
    wait, the rest online."""
    keeper = call.deadline
    assert keeper is not None
    scope, partition_key = call.call.scope, call.call.partition_key
    keeper.switched_at = keeper.clock()
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
