"""Writing a run's outcomes to the ledger in batches, while the run goes on.

Writes happen on a thread so the event loop keeps sending; a batch is written at half the
writer's room so one half is written while the other fills. ``full`` tells the run to send
nothing new while a room's worth of answers is unwritten: requests in flight plus unwritten
answers are then all that a crash can make a rerun pay for twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .ledger import Ledger

_MAX_WRITE_FAILURES = 5  # consecutive failed writes before the run stops sending


class LedgerUnwritable(Exception):
    """Ledger writes keep failing: the run stops sending (infer() then raises the error)."""


class LedgerWriter:
    def __init__(self, ledger: Ledger, *, room: int, interval_s: float,
                 on_written: Callable[[list[str]], None], log: Any):
        """``on_written(keys)`` runs on the writing thread after each successful write."""
        self.ledger = ledger
        self.room = max(1, room)
        self.interval_s = interval_s
        self.on_written = on_written
        self.log = log
        self.error: Exception | None = None
        self._buffer: list[dict[str, Any]] = []
        self._keys: list[str] = []
        self._writing = 0  # records of the batch being written right now
        self._failures = 0
        self._stopping = False
        self._flush_now = asyncio.Event()
        self._written = asyncio.Event()  # set after each write (or failed write)

    @property
    def full(self) -> bool:
        return len(self._buffer) + self._writing >= self.room

    def add(self, record: dict[str, Any], key: str) -> None:
        self._buffer.append(record)
        self._keys.append(key)
        if len(self._buffer) >= max(1, self.room // 2):
            self._flush_now.set()

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
            try:
                await asyncio.wait_for(self._flush_now.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass
            self._flush_now.clear()
            if self._stopping or not self._buffer:
                continue
            # Swap the buffer out here, on the loop: workers keep appending while a thread writes.
            records, self._buffer = self._buffer, []
            keys, self._keys = self._keys, []
            self._writing = len(records)
            try:
                await asyncio.to_thread(self._write, records, keys)
            except Exception as exc:  # keep the records; the next flush (or the last) retries
                self.log.warning(f"batchllm: writing {len(records)} ledger records failed, "
                                 f"will retry: {type(exc).__name__}: {exc}")
                self._failures += 1
                if self._failures >= _MAX_WRITE_FAILURES:
                    self.error = exc
                self._buffer[:0] = records
                self._keys[:0] = keys
                if not self._stopping:
                    await asyncio.sleep(self.interval_s)
            else:
                self._failures = 0
            finally:
                self._writing = 0
                self._written.set()

    def stop(self) -> None:
        self._stopping = True
        self._flush_now.set()

    def flush_remaining(self) -> None:
        """The last write, after every worker and ``run()`` have stopped (blocking)."""
        records, self._buffer = self._buffer, []
        keys, self._keys = self._keys, []
        if records:
            self._write(records, keys)

    def _write(self, records: list[dict[str, Any]], keys: list[str]) -> None:
        self.ledger.upsert(records)
        self.on_written(keys)
