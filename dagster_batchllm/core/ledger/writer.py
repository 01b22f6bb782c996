"""Writing a run's outcomes to the ledger in batches, while the run goes on.

Writes happen on a thread so the event loop keeps sending; a batch is written at half the
writer's room so one half is written while the other fills. ``full`` tells the run to send
nothing new while a room's worth of answers is unwritten: requests in flight plus unwritten
answers are then all that a crash can make a rerun pay for twice; with a journal (see
:mod:`.journal`) each answer is on disk before it is acknowledged, so only what is in flight.

A ledger database that goes away (restarted, network cut) pauses the run: writes are retried,
sending waits while a room's worth is unwritten, and once the database is back every answer is
written once. Only past ``outage_s`` of failing writes does the run stop with an error that
names the database (its password redacted); the journal keeps the answers for the rerun.

A SQLite ledger file deleted or replaced under the run is not an outage: the open connections
keep writing to the old file, which no one can open again. Each write checks the file is still
the one opened (one ``stat``, :func:`.stores.check_ledger_file`); when it is not, the run stops
sending at once and fails with :class:`~..errors.LedgerVanishedError`, keeping its journal.

The writer also holds the ledger's journal directory: it opens this run's journal there, folds
the journals of runs that died (at the start, then every ``_FOLD_EVERY_S`` while it runs, and
whenever the run asks: :meth:`LedgerWriter.fold_abandoned`), and closes both at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import tenacity

from ..errors import LedgerUnwritable, LedgerVanishedError
from .db_timeouts import round_trips_at_most
from .journal import AnswerJournal, JournalDirectory
from .stores import check_ledger_file, redact_url
from .table import OK, Ledger

_WARN_EVERY_S = 10.0  # while writes fail, one warning per this many seconds
# Other failures (a full disk, a bad record) are not waited out: after this many in a row the
# run stops sending.
_MAX_OTHER_FAILURES = 5
# While the run goes, the journals of runs that die meanwhile (a neighbour SIGKILLed) are
# folded within this long, so the requests they had answered are answered from the ledger,
# not paid again; looking costs an open and a flock per live journal.
_FOLD_EVERY_S = 1.0


def database_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached now (restarted, network cut), which
    waiting fixes, rather than that the write itself fails."""
    import sqlalchemy as sa

    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError,
                            sa.exc.DisconnectionError)) or getattr(
        exc, "connection_invalidated", False)


