"""One inference run: rows in, bounded concurrent requests, outcomes out in input order.

The run keeps a fixed number of worker coroutines (about twice what the endpoints can take at
once), fed by a producer that renders the input chunk by chunk. So memory does not grow with the
number of rows beyond the output columns themselves, and a 1M-row table never has 1M coroutines.

Every row ends in exactly one state: ok (answered, possibly from the ledger or by an identical
row of the same call), failed (with a typed reason) or deferred (a token budget ran out before it
was sent). The run checks this before it returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from array import array
from typing import Any

from .call import InferenceCall
from .coordination import RunCoordinator
from .errors import (
    ContextLengthExceededError,
    EndpointError,
    RowError,
    StructuredOutputError,
    UnsupportedModelError,
)
from .ledger import DEFERRED, FAILED, OK, Ledger
from .ledger_writer import LedgerUnwritable, LedgerWriter
from .limits import TokenBudget
from .pool import EndpointPool
from .prompts import RowRequest, iter_row_requests, row_tuples
from .results import InferenceStats
from .retries import WaitRetryAfterOrBackoff, is_retryable, retrying
from .settings import InferenceSettings
from .transport import Completion, Transport, make_transport

PENDING, ROW_OK, ROW_CACHED, ROW_FAILED, ROW_DEFERRED = 0, 1, 2, 3, 4
_MAX_WORKERS = 8192

log = logging.getLogger("dagster_batchllm")


class _Tries:
    """What one request's attempts did: how many, the last endpoint, tokens billed."""

    __slots__ = ("count", "endpoint", "spent")

    def __init__(self) -> None:
        self.count = 0
        self.endpoint: str | None = None
        self.spent = 0


class KeyState:
    """One distinct request of the run and the rows that share its answer."""

    __slots__ = ("request", "rows", "outcome")

    def __init__(self, request: RowRequest, row: int):
        self.request = request
        self.rows = [row]
        # (row status, value, error, error type) once settled; rows of the same key that the
        # producer meets after that take it at once (they can no longer join ``rows``).
        self.outcome: tuple[int, Any, str | None, str | None] | None = None


