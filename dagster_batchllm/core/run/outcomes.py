"""What an inference run does with each row's outcome: settle it, fill the row arrays, keep
its ledger record.

:class:`RowOutcomes` turns a request's reply or error into the outcome of every row that shares
the request (ok, failed, deferred), once per row, written out where a batch pass settles
100,000s of rows a second. It holds the run's row arrays and what it knows of each distinct
request (in flight, or settled other than ok); :class:`~.engine.InferenceRun` hands it each
reply and error, and reads the arrays when the run ends.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from ..errors import DeferredError, ErrorType, RowError
from ..ledger.table import DEFERRED, FAILED, OK, new_record
from ..results import RowStatus
from ..usage import correction_warning, hold_to_bound, within_bound

if TYPE_CHECKING:
    from ..delivery.base import Attempts
    from ..ledger.writer import LedgerWriter
    from ..requests import RowRequest
    from ..results import InferenceStats
    from ..tasks.base import Task
    from .figures import ReplyPrices

# The one vocabulary of row outcomes is RowStatus; the ledger's record statuses follow from it.
_LEDGER_STATUS = {RowStatus.OK: OK, RowStatus.FAILED: FAILED, RowStatus.DEFERRED: DEFERRED}
# The hot path's: a member of an enum class, and its ``.value``, cost a lookup through the
# enum's machinery each time.
_OK, _FAILED, _DEFERRED = RowStatus.OK, RowStatus.FAILED, RowStatus.DEFERRED
ERROR_TYPE_VALUES = {error_type: error_type.value for error_type in ErrorType}


class KeyState:
    """One distinct request of the run and the rows that share its answer."""

    __slots__ = ("request", "rows", "outcome")

    def __init__(self, request: RowRequest, row: int):
        self.request = request
        self.rows = [row]
        # (row status, value, error, error type) once settled; rows of the same key that the
        # producer meets after that take it at once (they can no longer join ``rows``).
        self.outcome: tuple[int, Any, str | None, str | None] | None = None


class RowOutcomes:
    """The outcome of every row of one run, and its ledger record.

    Its own: the row arrays (``outputs``, ``errors``, ``error_types``, ``row_status``: a
    :class:`RowStatus` byte per row), the distinct requests being answered (``inflight``, by
    key, until their records are written: :meth:`written`), those settled other than ok
    (``settled_not_ok``), the rows done and the replies' latencies. It adds the replies' tokens
    and the failures to the run's ``stats``, prices each reply with the run's ``prices`` and
    hands each record to the run's ledger ``writer``."""

    def __init__(self, rows: int, *, task: Task, writer: LedgerWriter, prices: ReplyPrices,
                 stats: InferenceStats, scope: str, partition_key: str, run_id: str | None,
                 log: Any):
        self.outputs: list[Any] = [None] * rows
        self.errors: list[str | None] = [None] * rows
        self.error_types: list[str | None] = [None] * rows  # the ErrorType value of its error
        self.row_status = bytearray(rows)  # a RowStatus per row
        self.inflight: dict[str, KeyState] = {}
        #: (row status, error, error type) of requests settled other than ok, by key
        self.settled_not_ok: dict[str, tuple[int, str | None, str | None]] = {}
        self.latencies = array("d")
        self.done_rows = 0
        #: Whether a record also ends its key's claim (the run coordinates with other runs):
        #: then a deferral the delivery keeps durably needs its record too (see :meth:`kept`).
        self.records_end_claims = False
        self.task, self.writer, self.prices, self.stats = task, writer, prices, stats
        self.scope, self.partition_key, self.run_id, self.log = scope, partition_key, run_id, log
        #: Whether this run logged a reply whose usage it corrected (it logs the first only).
        self._usage_warned = False

    def written(self, keys: list[str]) -> None:
        """Runs on the writer's thread after each write (which ended their claims): their
        requests are no longer in flight."""
        inflight = self.inflight
        for key in keys:
            inflight.pop(key, None)

    def conclude(self, state: KeyState, completion: Any, attempts: Attempts) -> None:
        """Settle ``state`` from the reply its request got."""
        self.conclude_many([(state, completion, attempts)])

    def conclude_many(self, answered: list[tuple[KeyState, Any, Attempts]]) -> None:
        """Settle each state from the reply its request got; the run's figures are added up
        once for all of them (a batch pass concludes 100,000s of rows a second)."""
        stats, latencies, reply_value = self.stats, self.latencies, self.task.reply_value
        row_status, outputs, errors = self.row_status, self.outputs, self.errors
        record = self.record
        by_model = stats.tokens_by_model
        model = per_model = None
        prompt_sum = completed_sum = done = 0
        for state, completion, attempts in answered:
            request = state.request
            latencies.append(completion.latency_s)
            if completion.usage_corrected is not None or not within_bound(completion, request):
                self._usage_corrected(completion, request, attempts.endpoint)
            prompt, completed = completion.prompt_tokens, completion.completion_tokens
            prompt_sum += prompt
            completed_sum += completed
            if request.model != model:
                model = request.model
                per_model = by_model.get(model)
                if per_model is None:
                    per_model = by_model[model] = {"prompt_tokens": 0, "completion_tokens": 0}
            per_model["prompt_tokens"] += prompt
            per_model["completion_tokens"] += completed
            try:
                value = reply_value(completion, request)
            except RowError as exc:
                self.settle_error(state, exc, attempts.count, attempts.endpoint,
                                  completion.content, completion)
                continue
            # What _settle does for an answer, written out: this runs once per answered row.
            state.outcome = (_OK, value, None, None)
            rows = state.rows
            if len(rows) == 1:
                row = rows[0]
                row_status[row] = _OK
                outputs[row] = value
                errors[row] = None
                done += 1
            else:
                self.finish_rows(rows, _OK, value=value)
            record(request, OK, completion.content, None, None, attempts.count,
                   attempts.endpoint, completion)
        stats.prompt_tokens += prompt_sum
        stats.completion_tokens += completed_sum
        self.done_rows += done

    def _usage_corrected(self, completion: Any, request: RowRequest,
                         endpoint: str | None) -> None:
        """A reply whose usage was no count or past its request's bound: held to the bound
        (if nothing did so before), counted, and the call's first one logged."""
        hold_to_bound(completion, request)
        self.stats.usage_corrected += 1
        if not self._usage_warned:
            self._usage_warned = True
            self.log.warning(correction_warning(endpoint, completion, request))

    # -- outcomes ----------------------------------------------------------------------------
    def settle_error(self, state: KeyState, error: RowError, attempts: int = 0,
                     endpoint: str | None = None, response: str | None = None,
                     completion: Any = None) -> None:
        error_type = ERROR_TYPE_VALUES[error.error_type]
        if isinstance(error, DeferredError):
            if self.kept(error):
                self.defer_kept([state], error.as_cell(), error_type)
            else:
                self._settle(state, _DEFERRED, None, error.as_cell(), error_type, response,
                             attempts, endpoint, completion)
            return
        self._settle(state, _FAILED, None, error.as_cell(), error_type, response, attempts,
                     endpoint, completion)

    def settle_unsettled(self, states: list[KeyState], error: RowError) -> None:
        """Fail those of ``states`` not settled yet with ``error`` (what went wrong in the
        run itself while it had them in hand)."""
        for state in states:
            if state.outcome is None:
                self.settle_error(state, error)

    def _settle(self, state: KeyState, row_status: RowStatus, value: Any = None,
                error: str | None = None, error_type: str | None = None,
                response: str | None = None, attempts: int = 0, endpoint: str | None = None,
                completion: Any = None) -> None:
        state.outcome = (row_status, value, error, error_type)
        self.finish_rows(state.rows, row_status, value=value, error=error,
                         error_type=error_type)
        if row_status != _OK:
            self.settled_not_ok[state.request.key] = (row_status, error, error_type)
        self.record(state.request, _LEDGER_STATUS[row_status], response, error, error_type,
                    attempts, endpoint, completion)

    def kept(self, error: RowError) -> bool:
        """Whether ``error`` is a deferral the delivery keeps durably (its line in the batch
        book): it needs no ledger record, unless the record would also end the key's claim."""
        return (isinstance(error, DeferredError) and error.kept_by_delivery
                and not self.records_end_claims)

    def defer_kept(self, states: list[KeyState], cell: str, error_type: str) -> None:
        """``_settle`` of a deferral with no record to write, written out: a batch pass
        defers each row it puts in a file this way (those of a file share one cell)."""
        outcome = (_DEFERRED, None, cell, error_type)
        settled = (_DEFERRED, cell, error_type)
        row_status, errors, error_types = self.row_status, self.errors, self.error_types
        settled_not_ok, inflight = self.settled_not_ok, self.inflight
        done = 0
        for state in states:
            state.outcome = outcome
            rows = state.rows
            for row in rows:
                row_status[row] = _DEFERRED
                errors[row] = cell
                error_types[row] = error_type
            done += len(rows)
            key = state.request.key
            settled_not_ok[key] = settled
            # Nothing to wait for: a later row of the key finds it settled above.
            inflight.pop(key, None)
        self.done_rows += done

    def finish_rows(self, rows: list[int], row_status: int, *, value: Any = None,
                    error: str | None = None, error_type: str | None = None) -> None:
        for row in rows:
            self.row_status[row] = row_status
            self.outputs[row] = value
            self.errors[row] = error
        if error_type is not None:
            for row in rows:
                self.error_types[row] = error_type
        self.done_rows += len(rows)
        if row_status == _FAILED:
            by_type = self.stats.errors_by_type
            by_type[error_type or "unknown"] = by_type.get(error_type or "unknown", 0) + len(rows)

    def record(self, request: RowRequest, status: str, response: str | None = None,
               error: str | None = None, error_type: str | None = None, attempts: int = 0,
               endpoint: str | None = None, completion: Any = None) -> None:
        model = request.model
        if completion is None:
            prompt_tokens = completion_tokens = 0
            latency_ms = cached = cost = estimated = corrected = None
        else:
            corrected = completion.usage_corrected
            # Beside what the server counted, what the dry run estimated: plans calibrate by it.
            estimated = request.typical_prompt_tokens
            prompt_tokens = completion.prompt_tokens
            completion_tokens = completion.completion_tokens
            cached = completion.cached_tokens
            # To the microsecond (round(x, 3) costs several times this, once per record).
            latency_ms = round(completion.latency_s * 1_000_000) / 1000
            # Priced at the endpoint that answered, online or as a batch line.
            cost = self.prices.pay(model, endpoint, prompt_tokens, completion_tokens, cached)
        key = request.key
        self.writer.add(new_record(
            key, self.scope, self.partition_key, model, status, response, error,
            error_type, prompt_tokens, completion_tokens, attempts, endpoint, latency_ms,
            self.run_id, cached, cost, estimated, corrected), key)