class LedgerWriter:
    def __init__(self, ledger: Ledger, *, room: int, interval_s: float,
                 on_written: Callable[[list[str]], None], log: Any,
                 outage_s: float, journal: AnswerJournal | None = None):
        """``on_written(keys)`` runs on the writing thread after each successful write;
        ``outage_s``: how long writes may keep failing while the database is away (a restart
        or a network cut pauses the run; longer fails it, and the journal keeps the answers);
        ``journal`` gets each paid-for answer as it is added."""
        self.ledger = ledger
        self.journal = journal
        self.journals: JournalDirectory | None = None  # the ledger's (open_journals)
        self.outage_s = outage_s
        self.room = max(1, room)
        self.interval_s = interval_s
        self.on_written = on_written
        # Work done in each write's own transaction, given the keys written (the run's claims
        # on them end there: a claim never outlives, nor ends before, its answer's record).
        self.in_write: Callable[[Any, list[str]], None] | None = None
        self.log = log
        self.error: Exception | None = None
        self._buffer: list[dict[str, Any]] = []
        self._flush_at = max(1, room // 2)  # records that start a write before the interval
        self._unjournaled: list[dict[str, Any]] = []  # added this turn, not in the journal yet
        self._keys: list[str] = []
        self._writing = 0  # records of the batch being written right now
        self._failing_since: float | None = None  # start of the current streak of failed writes
        self._warned_at = 0.0
        self._other_failures = 0
        self._stopping = False
        self._flush_now = asyncio.Event()
        self._written = asyncio.Event()  # set after each write (or failed write)
        self._fold_at = 0.0  # when the flush loop next folds abandoned journals

    @property
    def full(self) -> bool:
        """Whether to send nothing new: a room's worth unwritten, or the ledger given up on."""
        return self.error is not None or len(self._buffer) + self._writing >= self.room

    # -- journals ----------------------------------------------------------------------------
    def open_journals(self, *, keep_own: bool = True) -> AnswerJournal | None:
        """Open the ledger's journal directory (JournalUnsafeError: not private), fold the
        journals of runs that died, and open this run's journal there (``keep_own``: a
        delivery that keeps its answers durably, the batch book, needs none). Blocking."""
        self.journals = JournalDirectory.for_ledger(self.ledger, self.log)
        if self.journals is None:
            return None
        try:
            self.journals.fold_abandoned(self.ledger)
            self._fold_at = time.monotonic() + _FOLD_EVERY_S
            self.journal = AnswerJournal(self.journals) if keep_own else None
        except BaseException:
            self.close_journals(remove=True)
            raise
        return self.journal

    async def fold_abandoned(self) -> int:
        """Fold the journals of runs that died into the ledger now (their answers are then
        answered from it, not paid again); cheap when there is none: call it before taking
        over a dead run's requests. The records folded."""
        if self.journals is None or self.error is not None:
            return 0
        try:
            return await asyncio.to_thread(self.journals.fold_abandoned, self.ledger)
        except LedgerVanishedError as exc:
            self.error = self._vanished(exc)
            return 0

    def close_journals(self, *, remove: bool) -> None:
        """End this run's journal (``remove``: every answer is in the ledger) and close the
        directory."""
        try:
            if self.journal is not None:
                self.journal.close(remove=remove)
        finally:
            if self.journals is not None:
                self.journals.close()

    def add(self, record: dict[str, Any], key: str) -> None:
        if self.journal is not None and record["status"] == OK and record["attempts"]:
            # Paid for: on disk before anyone relies on it. The answers added in one turn of
            # the event loop (a grouped reply's) go in one write, at the end of that turn.
            self._unjournaled.append(record)
            if len(self._unjournaled) == 1:
                try:
                    asyncio.get_running_loop().call_soon(self.write_journal)
                except RuntimeError:  # not on an event loop: now
                    self.write_journal()
        self._buffer.append(record)
        self._keys.append(key)
        if len(self._buffer) >= self._flush_at:
            self._flush_now.set()

    def write_journal(self) -> None:
        records, self._unjournaled = self._unjournaled, []
        if records and self.journal is not None:
            self.journal.append_many(records)

    async def wait_for_room(self) -> None:
        while self.full:
            if self.error is not None:  # answers could not be kept: stop paying for more
                raise LedgerUnwritable(f"not sent: the ledger cannot be written ({self.error})")
            self._flush_now.set()
            self._written.clear()
            await self._written.wait()

    async def run(self) -> None:
        """The background writer; ends after ``stop()`` once a write in progress is done."""
        while not self._stopping:
            # A timer, not asyncio.wait_for, which on Python 3.11 can swallow a cancellation.
            timer = asyncio.get_running_loop().call_later(self.interval_s, self._flush_now.set)
            try:
                await self._flush_now.wait()
            finally:
                timer.cancel()
            self._flush_now.clear()
            if self.journals is not None and time.monotonic() >= self._fold_at:
                await self.fold_abandoned()
                self._fold_at = time.monotonic() + _FOLD_EVERY_S
            # A vanished ledger file is not written again: the journal keeps the answers.
            if (self._stopping or not self._buffer
                    or isinstance(self.error, LedgerVanishedError)):
                continue
            # Swap the buffer out here, on the loop: workers keep appending while a thread writes.
            records, self._buffer = self._buffer, []
            keys, self._keys = self._keys, []
            self._writing = len(records)
            try:
                await asyncio.to_thread(self._write, records, keys)
            except Exception as exc:  # keep the records; the next flush (or the last) retries
                self._buffer[:0] = records
                self._keys[:0] = keys
                self._failed(exc, len(records))
                if not self._stopping:
                    await asyncio.sleep(self.interval_s)
            else:
                if self._failing_since is not None:
                    self.log.warning(f"batchllm: the ledger database {self.where} is back after "
                                     f"{time.monotonic() - self._failing_since:.0f} s; "
                                     "writing the answers kept meanwhile")
                self._failing_since = None
                self._other_failures = 0
            finally:
                self._writing = 0
                self._written.set()

    @property
    def where(self) -> str:
        return redact_url(self.ledger.url)

    def _vanished(self, exc: LedgerVanishedError) -> LedgerVanishedError:
        """``exc`` saying where this run's answers are kept."""
        if self.journal is not None:
            kept = (f"this run's answers are kept in its journal {self.journal.path}, which "
                    f"the next run on a ledger at {exc.path} folds into it")
        else:
            kept = "answers written since are not kept; a rerun sends those requests again"
        return LedgerVanishedError(f"{exc}. Nothing more is sent; {kept}.", path=exc.path)

    def _failed(self, exc: Exception, records: int) -> None:
        if isinstance(exc, LedgerVanishedError):  # no waiting brings the file back
            if self.error is None:
                self.error = self._vanished(exc)
                self.log.error(f"batchllm: {self.error}")
            return
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        down_s = now - self._failing_since
        self._other_failures = 0 if database_away(exc) else self._other_failures + 1
        if self._other_failures >= _MAX_OTHER_FAILURES:
            self.error = exc
        elif down_s >= self.outage_s:
            self.error = self._unwritable(exc, down_s)
        elif now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            self.log.warning(
                f"batchllm: writing {records} ledger records to {self.where} failed; sending "
                f"pauses and the write is retried for up to {self.outage_s:g} s: "
                f"{type(exc).__name__}: {str(exc)[:300]}")

    def _unwritable(self, exc: BaseException, down_s: float) -> LedgerUnwritable:
        return LedgerUnwritable(
            f"the ledger database {self.where} could not be written for {down_s:.0f} s "
            f"(last error: {type(exc).__name__}: {str(exc)[:300]}); answered requests "
            "are kept in the journal and written by the next run")

    def gave_up(self) -> Exception | None:
        """Why the writer gave up on the database (``error``), if it has: what else writes
        there (the run's claims) stops then too."""
        return self.error

    def stop(self) -> None:
        self._stopping = True
        self._flush_now.set()

    def flush_remaining(self, *, within_s: float | None = None) -> None:
        """The last write, after every worker and ``run()`` have stopped (blocking); retried
        while the database is away, for ``within_s`` (the outage bound by default)."""
        self.write_journal()
        if isinstance(self.error, LedgerVanishedError):
            raise self.error
        records, self._buffer = self._buffer, []
        keys, self._keys = self._keys, []
        if not records:
            self._check_file()
            return
        limit = self.outage_s if within_s is None else within_s
        if self._failing_since is not None:
            limit = max(0.0, limit - (time.monotonic() - self._failing_since))
        # On a stop (within_s) no single round trip may wait past the stop's own bound.
        round_trip_cap = None if within_s is None else max(0.5, within_s)
        begun = time.monotonic()
        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_after_delay(limit),
                wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
                retry=tenacity.retry_if_exception(database_away), reraise=True,
            ):
                with attempt, round_trips_at_most(round_trip_cap):
                    self._write(records, keys)
        except LedgerVanishedError as exc:
            self.error = self._vanished(exc)
            raise self.error from None
        except Exception as exc:
            exc.add_note(f"batchllm: the ledger database {self.where} could not be written; the "
                         f"{len(records)} outcomes not written are answered from the journal "
                         "by the next run")
            if self.error is not None:  # the run gave up on the database already: say why
                raise self.error from exc
            if database_away(exc):
                # The outage outlasted its bound here, in the last write: a run whose every
                # request was sent (claimed before the database went) gets no further than
                # this, and it fails as the background writer would have failed it.
                started = self._failing_since if self._failing_since is not None else begun
                self.error = self._unwritable(exc, time.monotonic() - started)
                raise self.error from exc
            raise

    def _check_file(self) -> None:
        """The run's last word: answers written to a ledger file that has vanished since are
        not kept, and the run must not report success (the journal then stays)."""
        try:
            check_ledger_file(self.ledger.engine)
        except LedgerVanishedError as exc:
            self.error = self._vanished(exc)
            raise self.error from None

    def _write(self, records: list[dict[str, Any]], keys: list[str]) -> None:
        in_write = self.in_write
        self.ledger.upsert(records, None if in_write is None else
                           (lambda conn: in_write(conn, keys)))
        # After the commit: a file deleted before it took these records where no one sees them.
        check_ledger_file(self.ledger.engine)
        self.on_written(keys)