class InferenceRun:
    def __init__(
        self,
        settings: InferenceSettings,
        spec: InferenceCall,
        inputs: Any,  # a pandas DataFrame holding exactly spec.input_columns()
        *,
        pool: EndpointPool,
        ledger: Ledger,
        token_budget: int | None,
        partition_key: str | None,
        run_id: str | None,
        scope: str | None = None,
        logger: Any = None,
        transport: Transport | None = None,
        collect_keys: bool = False,
    ):
        self.settings = settings
        self.spec = spec
        self.inputs = inputs
        self.pool = pool
        self.ledger = ledger
        self.budget = TokenBudget(token_budget) if token_budget is not None else None
        self.partition_key = partition_key or ""
        self.scope = scope or ""
        self.run_id = run_id
        self.log = logger or log
        self.transport = transport or make_transport(
            settings.http_client, timeout_s=settings.request_timeout_s
        )
        n = len(inputs)
        self.outputs: list[Any] = [None] * n
        self.errors: list[str | None] = [None] * n
        self.row_status = bytearray(n)
        self.stats = InferenceStats(rows=n)
        self._latencies = array("d")
        self._inflight: dict[str, KeyState] = {}
        self._settled_not_ok: dict[str, tuple[int, str | None, str | None]] = {}
        self._writer = LedgerWriter(ledger, room=settings.ledger_flush_rows,
                                    interval_s=settings.ledger_flush_interval_s,
                                    on_written=self._written_to_ledger, log=self.log)
        self._coordinator: RunCoordinator | None = None
        self._parked: dict[str, KeyState] = {}  # claimed by another run: wait for its answer
        self._done_rows = 0
        self._started = 0.0
        self._context_limits = self._context_limits_by_model()
        self._validator: Any = None
        # Every request key the input asks for, when the caller retires the others afterwards.
        self.keys: set[str] | None = set() if collect_keys else None
        self._backoff = WaitRetryAfterOrBackoff(
            initial_s=settings.retry_initial_backoff_s, max_s=settings.retry_max_backoff_s,
            max_retry_after_s=settings.max_retry_after_s)

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> InferenceStats:
        self._started = time.perf_counter()
        workers_n = max(1, min(_MAX_WORKERS, 2 * self.pool.capacity()))
        queue: asyncio.Queue[KeyState | None] = asyncio.Queue(maxsize=workers_n)
        coordinator = self._coordinator = await self._join_other_runs()
        await self.transport.open(self.settings.endpoints)
        background = [asyncio.create_task(self._writer.run()),
                      asyncio.create_task(self._progress_loop())]
        if coordinator is not None:
            background.append(asyncio.create_task(self._heartbeat_loop(coordinator)))
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(workers_n)]
        try:
            await self._produce(queue, workers_n)
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            # The flush loop is stopped, not cancelled: a write in progress must end before the
            # last flush, or infer() could return before its records are in the ledger.
            self._writer.stop()
            for task in background[1:]:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            try:
                await asyncio.shield(asyncio.to_thread(self._writer.flush_remaining))
            finally:  # also when the last write fails: close connections, leave the others
                await self.transport.close()
                if coordinator is not None:
                    await asyncio.to_thread(coordinator.leave, self.pool.window_usage())
                    self.pool.set_shares({})
        self._finish_stats()
        return self.stats

    async def _join_other_runs(self) -> RunCoordinator | None:
        if not self.settings.coordinate_runs or self.ledger.in_memory:
            return None
        limited = [e for e in self.settings.endpoints
                   if e.requests_per_minute or e.tokens_per_minute]
        coordinator = await asyncio.to_thread(
            RunCoordinator, self.ledger.engine, self.ledger.table,
            [e.name for e in self.settings.endpoints],
            stale_after_s=max(10.0, 20 * self.settings.coordination_interval_s),
            description=f"run {self.run_id or '-'} partition {self.partition_key or '-'}",
            rate_limits={e.name: tuple(
                per_minute * e.rate_limit_window_s / 60.0 if per_minute else None
                for per_minute in (e.requests_per_minute, e.tokens_per_minute)) for e in limited},
            window_s=max((e.rate_limit_window_s for e in limited), default=0.0),
            group=self.pool.group,
            max_concurrency={e.name: e.max_concurrency for e in self.settings.endpoints},
        )
        runs = await self._heartbeat(coordinator)
        if any(n > 1 for n in runs.values()):
            # Let the runs already sending see us and shrink before we start, then count again:
            # runs that joined while we waited shrink our share too (else it is stale until our
            # first heartbeat, and the runs together exceed the endpoint's limits).
            await asyncio.sleep(self.settings.coordination_interval_s * 1.5)
            await self._heartbeat(coordinator)
        return coordinator

    async def _heartbeat(self, coordinator: RunCoordinator) -> dict[str, int]:
        runs = await asyncio.to_thread(coordinator.heartbeat, self.pool.window_usage(),
                                       self.pool.in_flight())
        self.pool.set_shares(runs)
        self.pool.set_rate_limits(coordinator.limits)
        self.pool.set_capacities(coordinator.capacities)
        return runs

    async def _heartbeat_loop(self, coordinator: RunCoordinator) -> None:
        while True:
            await asyncio.sleep(self.settings.coordination_interval_s)
            try:
                await self._heartbeat(coordinator)
            except Exception as exc:  # a busy database delays a heartbeat; shares stay as they are
                self.log.warning(f"batchllm: run coordination heartbeat failed: {exc}")

    async def _produce(self, queue: asyncio.Queue, workers_n: int) -> None:
        chunk_rows = self.settings.chunk_rows
        for start in range(0, len(self.inputs), chunk_rows):
            chunk = self.inputs.iloc[start:start + chunk_rows]
            rows = row_tuples(chunk)
            fresh: dict[str, KeyState] = {}
            items = iter_row_requests(rows, self.spec,
                                      default_max_tokens=self.settings.default_max_tokens)
            for offset, item in enumerate(items):
                row = start + offset
                if isinstance(item, RowError):
                    self._finish_rows([row], ROW_FAILED, error=item.as_cell(),
                                      error_type=item.error_type.value)
                    continue
                if self.keys is not None:
                    self.keys.add(item.key)
                problem = self._precheck(item)
                if problem is not None:
                    self._finish_rows([row], ROW_FAILED, error=problem.as_cell(),
                                      error_type=problem.error_type.value)
                    continue
                state = self._inflight.get(item.key) or fresh.get(item.key)
                if state is not None:
                    self.stats.deduplicated += 1
                    if state.outcome is None:
                        state.rows.append(row)
                    else:  # answered already, its record not written yet
                        row_status, value, error, error_type = state.outcome
                        self._finish_rows([row], row_status, value=value, error=error,
                                          error_type=error_type)
                    continue
                settled = self._settled_not_ok.get(item.key)
                if settled is not None:
                    self.stats.deduplicated += 1
                    self._finish_rows([row], settled[0], error=settled[1], error_type=settled[2])
                    continue
                fresh[item.key] = KeyState(item, row)
            if fresh:
                hits = await asyncio.to_thread(self.ledger.lookup_ok, list(fresh),
                                               self.partition_key, self.scope)
                for key, hit in hits.items():
                    if self._answer_from_ledger(fresh[key], hit):
                        del fresh[key]
            if fresh and self._coordinator is not None:
                for key in await self._claim(list(fresh)):
                    self._inflight[key] = self._parked[key] = fresh.pop(key)
                # Answered and released by another run between the lookup and the claim?
                hits = await asyncio.to_thread(self.ledger.lookup_ok, list(fresh),
                                               self.partition_key, self.scope)
                for key, hit in hits.items():
                    if self._answer_from_ledger(fresh[key], hit):
                        del fresh[key]
            for key, state in fresh.items():
                self._inflight[key] = state
                await queue.put(state)
        await self._drain_parked(queue)
        for _ in range(workers_n):
            await queue.put(None)

    async def _claim(self, keys: list[str]) -> set[str]:
        """Claim requests for this run; return those another live run is sending."""
        try:
            return await asyncio.to_thread(self._coordinator.claim, keys)
        except Exception as exc:  # without claims the worst outcome is paying twice
            self.log.warning(f"batchllm: claiming requests failed, sending them anyway: "
                             f"{type(exc).__name__}: {exc}")
            return set()

    async def _drain_parked(self, queue: asyncio.Queue) -> None:
        """Wait for the requests other runs were sending: answer them from the ledger once
        written, or send them after all when their run failed, deferred or dropped them."""
        while self._parked:
            await asyncio.sleep(self.settings.coordination_interval_s)
            held = await self._claim(list(self._parked))  # claim first: an answer is written
            hits = await asyncio.to_thread(  # before its claim ends, so this lookup sees it
                self.ledger.lookup_ok, list(self._parked), self.partition_key, self.scope)
            for key, hit in hits.items():
                if self._answer_from_ledger(self._parked[key], hit):
                    del self._parked[key]
            for key in [k for k in self._parked if k not in held]:
                await queue.put(self._parked.pop(key))

    def _precheck(self, request: RowRequest) -> RowError | None:
        if not self.pool.serves(request.model):
            return UnsupportedModelError(f"no configured endpoint serves model '{request.model}'")
        limit = self._context_limits.get(request.model)
        if limit is not None and request.typical_prompt_tokens + request.max_tokens > limit:
            return ContextLengthExceededError(
                f"the prompt (~{request.typical_prompt_tokens} tokens) plus max_tokens "
                f"({request.max_tokens}) exceeds the {limit}-token context of '{request.model}'"
            )
        return None

    def _context_limits_by_model(self) -> dict[str, int]:
        limits: dict[str, int] = {}
        for model in self.settings.models:
            windows = [e.max_context_tokens for e in self.settings.endpoints if model in e.models]
            if windows and all(w is not None for w in windows):
                limits[model] = max(windows)
        return limits

    async def _worker(self, queue: asyncio.Queue) -> None:
        while (state := await queue.get()) is not None:
            try:
                await self._process(state)
            except asyncio.CancelledError:
                raise
            except LedgerUnwritable as exc:  # reported once, by the flush loop and the last write
                self._settle(state, FAILED, error=f"internal_error: {exc}",
                             error_type="internal_error")
            except Exception as exc:  # a bug must not take the other rows down with it
                self.log.exception("batchllm: internal error while processing a request")
                self._settle(state, FAILED, error=f"internal_error: {type(exc).__name__}: {exc}",
                             error_type="internal_error")

    async def _process(self, state: KeyState) -> None:
        await self._writer.wait_for_room()
        request = state.request
        reserve = request.reserve_tokens
        if self.budget is not None:
            while not self.budget.try_reserve(reserve):
                if self.budget.reserved == 0:
                    self._settle(state, DEFERRED, error=(
                        f"deferred: the token budget ({self.budget.total}) has "
                        f"{self.budget.remaining} tokens left, this request may need {reserve}; "
                        "a later call will send it"), error_type="deferred")
                    return
                await self.budget.wait_for_settlement()
        tries = _Tries()
        try:
            try:
                # The first try runs without the retry machinery: most requests need no more.
                completion = await self._try_once(request, reserve, tries)
            except RowError as first:
                if not is_retryable(first) or self.settings.max_attempts <= 1:
                    raise
                await asyncio.sleep(self._backoff.delay(first, 1))
                async for attempt in retrying(
                    max_attempts=self.settings.max_attempts,
                    initial_backoff_s=self.settings.retry_initial_backoff_s,
                    max_backoff_s=self.settings.retry_max_backoff_s,
                    max_retry_after_s=self.settings.max_retry_after_s,
                    attempts_before=1,
                ):
                    with attempt:
                        completion = await self._try_once(request, reserve, tries)
        except RowError as exc:
            self._settle(state, FAILED, error=exc.as_cell(), error_type=exc.error_type.value,
                         attempts=tries.count, endpoint=tries.endpoint)
            return
        finally:
            self.stats.retries += max(0, tries.count - 1)
            if self.budget is not None:
                self.budget.settle(reserve, tries.spent)
        attempts, endpoint_name = tries.count, tries.endpoint
        self._latencies.append(completion.latency_s)
        self._add_tokens(request.model, completion.prompt_tokens, completion.completion_tokens)
        try:
            value = self._parse_output(completion.content)
        except StructuredOutputError as exc:
            if completion.finish_reason == "length":
                exc = StructuredOutputError(
                    f"{exc.message} (the reply was cut off at max_tokens={request.max_tokens}; "
                    "raise max_tokens)")
            self._settle(state, FAILED, error=exc.as_cell(), error_type=exc.error_type.value,
                         response=completion.content, attempts=attempts, endpoint=endpoint_name,
                         completion=completion)
            return
        self._settle(state, OK, value=value, response=completion.content, attempts=attempts,
                     endpoint=endpoint_name, completion=completion)

    async def _try_once(self, request: RowRequest, reserve: int, tries: _Tries) -> Completion:
        """One attempt: a lease on an endpoint, the HTTP call, the lease back."""
        tries.count += 1
        lease = await self.pool.acquire(request.model, reserve)
        if self._writer.full:
            # Checked again with the slot in hand: while this worker waited for it, the
            # requests that freed slots added answers to write.
            try:
                await self._writer.wait_for_room()
            except BaseException:
                self.pool.give_back_unused(lease)
                raise
        tries.endpoint = lease.endpoint.spec.name
        self.stats.requests += 1
        try:
            completion = await self.transport.send(lease.endpoint.spec, request)
        except EndpointError as exc:
            self.pool.release(lease, success=False, unhealthy=exc.counts_against_endpoint,
                              actual_tokens=None)
            raise
        except BaseException:
            self.pool.release(lease, success=False, unhealthy=True, actual_tokens=None)
            raise
        used = (completion.prompt_tokens + completion.completion_tokens
                if completion.usage_reported else reserve)
        tries.spent += used
        self.pool.release(lease, success=True, unhealthy=False, actual_tokens=used)
        return completion

    def _parse_output(self, content: str) -> Any:
        if not self.spec.structured:
            return content
        try:
            value = json.loads(content)
        except ValueError:
            raise StructuredOutputError(
                f"the reply is not valid JSON: {content[:120]!r}"
            ) from None
        if self.spec.schema is not None:
            import jsonschema

            if self._validator is None:  # built once per run: building one costs more than a check
                self._validator = jsonschema.Draft202012Validator(self.spec.schema)
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "(root)"
                raise StructuredOutputError(
                    f"the reply does not match the schema at {where}: {error.message[:200]}"
                )
        return value

    # -- outcomes ----------------------------------------------------------------------------
    def _answer_from_ledger(self, state: KeyState, hit: dict[str, Any]) -> bool:
        try:
            value = self._parse_output(hit["response"])
        except StructuredOutputError:
            # The schema is part of the key, so an ok record parsed once; if it no longer does
            # (a hand-edited ledger), send the request again rather than guess.
            return False
        self._finish_rows(state.rows, ROW_CACHED, value=value)
        if hit["partition_key"] != self.partition_key or hit["scope"] != self.scope:
            # Record the answer under this partition too, so its bookkeeping is complete.
            self._record(state.request, OK, response=hit["response"], attempts=0,
                         endpoint="ledger")
        return True

    def _settle(self, state: KeyState, status: str, *, value: Any = None, error: str | None = None,
                error_type: str | None = None, response: str | None = None, attempts: int = 0,
                endpoint: str | None = None, completion: Any = None) -> None:
        row_status = {OK: ROW_OK, FAILED: ROW_FAILED, DEFERRED: ROW_DEFERRED}[status]
        state.outcome = (row_status, value, error, error_type)
        self._finish_rows(state.rows, row_status, value=value, error=error,
                          error_type=error_type)
        if status != OK:
            self._settled_not_ok[state.request.key] = (row_status, error, error_type)
        self._record(state.request, status, response=response, error=error,
                     error_type=error_type, attempts=attempts, endpoint=endpoint,
                     completion=completion)

    def _finish_rows(self, rows: list[int], row_status: int, *, value: Any = None,
                     error: str | None = None, error_type: str | None = None) -> None:
        for row in rows:
            self.row_status[row] = row_status
            self.outputs[row] = value
            self.errors[row] = error
        self._done_rows += len(rows)
        if row_status == ROW_FAILED:
            by_type = self.stats.errors_by_type
            by_type[error_type or "unknown"] = by_type.get(error_type or "unknown", 0) + len(rows)

    def _record(self, request: RowRequest, status: str, *, response: str | None = None,
                error: str | None = None, error_type: str | None = None, attempts: int = 0,
                endpoint: str | None = None, completion: Any = None) -> None:
        self._writer.add({
            "request_key": request.key,
            "scope": self.scope,
            "partition_key": self.partition_key,
            "model": request.model,
            "status": status,
            "response": response,
            "error": error,
            "error_type": error_type,
            "prompt_tokens": completion.prompt_tokens if completion else 0,
            "completion_tokens": completion.completion_tokens if completion else 0,
            "attempts": attempts,
            "endpoint": endpoint,
            "latency_ms": round(completion.latency_s * 1000, 3) if completion else None,
            "run_id": self.run_id,
        }, request.key)

    def _add_tokens(self, model: str, prompt: int, completion: int) -> None:
        self.stats.prompt_tokens += prompt
        self.stats.completion_tokens += completion
        per_model = self.stats.tokens_by_model.setdefault(
            model, {"prompt_tokens": 0, "completion_tokens": 0})
        per_model["prompt_tokens"] += prompt
        per_model["completion_tokens"] += completion

    # -- ledger writes -----------------------------------------------------------------------
    def _written_to_ledger(self, keys: list[str]) -> None:
        """Runs on the writer's thread after each write."""
        if self._coordinator is not None:  # outcomes written: other runs may use them now
            try:
                self._coordinator.release(keys)
            except Exception as exc:  # the claims end when this run leaves
                self.log.warning(f"batchllm: releasing claims failed: {exc}")
        for key in keys:
            self._inflight.pop(key, None)

    # -- progress and figures ----------------------------------------------------------------
    async def _progress_loop(self) -> None:
        interval = self.settings.progress_interval_s
        total = len(self.inputs)
        while True:
            await asyncio.sleep(interval)
            elapsed = time.perf_counter() - self._started
            done = self._done_rows
            rate = done / elapsed if elapsed > 0 else 0.0
            tokens = self.stats.prompt_tokens + self.stats.completion_tokens
            eta = (total - done) / rate if rate > 0 else float("inf")
            failed = sum(self.stats.errors_by_type.values())
            self.log.info(
                f"batchllm: {done}/{total} rows ({100 * done / max(total, 1):.0f}%), "
                f"{rate:.0f} rows/s, {tokens / max(elapsed, 1e-9):.0f} tokens/s, "
                f"{failed} failed rows, ETA {eta:.0f} s"
            )

    def _finish_stats(self) -> None:
        stats = self.stats
        stats.elapsed_s = time.perf_counter() - self._started
        counts = [0] * 5
        for status in self.row_status:
            counts[status] += 1
        if counts[PENDING]:
            raise RuntimeError(
                f"internal error: {counts[PENDING]} rows ended without an outcome; "
                "nothing was written for them, a rerun will send them"
            )
        stats.cached = counts[ROW_CACHED]
        stats.succeeded = counts[ROW_OK] + counts[ROW_CACHED]
        stats.failed = counts[ROW_FAILED]
        stats.deferred = counts[ROW_DEFERRED]
        if self._latencies:
            ordered = sorted(self._latencies)
            stats.latency_p50_s = round(ordered[len(ordered) // 2], 4)
            stats.latency_p95_s = round(ordered[min(len(ordered) - 1,
                                                    int(len(ordered) * 0.95))], 4)
        stats.endpoints = self.pool.snapshot()
        stats.estimated_cost_usd = estimate_cost(self.settings, stats.tokens_by_model)


def estimate_cost(settings: InferenceSettings,
                  tokens_by_model: dict[str, dict[str, int]]) -> float | None:
    total = None
    for model, tokens in tokens_by_model.items():
        price = settings.price_for(model)
        if price is None:
            continue
        total = (total or 0.0) + (tokens["prompt_tokens"] * price[0]
                                  + tokens["completion_tokens"] * price[1]) / 1e6
    return round(total, 6) if total is not None else None
