"""The batch API as a delivery: each request becomes a line of a batch file, not an HTTP call.

The engine hands :class:`BatchDelivery` one request at a time, as it does the online delivery.
``send`` looks the key up in the batch book (see :mod:`.batch_book`) and then, without waiting
for any batch:

* the key's line was answered in a collected batch: the reply goes back to the engine, which
  parses it with the task and records it in the ledger like an online answer (so structured
  output is validated and the run's tokens and cost count it);
* its line failed for a reason a retry cannot fix, or used up ``max_attempts``: that error;
* its line is in a batch not yet ended (this run's, a crashed run's, another partition's):
  ``DeferredError("waiting for batch <id>")``: nothing is submitted again;
* otherwise (new, a retryable failure, a line an expired or cancelled batch never answered):
  the line is appended to the open file of its model and recorded in the book, the token budget
  is charged its reservation, and the row is deferred, waiting for that batch.

So a worker never waits for a batch, and memory stays flat in rows: lines are streamed to a
file on disk, which is cut at the endpoint's ``max_requests_per_batch`` / ``max_bytes_per_batch``
and uploaded by a background task while the run goes on. Lookups and book writes are gathered
into one query per few hundred keys.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .batch_book import COLLECTED, SUBMIT_FAILED, BatchBook, LineState, owner_id
from .batch_protocol import BatchProtocol
from .errors import DeferredError, ErrorType, RowError, UnsupportedModelError
from .limits import TokenBudget
from .prompts import RowRequest
from .settings import EndpointSpec, InferenceSettings
from .transport import Completion, ReplyParser

#: Rows deferred into a file not yet submitted say this, then the submission id; once the batch
#: is created the message is rewritten to name the provider's batch id.
NOT_YET_SUBMITTED = "waiting for batch (file "
_GATHER = 2000  # keys per book transaction (a lookup queries them 500 at a time)
_UPLOADS_AT_ONCE = 2


class _Gatherer:
    """Gathers items handed in by many workers into one blocking call (on a thread) per
    ``size`` items or per turn of the event loop; each worker awaits its own result. Calls run
    one at a time, in order, so a result also says every item handed in before it is done."""

    def __init__(self, call: Callable[[list[Any]], dict[Any, Any] | None], size: int = _GATHER):
        self.call, self.size = call, size
        self._items: list[Any] = []
        self._futures: list[asyncio.Future] = []
        self._scheduled = False
        self._turn = asyncio.Lock()
        self._running: set[asyncio.Task] = set()

    async def submit(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._items.append(item)
        self._futures.append(future)
        if len(self._items) >= self.size:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await future

    async def drain(self) -> None:
        """Wait until everything handed in so far is done."""
        self._flush()
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._items:
            return
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        task = asyncio.get_running_loop().create_task(self._run(items, futures))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, items: list[Any], futures: list[asyncio.Future]) -> None:
        try:
            async with self._turn:
                found = await asyncio.to_thread(self.call, items)
        except Exception as exc:  # every waiting worker gets it (the engine makes it a row error)
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        for item, future in zip(items, futures, strict=True):
            if not future.done():
                future.set_result(None if found is None else found.get(item))


class _Spool:
    """The open batch file of one model: lines on disk, keys noted for the book."""

    def __init__(self, directory: Path, model: str):
        self.submission_id = f"bllm-{uuid.uuid4().hex[:20]}"
        self.model = model
        self.path = directory / f"{self.submission_id}.jsonl"
        self.handle = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed at cut
        self.lines = 0  # lines given a place (cut at the endpoint's limits)
        self.bytes = 0
        self.written = 0  # lines in the file (keys the book recorded for this batch)
        self.written_bytes = 0
        self.recorded = False


class BatchDelivery:
    """A :class:`~.delivery.Delivery` that submits requests as offline batch lines."""

    #: Its answers are in the batch book before the engine sees them: a run killed before
    #: writing them to the ledger loses none, so the run keeps no journal of its own.
    keeps_answers = True

    def __init__(self, settings: InferenceSettings, book: BatchBook,
                 protocols: dict[str, BatchProtocol], *, route: str, parse: ReplyParser,
                 budget: TokenBudget | None, scope: str, partition_key: str,
                 run_id: str | None, log: Any = None):
        self.settings = settings
        self.book = book
        self.protocols = protocols
        self.route = route
        self.parse = parse
        self.budget = budget
        self.scope, self.partition_key, self.run_id = scope, partition_key, run_id
        self.log = log or logging.getLogger("dagster_batchllm")
        self._lookups = _Gatherer(self.book.latest_lines)
        self._notes = _Gatherer(self._note_lines)
        self._spools: dict[str, _Spool] = {}
        self._directory: Path | None = None
        self._uploads: set[asyncio.Task] = set()
        self._upload_slots = asyncio.Semaphore(_UPLOADS_AT_ONCE)
        #: submission id -> provider batch id (None if the provider refused it), this pass
        self.submitted: dict[str, str | None] = {}
        #: submission ids of the batches the deferred rows of this pass wait for
        self.waiting: set[str] = set()
        self.lines_submitted = 0
        self.collected_ok = 0
        self.collected_failed = 0

    # -- the Delivery interface --------------------------------------------------------------
    def capacity(self) -> int:
        # Sending is a lookup and a line written to a file: enough workers that the gathered
        # book transactions are full.
        return _GATHER

    def endpoint_for(self, model: str) -> EndpointSpec | None:
        return self.settings.batch_endpoint_for(model)

    def refusal(self, request: RowRequest) -> RowError | None:
        if self.endpoint_for(request.model) is None:
            return UnsupportedModelError(
                f"no endpoint with batch_api=True serves model '{request.model}'")
        return None

    async def open(self) -> None:
        self._directory = Path(tempfile.mkdtemp(prefix="batchllm-batch-files-"))

    async def close(self) -> None:
        """Files are submitted by :meth:`submit_open_files` (after a run that ended well) or
        dropped by :meth:`discard` (after a stop); here only the uploads already started are
        waited for."""
        if self._uploads:
            await asyncio.gather(*list(self._uploads), return_exceptions=True)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        figures: dict[str, dict[str, Any]] = {}
        for name in self.protocols:
            figures[name] = {"requests": self.lines_submitted, "succeeded": self.collected_ok,
                             "failed": self.collected_failed, "mode": "batch_api",
                             "batches_submitted": len(self.submitted)}
        return figures

    async def send(self, request: RowRequest, attempts: Any) -> Completion:
        line: LineState | None = await self._lookups.submit(request.key)
        endpoint = self.endpoint_for(request.model)
        assert endpoint is not None  # refused before otherwise
        attempts.endpoint = endpoint.name
        attempt = 1
        if line is not None:
            if line.batch_status not in (COLLECTED, SUBMIT_FAILED):
                self.waiting.add(line.submission_id)
                raise DeferredError(
                    f"waiting for batch {line.batch_name} ({line.batch_status}); a later run "
                    "collects its answers, nothing is submitted again")
            attempts.count = line.attempt
            if line.state == "ok" and line.response is not None:
                self.collected_ok += 1
                return self.parse(line.response.encode(), endpoint=endpoint.name,
                                  latency_s=line.latency_s)
            if not line.retryable or line.attempt >= self.settings.max_attempts:
                self.collected_failed += 1
                tries = "" if not line.retryable else (
                    f" (after {line.attempt} batch submissions, max_attempts)")
                raise RowError(f"{line.error or 'the batch gave no answer'}{tries}",
                               error_type=ErrorType(line.error_type or "server_error"))
            attempt = line.attempt + 1
        budget = self.budget
        if budget is not None:
            if not budget.try_reserve(request.reserve_tokens):
                raise DeferredError(
                    f"the token budget ({budget.total}) has {budget.remaining} tokens left, "
                    f"this request may need {request.reserve_tokens}; a later call will "
                    "submit it")
            budget.settle(request.reserve_tokens, request.reserve_tokens)  # reserved for good
        data = self.protocols[endpoint.name].line(request.key, self.route, request.body)
        spool = self._spool_for(len(data), request.model, endpoint)
        spool.lines += 1  # its place in the file, kept until the book says it is ours
        spool.bytes += len(data)
        if spool.lines >= endpoint.max_requests_per_batch:
            self._cut(spool, endpoint)
        # The key goes in the book first and its line into the file only then (both on the
        # book's thread, in order): from then on a rerun or another run finds the key in this
        # batch and does not submit it again. If another run recorded this attempt of the key
        # first, its batch is the one to wait for.
        if not await self._notes.submit((spool, request.key, attempt, data)):
            if budget is not None:
                budget.spent -= request.reserve_tokens
            line = await self._lookups.submit(request.key)
            name = line.batch_name if line is not None else "of another run"
            if line is not None:
                self.waiting.add(line.submission_id)
            raise DeferredError(f"waiting for batch {name}, which another run submitted; a "
                                "later run collects its answers, nothing is submitted again")
        self.lines_submitted += 1
        attempts.sent = 1
        self.waiting.add(spool.submission_id)
        raise DeferredError(f"{NOT_YET_SUBMITTED}{spool.submission_id}); a later run "
                            "collects its answers, nothing is submitted again")

    # -- files -------------------------------------------------------------------------------
    def _spool_for(self, size: int, model: str, endpoint: EndpointSpec) -> _Spool:
        spool = self._spools.get(model)
        if spool is not None and spool.lines and (
                spool.bytes + size > endpoint.max_bytes_per_batch):
            self._cut(spool, endpoint)
            spool = None
        if spool is None:
            assert self._directory is not None
            spool = self._spools[model] = _Spool(self._directory, model)
        return spool

    def _note_lines(self, notes: list[tuple[_Spool, str, int, bytes]]
                    ) -> dict[tuple[_Spool, str, int, bytes], bool]:
        """On the book's thread: record the keys (each spool's batch row first), then write
        the lines of the keys recorded here to their files."""
        by_spool: dict[_Spool, list[tuple[str, int]]] = {}
        for spool, key, attempt, _data in notes:
            by_spool.setdefault(spool, []).append((key, attempt))
        ours: dict[_Spool, set[str]] = {}
        for spool, keys in by_spool.items():
            if not spool.recorded:
                endpoint = self.endpoint_for(spool.model)
                self.book.record_submission({
                    "submission_id": spool.submission_id,
                    "provider": self.protocols[endpoint.name].provider,
                    "endpoint": endpoint.name, "model": spool.model, "route": self.route,
                    "lines": 0, "bytes": 0, "scope": self.scope,
                    "partition_key": self.partition_key, "run_id": self.run_id})
                spool.recorded = True
            ours[spool] = self.book.add_lines(spool.submission_id, keys)
        recorded = {}
        for note in notes:
            spool, key, _attempt, data = note
            mine = recorded[note] = key in ours[spool]
            if mine:
                spool.handle.write(data)
                spool.written += 1
                spool.written_bytes += len(data)
        return recorded

    def _cut(self, spool: _Spool, endpoint: EndpointSpec) -> None:
        if self._spools.get(spool.model) is spool:
            del self._spools[spool.model]
        task = asyncio.get_running_loop().create_task(self._submit(spool, endpoint))
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    async def _submit(self, spool: _Spool, endpoint: EndpointSpec) -> None:
        await self._notes.drain()  # every key of the file is in the book, its line written
        spool.handle.close()
        if not spool.written:  # every key was another run's already
            if spool.recorded:
                await asyncio.to_thread(self.book.forget_submission, spool.submission_id)
            spool.path.unlink(missing_ok=True)
            return
        async with self._upload_slots:
            # All on one thread call: a stop that cancels this task cannot leave the book
            # saying "submitting" for a batch that was in fact created.
            self.submitted[spool.submission_id] = await asyncio.to_thread(
                self._submit_blocking, spool, endpoint)

    def _submit_blocking(self, spool: _Spool, endpoint: EndpointSpec) -> str | None:
        protocol = self.protocols[endpoint.name]
        sub = spool.submission_id
        self.book.update_batch(sub, lines=spool.written, bytes=spool.written_bytes,
                               owner=owner_id())
        try:
            batch_id, file_id = protocol.submit(
                spool.path, route=self.route, submission_id=sub,
                metadata={"scope": self.scope[:500], "partition": self.partition_key[:500]})
        except Exception as exc:
            error = protocol.api_error(exc)
            try:  # the create may have happened, its reply lost
                batch_id, file_id = protocol.find(sub), None
            except Exception:
                batch_id = None
            if batch_id is None:
                self.log.warning(f"batchllm: submitting batch file {sub} ({spool.written} lines) "
                                 f"to '{endpoint.name}' failed: {error.as_cell()}")
                self.book.update_batch(sub, status=SUBMIT_FAILED, errors=error.as_cell())
                self.book.fail_lines(sub, error.message, error.error_type.value,
                                     error.retryable)
                return None
        finally:
            spool.path.unlink(missing_ok=True)
        self.book.update_batch(sub, batch_id=batch_id, input_file_id=file_id,
                               status="validating")
        self.log.info(f"batchllm: submitted batch {batch_id} to '{endpoint.name}': "
                      f"{spool.written} lines, {spool.written_bytes / 1e6:.1f} MB (model "
                      f"{spool.model})")
        return batch_id

    async def submit_open_files(self) -> None:
        """Cut and submit the files still open, and wait for every submission."""
        for spool in list(self._spools.values()):
            self._cut(spool, self.endpoint_for(spool.model))
        while self._uploads:
            await asyncio.gather(*list(self._uploads))
        self._remove_directory()

    async def discard(self) -> None:
        """After a stop: files not cut are dropped, and their keys forgotten, so a rerun
        submits them (nothing of them reached the provider)."""
        spools, self._spools = list(self._spools.values()), {}
        await self._notes.drain()
        for spool in spools:
            spool.handle.close()
            if spool.recorded:
                await asyncio.to_thread(self.book.forget_submission, spool.submission_id)
        self._remove_directory()

    def _remove_directory(self) -> None:
        if self._directory is not None and not self._spools and not self._uploads:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def batch_name(submitted: dict[str, str | None], cell: str | None) -> str | None:
    """A deferred row's error cell with its file's submission id replaced by the batch id."""
    if cell is None or NOT_YET_SUBMITTED not in cell:
        return cell
    start = cell.index(NOT_YET_SUBMITTED) + len(NOT_YET_SUBMITTED)
    sub = cell[start:cell.index(")", start)]
    batch_id = submitted.get(sub)
    if batch_id is None:
        return cell
    return (cell[:cell.index(NOT_YET_SUBMITTED)] + f"waiting for batch {batch_id}"
            + cell[cell.index(")", start) + 1:])

