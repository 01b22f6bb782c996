"""``infer(..., mode="batch_api")``: a call answered through a provider's offline batch API.

The call runs as passes of the ordinary engine over a :class:`~.batch_delivery.BatchDelivery`:

1. Before each pass the collector polls the book's unfinished batches and collects those that
   ended (see :mod:`.batch_collect`).
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
from array import array
from typing import Any

from .batch_book import BatchBook
from .batch_collect import BatchCollector, progress_line
from .batch_delivery import BatchDelivery, batch_name
from .batch_protocol import protocol_for
from .call import InferenceCall
from .engine import InferenceRun
from .errors import InferenceConfigError
from .ledger import DEFERRED
from .limits import TokenBudget
from .results import InferenceStats, RowStatus
from .run_figures import estimate_cost
from .tasks import ChatTask

MODES = ("online", "batch_api")
# Ledger writes of a batch pass come thousands a second (no network in between): written in
# larger batches than online's, which bound what a crash loses of answers arriving one by one.
_PASS_FLUSH_ROWS = 8192
_WAITING = "waiting for batch"


def check_mode(mode: str, wait: bool) -> None:
    if mode not in MODES:
        raise InferenceConfigError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    if not isinstance(wait, bool):
        raise InferenceConfigError(f"wait must be True or False, got {wait!r}.")


class BatchModeCall:
    """One call in batch mode; :meth:`run` returns an object with the engine run's row arrays
    (``outputs``, ``errors``, ``error_types``, ``row_status``, ``keys``) and ``stats``."""

    def __init__(self, client: Any, call: InferenceCall, inputs: Any, *, wait: bool,
                 token_budget: int | None, run_id: str | None, logger: Any,
                 collect_keys: bool):
        settings = client.settings
        if call.model is not None and settings.batch_endpoint_for(call.model) is None:
            raise InferenceConfigError(
                f"mode='batch_api' needs an endpoint with batch_api=True serving "
                f"'{call.model}'; set Endpoint(..., batch_api=True) on the provider's endpoint "
                "or use mode='online'.")
        if not any(e.batch_api for e in settings.endpoints):
            raise InferenceConfigError(
                "mode='batch_api' needs an endpoint with batch_api=True (a provider with a "
                "batch API: OpenAI, Azure OpenAI, Together, Groq, Mistral).")
        self.client, self.settings, self.call, self.inputs = client, settings, call, inputs
        self.wait, self.run_id, self.log = wait, run_id, logger
        self.collect_keys = collect_keys
        self.budget = TokenBudget(token_budget) if token_budget is not None else None
        self.book = BatchBook(client.ledger)
        self.protocols = {e.name: protocol_for(e) for e in settings.endpoints if e.batch_api}
        self.collector = BatchCollector(self.book, self.protocols, log=logger)
        # No claims between runs: the book's (key, attempt) uniqueness keeps two runs from
        # submitting a key both, and nothing of a pass uses an endpoint's online limits.
        self._refused = 0  # passes in a row whose submissions all failed
        self.pass_settings = settings.replace(
            ledger_flush_rows=max(settings.ledger_flush_rows, _PASS_FLUSH_ROWS),
            coordinate_runs=False)

    async def run(self) -> _Merged:
        merged: _Merged | None = None
        rows = None  # positions of the rows this pass covers (None: all)
        started = time.perf_counter()
        try:
            while True:
                await self.collector.refresh()
                frame = self.inputs if rows is None else self.inputs.iloc[rows]
                run, delivery = await self._pass(frame)
                merged = _Merged(run) if merged is None else merged.add(run, rows)
                if not self.wait or not delivery.waiting:
                    break
                await self._wait_for(delivery.waiting)
                rows = merged.waiting_rows()
                if not rows:
                    break
        finally:
            for protocol in self.protocols.values():
                protocol.close()
        merged.finish(self.settings, time.perf_counter() - started)
        return merged

    async def _pass(self, frame: Any) -> tuple[InferenceRun, BatchDelivery]:
        task = ChatTask(self.call, default_max_tokens=self.settings.default_max_tokens)
        delivery = BatchDelivery(
            self.settings, self.book, self.protocols, route=task.route, parse=task.parse_reply,
            budget=self.budget, scope=self.call.scope, partition_key=self.call.partition_key,
            run_id=self.run_id, log=self.log)
        run = InferenceRun(
            self.pass_settings, self.call, frame, pool=self.client.pool,
            ledger=self.client.ledger, token_budget=None, partition_key=self.call.partition_key,
            run_id=self.run_id, scope=self.call.scope, logger=self.log,
            collect_keys=self.collect_keys, task=task, delivery=delivery)
        try:
            await run.run()
        except BaseException:
            await delivery.discard()
            raise
        await delivery.submit_open_files()
        await asyncio.to_thread(self._name_batches, run, delivery.submitted)
        return run, delivery

    def _name_batches(self, run: InferenceRun, submitted: dict[str, str | None]) -> None:
        """Deferred rows of files submitted at the end of the pass name their batch id, in
        the result and in the ledger."""
        renamed: dict[str, str] = {}
        for row, cell in enumerate(run.errors):
            if cell is not None and "(file " in cell:
                new = renamed.get(cell)
                if new is None:
                    new = renamed[cell] = batch_name(submitted, cell) or cell
                run.errors[row] = new
        table = self.client.ledger.table
        with self.client.ledger.engine.begin() as conn:
            for old, new in renamed.items():
                if old != new:
                    conn.execute(table.update().where(
                        table.c.status == DEFERRED, table.c.error == old,
                        table.c.scope == self.call.scope,
                        table.c.partition_key == self.call.partition_key).values(error=new))

    async def _wait_for(self, submissions: set[str]) -> None:
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
                                self.settings.batch_poll_initial_s * 2 ** self._refused)
                    self.log.warning(f"batchllm: no batch could be submitted; trying again in "
                                     f"{pause:.0f} s (within max_attempts)")
                    await asyncio.sleep(pause)
                return
            self.log.info(f"batchllm: {progress_line(rows)}; next poll in {delay:.0f} s")
            await asyncio.sleep(delay)
            delay = min(self.settings.batch_poll_max_s, delay * 1.5)


class _Merged:
    """The rows' outcomes over all passes: each row's from the pass that settled it."""

    def __init__(self, run: InferenceRun):
        self.outputs, self.errors = run.outputs, run.errors
        self.error_types, self.row_status = run.error_types, run.row_status
        self.keys = run.keys
        self.stats: InferenceStats = run.stats
        self._latency = (run.stats.latency_p50_s, run.stats.latency_p95_s)

    def waiting_rows(self) -> list[int]:
        deferred = RowStatus.DEFERRED
        return [i for i, status in enumerate(self.row_status)
                if status == deferred and _WAITING in (self.errors[i] or "")]

    def add(self, run: InferenceRun, rows: list[int] | None) -> _Merged:
        positions = rows if rows is not None else range(len(self.outputs))
        for j, i in enumerate(positions):
            self.outputs[i] = run.outputs[j]
            self.errors[i] = run.errors[j]
            self.row_status[i] = run.row_status[j]
            error_type = run.error_types.get(j)
            if error_type is None:
                self.error_types.pop(i, None)
            else:
                self.error_types[i] = error_type
        s, new = self.stats, run.stats
        s.requests += new.requests
        s.retries += new.retries
        s.prompt_tokens += new.prompt_tokens
        s.completion_tokens += new.completion_tokens
        for model, tokens in new.tokens_by_model.items():
            held = s.tokens_by_model.setdefault(model, {"prompt_tokens": 0,
                                                        "completion_tokens": 0})
            for name, value in tokens.items():
                held[name] = held.get(name, 0) + value
        for name, figures in new.endpoints.items():
            held = s.endpoints.setdefault(name, {})
            for counter, value in figures.items():
                held[counter] = (held.get(counter, 0) + value
                                 if isinstance(value, int) else value)
        if new.latency_p50_s is not None:
            self._latency = (new.latency_p50_s, new.latency_p95_s)
        return self

    def finish(self, settings: Any, elapsed_s: float) -> None:
        s = self.stats
        counts = array("l", [0] * len(RowStatus))
        for status in self.row_status:
            counts[status] += 1
        s.cached = counts[RowStatus.CACHED]
        s.succeeded = counts[RowStatus.OK] + counts[RowStatus.CACHED]
        s.failed = counts[RowStatus.FAILED]
        s.deferred = counts[RowStatus.DEFERRED]
        s.errors_by_type = {}
        for row, error_type in self.error_types.items():
            if self.row_status[row] == RowStatus.FAILED:
                s.errors_by_type[error_type] = s.errors_by_type.get(error_type, 0) + 1
        s.latency_p50_s, s.latency_p95_s = self._latency
        s.elapsed_s = elapsed_s
        s.mode = "batch_api"
        s.online_cost_usd = estimate_cost(settings, s.tokens_by_model)
        s.estimated_cost_usd = batch_cost(settings, s.tokens_by_model)


def batch_cost(settings: Any, tokens_by_model: dict[str, dict[str, int]]) -> float | None:
    """What the tokens cost at each model's batch price."""
    total = None
    for model, tokens in tokens_by_model.items():
        price = settings.batch_price_for(model)
        if price is None:
            continue
        total = (total or 0.0) + (tokens["prompt_tokens"] * price[0]
                                  + tokens["completion_tokens"] * price[1]) / 1e6
    return round(total, 6) if total is not None else None


__all__ = ["MODES", "BatchModeCall", "batch_cost", "check_mode"]
