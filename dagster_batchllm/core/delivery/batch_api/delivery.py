"""The batch API as a delivery: each request becomes a line of a batch file, not an HTTP call.

The engine hands :class:`BatchDelivery` parcels of requests (``send_many``; ``send`` is a
parcel of one). Each key is looked up in the batch book (see :mod:`.book`) and then,
without waiting for any batch:

* the key's line was answered in a collected batch: the reply goes back to the engine, which
  parses it with the task and records it in the ledger like an online answer (so structured
  output is validated and the run's tokens and cost count it);
* its line failed for a reason a retry cannot fix, or used up ``max_attempts``: that error;
* its line is in a batch not yet ended (this run's, a crashed run's, another partition's):
  ``DeferredError("waiting for batch <id>")``: nothing is submitted again;
* otherwise (new, a retryable failure, a line an expired or cancelled batch never answered):
  the line is appended to the open file of its model and recorded in the book, the token budget
  is charged its reservation, and the row is deferred, waiting for that batch.

Two shortcuts spare most keys their lookup: an answer the call's collector has just collected
is taken from it (:attr:`~.collect.BatchCollector.answers`), and after a parcel whose keys
had no line the next are recorded as first attempts at once, all or none: if any of them has a
line after all, the book takes none of them and they are looked up and decided as above.

So a worker never waits for a batch, and memory stays flat in rows: lines are streamed to a
file, cut at ``max_requests_per_batch`` / ``max_bytes_per_batch`` and uploaded in the
background; lookups and book writes are gathered per couple of thousand keys (:mod:`.spool`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import DeferredError, ErrorType, RowError, UnsupportedModelError
from ...requests import Completion, RowRequest
from ...settings import EndpointSpec, InferenceSettings
from ..base import Delivery
from ..limits import CostBudget, TokenBudget, charge_submission, refund_submissions
from .book import COLLECTED, LINE_OK, SUBMIT_FAILED, BatchBook
from .protocol import BatchProtocol
from .readers import read_line_body
from .spool import Gatherer, Spool, waiting_for
from .submit import submit_file

# Keys per book transaction: a commit writes every page its inserts touched, so a larger one
# (in key order, see in_key_order) shares pages among more of them.
_GATHER = 8192
# Requests a worker hands over at once (the engine's ``items_per_send``): a parcel costs one
# coroutine step, one lookup and one book write in all, not one per row.
_PER_SEND = 1000
_UPLOADS_AT_ONCE = 2

#: A line to submit: its file, key, attempt and bytes, and whether it was placed without a
#: look at the key's lines (assumed new: a first attempt, see BatchDelivery.send_many).
Note = tuple[Spool, str, int, bytes, bool]


#: Rows deferred for the online endpoints by a pass that submits nothing (``submits=False``:
#: the deadline's switch in :mod:`dagster_batchllm.core.batch.mode` sends them online).
LEFT_FOR_ONLINE = "left for the online endpoints: the deadline is near"


class BatchDelivery(Delivery):
    """A :class:`~.delivery.Delivery` that submits requests as offline batch lines."""

    #: Its answers are in the batch book, or at the provider in a batch the book has as
    #: collecting (see BatchCollector.in_hand), before the engine sees them: a run killed
    #: before writing them to the ledger loses none, so the run keeps no journal of its own.
    keeps_answers = True

    def __init__(self, settings: InferenceSettings, book: BatchBook,
                 protocols: dict[str, BatchProtocol], *, route: str,
                 budget: TokenBudget | None, scope: str, partition_key: str,
                 run_id: str | None, log: Any = None, cost_budget: CostBudget | None = None,
                 answered: dict[str, tuple] | None = None,
                 in_hand: dict[str, Any] | None = None, submits: bool = True):
        self.settings = settings
        #: False at a deadline's switch (see deadline.py): a key with no answer in an ended
        #: batch is deferred for the online endpoints, not put in a file or waited for.
        self.submits = submits
        self._left_for_online = DeferredError(LEFT_FOR_ONLINE)
        #: Lines the call's collector just collected (BatchCollector.answers), taken from
        #: there rather than read back from the book, and the keys taken (the collector
        #: writes the answers of the others to the book after the pass).
        self.answered = answered if answered is not None else {}
        #: The engine asks the ledger about none of those keys (see Delivery): a line of the
        #: call's partition answered in a batch that this call collected has no record yet.
        self.held_answers = self.answered
        self.taken: set[str] = set()
        #: The collector's batches in hand (BatchCollector.in_hand): "collecting" in the
        #: book, collected for this pass.
        self.in_hand = in_hand if in_hand is not None else {}
        self.book = book
        self.protocols = protocols
        self.route = route
        self.budget = budget
        self.cost_budget = cost_budget  # budget_usd (see charge_submission)
        self.scope, self.partition_key, self.run_id = scope, partition_key, run_id
        self.log = log or logging.getLogger("dagster_batchllm")
        self._lookups = Gatherer(self._latest_lines, _GATHER)
        self._notes = Gatherer(self._note_lines, _GATHER)
        self._endpoints: dict[str, EndpointSpec | None] = {}
        self._waiting_errors: dict[tuple[str, str], DeferredError] = {}
        self._spools: dict[str, Spool] = {}  # the open file of each model
        self._own: dict[str, Spool] = {}  # every file of this pass, by submission id
        self._directory: Path | None = None
        self._uploads: set[asyncio.Task] = set()
        self._upload_slots = asyncio.Semaphore(_UPLOADS_AT_ONCE)
        #: submission id -> provider batch id (None if the provider refused it), this pass
        self.submitted: dict[str, str | None] = {}
        #: submission ids of the batches the deferred rows of this pass wait for
        self.waiting: set[str] = set()
        #: submission ids of the ended batches whose lines this pass turned into outcomes
        self.consumed: set[str] = set()
        self.lines_submitted = 0
        self.collected_ok = 0
        self.collected_failed = 0
        # Whether the next parcel's keys are taken to be new, without a lookup (see send_many).
        self._assume_new = False

    # -- the Delivery interface --------------------------------------------------------------
    #: Parcels the engine hands :meth:`send_many` at once.
    items_per_send = _PER_SEND

    def capacity(self) -> int:
        # Sending is a lookup and a line written to a file: enough workers that the gathered
        # book transactions are full, and one fills the next while another's is on its thread.
        return _GATHER

    def endpoint_for(self, model: str) -> EndpointSpec | None:
        try:
            return self._endpoints[model]
        except KeyError:
            found = self._endpoints[model] = self.settings.batch_endpoint_for(model)
            return found

    def refusal(self, request: RowRequest) -> RowError | None:
        if self.endpoint_for(request.model) is None:
            return UnsupportedModelError(
                f"no endpoint with batch_api=True serves model '{request.model}'")
        return None

    async def open(self, writer: Any) -> None:
        # Nothing is sent while the run goes on: the writer's room does not hold it back.
        # One delivery serves every engine run of a pass (a run per slice of rows), so a file
        # fills across them.
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="batchllm-batch-files-"))

    async def close(self) -> None:
        """Nothing at the end of one engine run: the pass submits the open files after its
        last run (:meth:`submit_open_files`), or drops them after a stop (:meth:`discard`)."""

    async def wait_for_uploads(self) -> None:
        """Wait for the uploads already started (whatever comes of them)."""
        if self._uploads:
            await asyncio.gather(*list(self._uploads), return_exceptions=True)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        figures: dict[str, dict[str, Any]] = {}
        for name in self.protocols:
            figures[name] = {"requests": self.lines_submitted, "succeeded": self.collected_ok,
                             "failed": self.collected_failed, "mode": "batch_api",
                             "batches_submitted": len(self.submitted)}
        return figures

    async def send_many(self, requests: list[RowRequest], attempts: list[Any]
                        ) -> list[Completion | RowError]:
        """Each request's outcome, in order: the collected reply, its line's final error, or a
        deferral (waiting for the batch its line is in, or was put in now)."""
        results: list[Completion | RowError | None] = [None] * len(requests)
        everything = range(len(requests))
        assume_new = self._assume_new
        if assume_new:
            # The keys of the last parcel looked up had no line: these are taken to be new
            # too, and put in files as first attempts at once. One that has a line after all
            # is refused by the book (its first attempt is there) and then looked up.
            notes, placed = self._place(requests, attempts, [None] * len(requests), everything,
                                        results, assumed_new=True)
        else:
            lines = await self._lookups.submit([request.key for request in requests])
            # Not with a token budget: a key it refused would be deferred without a look at
            # its line, which may hold its answer.
            self._assume_new = (self.budget is None and self.cost_budget is None
                                and all(line is None for line in lines))
            notes, placed = self._place(requests, attempts, lines, everything, results)
        if notes:
            await self._record_notes(requests, attempts, notes, placed, results,
                                     assumed_new=assume_new)
        return results  # type: ignore[return-value] - every position is set

    def _place(self, requests: list[RowRequest], attempts: list[Any], lines: list[Any],
               positions: Sequence[int], results: list[Any], *, assumed_new: bool = False
               ) -> tuple[list[Note], list[int]]:
        """Decide the requests at ``positions`` from their keys' latest lines (``lines[j]``
        for ``positions[j]``): a result, or a note of the line to submit and its position
        (``assumed_new``: the lines were not looked up, see :class:`Note`)."""
        notes: list[Note] = []
        placed: list[int] = []  # the positions of the requests in ``notes``
        budget, max_attempts = self.budget, self.settings.max_attempts
        model = endpoint = line_of = None  # the last request's (a parcel is mostly one model's)
        for i, line in zip(positions, lines, strict=True):
            request, tried = requests[i], attempts[i]
            if request.model != model:
                model, endpoint = request.model, self.endpoint_for(request.model)
                assert endpoint is not None  # refused before otherwise
                line_of = self.protocols[endpoint.name].line
            tried.endpoint = endpoint.name
            attempt = 1
            if type(line) is tuple:  # an answer the collector holds (BatchCollector.answers)
                (sub, _batch_id, created, ended), tried.count, content, prompt, completion, \
                    reason, cached, _key = line
                self.consumed.add(sub)
                self.collected_ok += 1
                results[i] = Completion(content, prompt, completion, bool(prompt or completion),
                                        reason, max(0.0, (ended or created) - created),
                                        cached_tokens=cached)
                continue
            if line is not None:
                if line.batch_status not in (COLLECTED, SUBMIT_FAILED) and not self.submits:
                    results[i] = self._left_for_online
                    continue
                if line.batch_status not in (COLLECTED, SUBMIT_FAILED):
                    self.waiting.add(line.submission_id)
                    own = self._own.get(line.submission_id)  # a row of an earlier slice's key
                    results[i] = own.deferred if own is not None else self._waiting_error(
                        line.batch_name, line.batch_status)
                    continue
                tried.count = line.attempt
                self.consumed.add(line.submission_id)
                if line.state == LINE_OK and line.content is not None:
                    self.collected_ok += 1  # read when its batch was collected
                    results[i] = Completion(
                        line.content, line.prompt_tokens, line.completion_tokens,
                        bool(line.prompt_tokens or line.completion_tokens), line.finish_reason,
                        line.latency_s, cached_tokens=line.cached_tokens or 0)
                    continue
                if line.state == LINE_OK and line.response is not None:
                    self.collected_ok += 1  # a line of a book made before: its reply body
                    try:
                        results[i] = read_line_body(self.route, line.response.encode(),
                                                    endpoint=endpoint.name,
                                                    latency_s=line.latency_s)
                    except RowError as exc:
                        results[i] = exc
                    continue
                if line.state == LINE_OK:  # its answer went to the ledger, which lost it
                    self.collected_failed += 1
                    results[i] = RowError(
                        f"batch {line.batch_name} answered this request and its answer was "
                        "written to the ledger, which no longer holds it (a record deleted "
                        "by hand?); it is not submitted again", error_type=ErrorType.INTERNAL)
                    continue
                if not line.retryable or line.attempt >= max_attempts:
                    self.collected_failed += 1
                    tries = "" if not line.retryable else (
                        f" (after {line.attempt} batch submissions, max_attempts)")
                    results[i] = RowError(f"{line.error or 'the batch gave no answer'}{tries}",
                                          error_type=ErrorType(line.error_type or "server_error"))
                    continue
                attempt = line.attempt + 1
            if not self.submits:
                results[i] = self._left_for_online
                continue
            data = line_of(request.key, self.route, request.body)
            if type(data) is not bytes:  # a request the provider's API cannot express
                results[i] = data
                continue
            if budget is not None or self.cost_budget is not None:
                refused = charge_submission(budget, self.cost_budget, self.settings, request)
                if refused is not None:
                    results[i] = refused
                    continue
            spool = self._spool_for(len(data), model, endpoint)
            spool.lines += 1  # its place in the file, kept until the book says it is ours
            spool.bytes += len(data)
            notes.append((spool, request.key, attempt, data, assumed_new))
            placed.append(i)
            if spool.lines >= endpoint.max_requests_per_batch:
                # Its upload task starts after this parcel's notes are handed in below, and
                # waits for them: the file holds every line given a place in it.
                self._cut(spool, endpoint)
        return notes, placed

    async def _record_notes(self, requests: list[RowRequest], attempts: list[Any],
                            notes: list[Note], placed: list[int],
                            results: list[Any], *, assumed_new: bool = False) -> None:
        # The key goes in the book first and its line into the file only then (both on the
        # book's thread, in order): from then on a rerun or another run finds the key in this
        # batch and does not submit it again. If another run recorded this attempt of the key
        # first, its batch is the one to wait for.
        recorded = await self._notes.submit(notes)
        lost: list[int] = []
        for (spool, *_), i, mine in zip(notes, placed, recorded, strict=True):
            if mine:
                attempts[i].sent = 1
                results[i] = spool.deferred
                self.waiting.add(spool.submission_id)
            else:
                lost.append(i)
        self.lines_submitted += len(notes) - len(lost)
        if not lost:
            return
        refund_submissions(self.budget, self.cost_budget, self.settings,
                           [requests[i] for i in lost])  # another run's lines: not this call's
        lines = await self._lookups.submit([requests[i].key for i in lost])
        if assumed_new:
            # Keys placed without a lookup that have lines: decided now from those lines
            # (an answer, a wait, an error, or a next attempt), as a looked-up key is.
            self._assume_new = False
            retried, where = self._place(requests, attempts, lines, lost, results)
            if retried:
                await self._record_notes(requests, attempts, retried, where, results)
            return
        for i, line in zip(lost, lines, strict=True):
            name = line.batch_name if line is not None else "of another run"
            if line is not None:
                self.waiting.add(line.submission_id)
            results[i] = DeferredError(f"waiting for batch {name}, which another run submitted; "
                                       "a later run collects its answers, nothing is submitted "
                                       "again")

    def _waiting_error(self, name: str, status: str) -> DeferredError:
        known = self._waiting_errors
        return known.get((name, status)) or known.setdefault((name, status),
                                                             waiting_for(name, status))

    def _latest_lines(self, keys: list[str]) -> list[Any]:
        answered = self.answered
        if answered:
            find, taken = answered.get, self.taken
            lines = [find(key) for key in keys]  # a held answer is a tuple (see _place)
            unread = [key for key, line in zip(keys, lines, strict=True) if line is None]
            # The held answer's own key (its last field), not the request's: the request's
            # string would live on in ``taken`` for the whole pass, 90 bytes a row.
            if not unread:
                taken.update([line[-1] for line in lines])
                return lines
            taken.update([line[-1] for line in lines if line is not None])
            found = self._read_lines(unread)
            return [line if line is not None else found.get(key)
                    for key, line in zip(keys, lines, strict=True)]
        found = self._read_lines(keys)
        return [found.get(key) for key in keys]

    def _read_lines(self, keys: list[str]) -> dict[str, Any]:
        found = self.book.latest_lines(keys)
        if self.in_hand:  # the call's own collector has those batches' answers: collected
            for key, line in found.items():
                if line.submission_id in self.in_hand:
                    found[key] = line._replace(batch_status=COLLECTED)
        return found

    # -- files -------------------------------------------------------------------------------
    def _spool_for(self, size: int, model: str, endpoint: EndpointSpec) -> Spool:
        spool = self._spools.get(model)
        if spool is not None and spool.lines and (
                spool.bytes + size > endpoint.max_bytes_per_batch):
            self._cut(spool, endpoint)
            spool = None
        if spool is None:
            assert self._directory is not None
            spool = self._spools[model] = Spool(self._directory, model)
            self._own[spool.submission_id] = spool
        return spool

    def _note_lines(self, notes: list[Note]) -> list[bool]:
        """On the book's thread: record the keys (each spool's batch row first), then write
        the lines of the keys recorded here to their files; whether each note's key was.
        A spool's notes assumed new are recorded all or none: if any of their keys has a line
        already (even one in this very file, which would then count as ours), none is."""
        by_spool: dict[tuple[Spool, bool], list[tuple[str, int]]] = {}
        for spool, key, attempt, _data, assumed in notes:
            by_spool.setdefault((spool, assumed), []).append((key, attempt))
        ours: dict[tuple[Spool, bool], set[str]] = {}
        for (spool, assumed), keys in by_spool.items():
            if not spool.recorded:
                endpoint = self.endpoint_for(spool.model)
                self.book.record_submission({
                    "submission_id": spool.submission_id,
                    "provider": self.protocols[endpoint.name].provider,
                    "endpoint": endpoint.name, "model": spool.model, "route": self.route,
                    "lines": 0, "bytes": 0, "scope": self.scope,
                    "partition_key": self.partition_key, "run_id": self.run_id})
                spool.recorded = True
            ours[(spool, assumed)] = self.book.add_lines(
                spool.submission_id, keys, partition=(self.scope, self.partition_key),
                all_or_none=assumed)
        recorded: list[bool] = []
        chunks: dict[Spool, list[bytes]] = {spool: [] for spool, _ in by_spool}
        for spool, key, _attempt, data, assumed in notes:
            mine = key in ours[(spool, assumed)]
            recorded.append(mine)
            if mine:
                chunks[spool].append(data)
        for spool, datas in chunks.items():
            if datas:
                block = b"".join(datas)
                spool.handle.write(block)
                spool.written += len(datas)
                spool.written_bytes += len(block)
        return recorded

    def _cut(self, spool: Spool, endpoint: EndpointSpec) -> None:
        if self._spools.get(spool.model) is spool:
            del self._spools[spool.model]
        task = asyncio.get_running_loop().create_task(self._submit(spool, endpoint))
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    async def _submit(self, spool: Spool, endpoint: EndpointSpec) -> None:
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
                submit_file, self.book, self.protocols[endpoint.name], spool, endpoint,
                route=self.route, scope=self.scope, partition_key=self.partition_key,
                log=self.log)

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
