"""One inference run: rows in, bounded concurrent requests, outcomes out in input order.

The run keeps a fixed number of worker coroutines (about twice what the endpoints can take at
once), fed by a producer that renders the input chunk by chunk. So memory does not grow with the
number of rows beyond the output columns themselves, and a 1M-row table never has 1M coroutines.
A delivery that gathers items into requests (:mod:`.grouping`) says how many it takes at once
(``items_per_send``, with ``send_many``): then each worker, and each queue entry, carries that
many items, so a row costs no coroutine step or future of its own.

What the run does with each row is split by job: a *task* (:mod:`.tasks`) turns rows into
request items and replies into values, a *delivery* (:mod:`.delivery`) gets each item to a model
(endpoint pool, transport, retries), :mod:`.coordination` deals with the other runs, the
ledger writer (:mod:`.writer`) keeps outcomes. The run holds two collaborators of its own: its
budgets (:class:`~.budgets.RunBudgets`), which say whether a request may go now, and its row
outcomes (:class:`~.outcomes.RowOutcomes`), which settle each reply or error into its rows and
their ledger record. What is left here: the workers, deduplication, the ledger cache,
progress and the run's figures.

Every row ends in exactly one state (:class:`~.results.RowStatus`): ok (answered, possibly by an
identical row of the same call), cached (from the ledger), failed (with a typed reason) or
deferred (a token budget ran out before it was sent). The run checks this before it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..delivery.base import Attempts, Delivery
from ..delivery.pool import EndpointPool
from ..errors import DeferredError, InternalError, LedgerUnwritable, RowError
from ..ledger.table import OK, Ledger
from ..ledger.writer import LedgerWriter
from ..results import InferenceStats, RowStatus
from ..settings import InferenceSettings
from ..tasks.base import Task
from ..tasks.chat.rendering import row_tuples
from .budgets import RunBudgets
from .coordination import RunCoordination
from .figures import Progress, ReplyPrices, add_paid, estimate_cost, finish_stats
from .gc_pacing import fewer_collections
from .outcomes import ERROR_TYPE_VALUES, KeyState, RowOutcomes

_MAX_WORKERS = 8192
# A stopping run (cancelled, interrupted, terminated) writes its answers for at most this long;
# what is not written by then stays in the journal for the next run.
_STOP_FLUSH_S = 3.0
# What ends a run before its rows are done: a stop, or a ledger database given up on.
_CUT_SHORT = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, LedgerUnwritable)
# The hot path's: a member of an enum class costs a lookup through the enum's machinery.
_CACHED, _FAILED = RowStatus.CACHED, RowStatus.FAILED

log = logging.getLogger("dagster_batchllm")


class InferenceRun:
    def __init__(
        self,
        settings: InferenceSettings,
        inputs: Any,  # a pandas DataFrame holding exactly the columns the task reads
        *,
        task: Task,
        delivery: Delivery,
        pool: EndpointPool,
        ledger: Ledger,
        token_budget: int | None,
        partition_key: str | None,
        run_id: str | None,
        scope: str | None = None,
        logger: Any = None,
        collect_keys: bool = False,
        budget_usd: float | None = None,
    ):
        """``task``: how rows become requests and replies values; ``delivery``: how requests
        reach a model (arranged by the task's ``deliver``; see :mod:`..delivery.base`);
        ``token_budget``, ``budget_usd``: see :mod:`.budgets`."""
        self.settings = settings
        self.inputs = inputs
        self.pool = pool
        self.ledger = ledger
        self.partition_key = partition_key or ""
        self.scope = scope or ""
        self.run_id = run_id
        self.log = logger or log
        self.stats = InferenceStats(rows=len(inputs))
        self.task = task
        self.delivery = delivery
        # Replies are priced where they came from: a batch line (a delivery that keeps its
        # answers in the batch book) at the batch price.
        self.prices = ReplyPrices(settings, batch=delivery.keeps_answers)
        self.budgets = RunBudgets.of(settings, self.prices, tokens=token_budget, usd=budget_usd)
        self._writer = LedgerWriter(ledger, room=settings.ledger_flush_rows,
                                    interval_s=settings.ledger_flush_interval_s,
                                    on_written=_written_after_the_run, log=self.log,
                                    outage_s=settings.ledger_outage_s)
        self.outcomes = RowOutcomes(len(inputs), task=task, writer=self._writer,
                                    prices=self.prices, stats=self.stats, scope=self.scope,
                                    partition_key=self.partition_key, run_id=run_id,
                                    log=self.log)
        self._writer.on_written = self.outcomes.written  # a write ends its keys' flight
        self._coordination: RunCoordination[KeyState] | None = None
        self._per_send = 1  # items a worker hands the delivery at once (set by run)
        self._busy_workers = 0  # workers with a parcel in hand
        self._started = 0.0
        # Every request key the input asks for, when the caller retires the others afterwards.
        self.keys: set[str] | None = set() if collect_keys else None

    # The rows' outcomes, in input order, as the result reads them once the run has ended.
    @property
    def outputs(self) -> list[Any]:
        return self.outcomes.outputs

    @property
    def errors(self) -> list[str | None]:
        return self.outcomes.errors

    @property
    def error_types(self) -> list[str | None]:
        """The ErrorType value of each row's error."""
        return self.outcomes.error_types

    @property
    def row_status(self) -> bytearray:
        """A RowStatus per row."""
        return self.outcomes.row_status

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> InferenceStats:
        with fewer_collections():  # the run's own objects are not garbage (see gc_pacing)
            return await self._run()

    async def _run(self) -> InferenceStats:
        self._started = time.perf_counter()
        # The journals of runs that died are folded first (and, by the writer, those of runs
        # that die while this one goes). A delivery whose answers are kept durably already
        # (the batch book) needs no journal of its own.
        await asyncio.to_thread(self._writer.open_journals,
                                keep_own=not self.delivery.keeps_answers)
        # A delivery that gathers items into requests takes them a request's worth at a time
        # (``items_per_send``, one by default): a worker, and a queue entry, per such parcel.
        per_send = self._per_send = max(1, self.delivery.items_per_send)
        workers_n = max(1, min(_MAX_WORKERS, -(-2 * self.delivery.capacity() // per_send)))
        queue: asyncio.Queue[list[KeyState] | None] = asyncio.Queue(maxsize=workers_n)
        try:
            coordination = self._coordination = await RunCoordination.join(
                self.settings, self.ledger, self.pool, log=self.log,
                description=f"run {self.run_id or '-'} partition {self.partition_key or '-'}")
            if coordination is not None:  # claims end in the write of their answers
                self.outcomes.records_end_claims = True
                self._writer.in_write = coordination.release_in
                coordination.before_takeover = self._writer.fold_abandoned
                coordination.writer_gave_up = self._writer.gave_up
        except BaseException:
            self._writer.close_journals(remove=True)  # nothing was sent
            raise
        written = False
        ended_by: BaseException | None = None
        try:
            await self.delivery.open(self._writer)
            background = [asyncio.create_task(self._writer.run()),
                          asyncio.create_task(self._progress_loop())]
            if coordination is not None:
                background.append(asyncio.create_task(coordination.heartbeat_loop()))
            workers = [asyncio.create_task(self._worker(queue)) for _ in range(workers_n)]
            try:
                await self._produce(queue, workers_n)
                await asyncio.gather(*workers)
            except _CUT_SHORT as exc:
                ended_by = exc
                if isinstance(exc, LedgerUnwritable):
                    raise
                in_flight = self.delivery.requests_in_flight
                cancelled = (f"{in_flight} requests in flight are cancelled (a rerun sends "
                             "them)" if in_flight is not None else
                             "the requests not yet answered are left to a rerun")
                self.log.warning(
                    f"batchllm: stopping ({type(exc).__name__}): nothing more is sent, "
                    f"{cancelled}, the answers are being written")
                raise
            finally:
                await self._stop_tasks(workers, background)
                # On a stop, or with the database given up on already, the last write gets a
                # few seconds; what it cannot write in them stays in the journal, which the
                # next run folds into the ledger. Its failure then does not hide why the run
                # ended: that error goes on, the failed write noted on it.
                try:
                    await asyncio.shield(asyncio.to_thread(
                        self._writer.flush_remaining,
                        within_s=_STOP_FLUSH_S if ended_by is not None else None))
                except Exception as exc:
                    if ended_by is None:
                        raise
                    ended_by.add_note(f"batchllm: the last ledger write failed too: "
                                      f"{type(exc).__name__}: {str(exc)[:300]}")
                else:
                    written = True
        finally:
            # Also when the last write fails: close connections, leave the other runs.
            self._writer.close_journals(remove=written)
            try:
                await self.delivery.close()
            finally:
                # The writer's callback is the run's: a cycle that kept an ended run, its
                # per-key state and row arrays, until a collection, which a batch call holds
                # off (a pass's runs, one per slice, stayed to the call's end). No write after
                # this one needs it.
                self._writer.on_written = _written_after_the_run
                if coordination is not None:
                    await coordination.leave()
        self._finish_stats()
        return self.stats

    async def _stop_tasks(self, workers: list[asyncio.Task],
                          background: list[asyncio.Task]) -> None:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        # The flush loop is stopped, not cancelled: a write in progress must end before the
        # last flush, or infer() could return before its records are in the ledger.
        self._writer.stop()
        for task in background[1:]:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    async def _produce(self, queue: asyncio.Queue, workers_n: int) -> None:
        chunk_rows = min(self.settings.chunk_rows,
                         self.task.max_chunk_rows or self.settings.chunk_rows)
        coordination = self._coordination
        claim_slice = (coordination.claim_slice(self.delivery.capacity())
                       if coordination is not None else 0)
        keys, refusal = self.keys, self.delivery.refusal
        outcomes = self.outcomes
        inflight, settled_not_ok = outcomes.inflight, outcomes.settled_not_ok
        finish_rows = outcomes.finish_rows
        for start in range(0, len(self.inputs), chunk_rows):
            rows = row_tuples(self.inputs.iloc[start:start + chunk_rows])
            fresh: dict[str, KeyState] = {}
            for offset, item in enumerate(self.task.requests(rows)):
                row = start + offset
                if isinstance(item, RowError):
                    finish_rows([row], _FAILED, error=item.as_cell(),
                                error_type=item.error_type.value)
                    continue
                key = item.key
                if keys is not None:
                    keys.add(key)
                problem = refusal(item)
                if problem is not None:
                    finish_rows([row], _FAILED, error=problem.as_cell(),
                                error_type=problem.error_type.value)
                    continue
                state = inflight.get(key) or fresh.get(key)
                if state is not None:
                    self.stats.deduplicated += 1
                    if state.outcome is None:
                        state.rows.append(row)
                    else:  # answered already, its record not written yet
                        row_status, value, error, error_type = state.outcome
                        finish_rows([row], row_status, value=value, error=error,
                                    error_type=error_type)
                    continue
                settled = settled_not_ok.get(key)
                if settled is not None:
                    self.stats.deduplicated += 1
                    finish_rows([row], settled[0], error=settled[1], error_type=settled[2])
                    continue
                fresh[key] = KeyState(item, row)
            if fresh:
                await self._answer_from_ledger(fresh)
            if coordination is None:
                await self._enqueue(queue, fresh)
                continue
            # Claimed a slice at a time, as the queue takes them: runs over the same rows
            # claim different slices and all send (see coordination.claim_slice).
            pending = list(fresh.items())
            for at in range(0, len(pending), claim_slice):
                part = dict(pending[at:at + claim_slice])
                for key in await coordination.claim(list(part)):
                    inflight[key] = state = part.pop(key)
                    coordination.park(key, state)
                # Answered and released by another run between the lookup and the claim?
                await self._answer_from_ledger(part)
                await self._enqueue(queue, part)
        if coordination is not None:
            await coordination.send_parked(
                self._answer_from_ledger, lambda state: queue.put([state]),
                idle=lambda: queue.empty() and self._busy_workers == 0)
        for _ in range(workers_n):
            await queue.put(None)

    async def _enqueue(self, queue: asyncio.Queue, states: dict[str, KeyState]) -> None:
        """Hand ``states`` to the workers, ``per_send`` at a time (waits while the queue is
        full: what is not queued yet is not sent yet)."""
        per_send, inflight = self._per_send, self.outcomes.inflight
        parcel: list[KeyState] = []
        for key, state in states.items():
            inflight[key] = state
            parcel.append(state)
            if len(parcel) >= per_send:
                await queue.put(parcel)
                parcel = []
        if parcel:
            await queue.put(parcel)

    async def _answer_from_ledger(self, states: dict[str, KeyState]) -> None:
        """Answer the requests the ledger holds ok answers for, and remove them from
        ``states``."""
        keys = list(states)
        held = self.delivery.held_answers
        if held:
            # Paid for and in hand: the delivery answers them with that answer (what the
            # ledger may hold for them is another partition's answer to the same request).
            keys = [key for key in keys if key not in held]
            if not keys:
                return
        hits = await asyncio.to_thread(self.ledger.lookup_ok, keys, self.partition_key,
                                       self.scope)
        outcomes = self.outcomes
        for key, hit in hits.items():
            state = states[key]
            try:
                value = self.task.value(hit["response"])
            except RowError:
                # The schema is part of the key, so an ok record parsed once; if it no longer
                # does (a hand-edited ledger), send the request again rather than guess.
                continue
            del states[key]
            outcomes.finish_rows(state.rows, _CACHED, value=value)
            if hit["partition_key"] != self.partition_key or hit["scope"] != self.scope:
                # Record the answer under this partition too, so its bookkeeping is complete.
                outcomes.record(state.request, OK, response=hit["response"], attempts=0,
                                endpoint="ledger")

    async def _worker(self, queue: asyncio.Queue) -> None:
        while (parcel := await queue.get()) is not None:
            self._busy_workers += 1
            try:
                if len(parcel) == 1:
                    await self._process(parcel[0])
                else:
                    await self._process_many(parcel)
            except asyncio.CancelledError:
                raise
            except LedgerUnwritable as exc:  # reported once, by the flush loop and the last write
                self.outcomes.settle_unsettled(parcel, InternalError(str(exc)))
            except Exception as exc:  # a bug must not take the other rows down with it
                self.log.exception("batchllm: internal error while processing a request")
                self.outcomes.settle_unsettled(parcel,
                                               InternalError(f"{type(exc).__name__}: {exc}"))
            finally:
                self._busy_workers -= 1

    async def _process(self, state: KeyState) -> None:
        await self._writer.wait_for_room()
        request = state.request
        budgets = self.budgets
        if budgets is not None:
            while (refused := budgets.try_reserve(request)) is not None:
                if refused.idle:  # nothing in flight to free any: it never fits in this call
                    self.outcomes.settle_error(state, budgets.over_budget(refused, request))
                    return
                await refused.wait_for_settlement()
        attempts = Attempts()
        completion = None
        try:
            completion = await self.delivery.send(request, attempts)
        except RowError as exc:
            self.outcomes.settle_error(state, exc, attempts.count, attempts.endpoint)
            return
        finally:
            self.stats.requests += attempts.sent
            self.stats.retries += max(0, attempts.count - 1)
            if budgets is not None:
                budgets.settle(request, attempts, completion)
        self.outcomes.conclude(state, completion, attempts)

    async def _process_many(self, states: list[KeyState]) -> None:
        """``_process`` for a parcel: one ``send_many`` for the items the budget lets go now
        (in order; the rest wait for settlements as a single item does)."""
        budgets, stats, outcomes = self.budgets, self.stats, self.outcomes
        pending = states
        while pending:
            await self._writer.wait_for_room()
            batch = pending
            if budgets is not None:
                fits, refused = 0, None
                for state in pending:
                    refused = budgets.try_reserve(state.request)
                    if refused is not None:
                        break
                    fits += 1
                batch, pending = pending[:fits], pending[fits:]
                if not batch:
                    if refused.idle:
                        state = pending.pop(0)
                        outcomes.settle_error(state, budgets.over_budget(refused, state.request))
                    else:
                        await refused.wait_for_settlement()
                    continue
            else:
                pending = []
            attempts = [Attempts() for _ in batch]
            results = None
            try:
                results = await self.delivery.send_many([s.request for s in batch], attempts)
            finally:
                sent = retried = 0
                for tried in attempts:
                    sent += tried.sent
                    if tried.count > 1:
                        retried += tried.count - 1
                stats.requests += sent
                stats.retries += retried
                if budgets is not None:
                    for j, (state, tried) in enumerate(zip(batch, attempts, strict=True)):
                        reply = results[j] if results is not None else None
                        budgets.settle(state.request, tried,
                                       None if isinstance(reply, RowError) else reply)
            answered: list[tuple[KeyState, Any, Attempts]] = []
            kept: list[KeyState] = []  # deferred with the parcel's first kept deferral
            kept_error: DeferredError | None = None
            settle_error = outcomes.settle_error
            for state, result, tried in zip(batch, results, attempts, strict=True):
                if not isinstance(result, RowError):
                    answered.append((state, result, tried))
                elif result is kept_error:  # a batch file's rows share their deferral
                    kept.append(state)
                elif kept_error is None and outcomes.kept(result):
                    kept_error = result
                    kept.append(state)
                else:
                    settle_error(state, result, tried.count, tried.endpoint)
            if kept:
                outcomes.defer_kept(kept, kept_error.as_cell(),
                                    ERROR_TYPE_VALUES[kept_error.error_type])
            if answered:
                outcomes.conclude_many(answered)

    # -- progress and figures ----------------------------------------------------------------
    async def _progress_loop(self) -> None:
        interval = self.settings.progress_interval_s
        progress = Progress(total=len(self.inputs), started=self._started, interval_s=interval)
        while True:
            await asyncio.sleep(interval)
            self.log.info(progress.line(self.outcomes.done_rows, self.stats))

    def _finish_stats(self) -> None:
        finish_stats(self.stats, self.outcomes.row_status, self.outcomes.latencies,
                     started=self._started)
        self.stats.endpoints = self.delivery.snapshot()
        add_paid(self.stats, self.prices.paid)
        self.stats.estimated_cost_usd = estimate_cost(self.settings, self.stats.tokens_by_model)


def _written_after_the_run(_keys: list[str]) -> None:
    """A write that ends after its run (a stop's last flush, shielded): nothing to mark."""
