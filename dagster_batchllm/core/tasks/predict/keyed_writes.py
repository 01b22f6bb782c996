"""Ledger writes of :func:`~.keyed.score_keyed` on a thread, while the next batch is
scored.

A Spark task's batches come one after another: with the write on the task's own thread, each
batch waits for SQLite (a few microseconds per row, and the other workers' write locks, which
SQLite waits out by sleeping). Here the write of batch k runs while batch k+1 is transferred and
scored. ``drain`` waits until everything handed over is written and raises the first failure:
the task calls it before it ends, so a task that succeeds has every prediction in the ledger
and a retried or rerun task scores none of them again. What a crash loses before the write
(at most ``max_pending`` batches and the one being written) is scored again by the retry:
in-process models cost nothing per call, so no journal is kept.

While a batch's records wait, its answers are held here too: a later batch of the same task
asking for the same key takes the answer instead of scoring it again.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import tenacity

from ...ledger.table import Ledger
from ...ledger.writer import database_away

MISSING = object()


class BackgroundWrites:
    """One writer thread for one task's batches (one call: one scope and partition)."""

    def __init__(self, ledger: Ledger, *, outage_s: float, max_pending: int = 4):
        self.ledger = ledger
        self.outage_s = outage_s
        # Bounded: a slow database holds the task back instead of piling records up in memory.
        self._queue: queue.Queue[tuple[list[dict[str, Any]], list[str]] | None] = \
            queue.Queue(maxsize=max_pending)
        self._answers: dict[str, Any] = {}  # key -> value of an ok record queued, not written
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="batchllm-ledger-writes",
                                        daemon=True)
        self._thread.start()

    def answers_for(self, keys: Any) -> dict[str, Any]:
        """The values of queued ok records for any of ``keys``."""
        with self._lock:
            if not self._answers:
                return {}
            answers = self._answers
            return {key: answers[key] for key in keys if key in answers}

    def put(self, records: list[dict[str, Any]], answers: dict[str, Any]) -> None:
        """Write ``records`` soon; ``answers``: the values of their ok records, by key."""
        self._raise_if_failed()
        with self._lock:
            self._answers.update(answers)
        self._queue.put((records, list(answers)))

    def drain(self) -> None:
        """Block until every record handed over is written; raise the first write's failure."""
        self._queue.join()
        self._raise_if_failed()

    def close(self) -> None:
        """Drain, then end the thread (also when draining raises)."""
        try:
            self.drain()
        finally:
            self._queue.put(None)
            self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"batchllm: predictions could not be written to the ledger: {self._error}"
            ) from self._error

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            # Everything queued meanwhile in the same transaction: fewer waits for the other
            # workers' write locks, which SQLite sleeps out in steps of milliseconds.
            while items[-1] is not None:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is None
            batches = [item for item in items if item is not None]
            try:
                if batches and self._error is None:  # after a failure the task fails
                    records = batches[0][0] if len(batches) == 1 else \
                        [r for records, _ in batches for r in records]
                    write_records(self.ledger, records, self.outage_s)
            except BaseException as exc:  # handed to the task's thread by drain() / put()
                self._error = exc
            finally:
                with self._lock:
                    for _, keys in batches:
                        for key in keys:
                            self._answers.pop(key, None)
                for _ in items:
                    self._queue.task_done()
            if stop:
                return


def write_records(ledger: Ledger, records: list[dict[str, Any]], outage_s: float) -> None:
    """One upsert; a database that is away (a restart, a cut) is waited for up to
    ``outage_s``, as the engine's writer does, and then the batch fails (the task's retry
    scores what was not written)."""
    for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_delay(outage_s),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            retry=tenacity.retry_if_exception(database_away), reraise=True):
        with attempt:
            ledger.upsert(records)
