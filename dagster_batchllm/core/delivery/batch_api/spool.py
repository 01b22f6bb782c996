"""The batch delivery's plumbing: gathering workers' parcels into book calls, open batch files,
and the one deferred error that every row of a file shares.

A batch pass settles 100,000s of rows with no network in between, so what it does per row is
what its CPU is: these keep it to list appends and slices (one future per parcel of rows, one
thread call per few thousand keys, one error object and one error string per file).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import DeferredError

#: Rows deferred into a file not yet submitted say this, then the submission id; once the batch
#: is created the message is rewritten to name the provider's batch id.
NOT_YET_SUBMITTED = "waiting for batch (file "
_LATER = "a later run collects its answers, nothing is submitted again"


class SharedDeferred(DeferredError):
    """A deferral that many rows share (those of one batch file, or those waiting for one
    batch): its cell text is built once, so the rows' error cells are one string, not one
    string each. ``kept_by_delivery``: the rows' lines are this run's, in the book."""

    def __init__(self, message: str, *, kept_by_delivery: bool = False):
        super().__init__(message)
        self._cell = super().as_cell()
        self.kept_by_delivery = kept_by_delivery

    def as_cell(self) -> str:
        return self._cell


def waiting_for(name: str, status: str) -> SharedDeferred:
    return SharedDeferred(f"waiting for batch {name} ({status}); {_LATER}")


class Gatherer:
    """Gathers the parcels of items that many workers hand in into one blocking call (on a
    thread) per ``size`` items or per turn of the event loop; each worker awaits the results
    of its own parcel (``call`` returns one result per item, in order). Calls run one at a
    time, in order, so a result also says every item handed in before it is done."""

    def __init__(self, call: Callable[[list[Any]], list[Any]], size: int):
        self.call, self.size = call, size
        self._items: list[Any] = []
        self._parcels: list[tuple[asyncio.Future, int, int]] = []
        self._scheduled = False
        self._turn = asyncio.Lock()
        self._running: set[asyncio.Task] = set()

    async def submit(self, items: list[Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        start = len(self._items)
        self._items.extend(items)
        self._parcels.append((future, start, len(self._items)))
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
        items, parcels = self._items, self._parcels
        self._items, self._parcels = [], []
        task = asyncio.get_running_loop().create_task(self._run(items, parcels))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, items: list[Any], parcels: list[tuple[asyncio.Future, int, int]]
                   ) -> None:
        try:
            async with self._turn:
                found = await asyncio.to_thread(self.call, items)
        except Exception as exc:  # every waiting worker gets it (the engine makes it row errors)
            for future, _, _ in parcels:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for future, _, _ in parcels:
                future.cancel()
            raise
        for future, start, end in parcels:
            if not future.done():
                future.set_result(found[start:end])


class Spool:
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
        #: what every row whose line is in this file is deferred with (the book keeps it)
        self.deferred = SharedDeferred(f"{NOT_YET_SUBMITTED}{self.submission_id}); {_LATER}",
                                       kept_by_delivery=True)


__all__ = ["NOT_YET_SUBMITTED", "Gatherer", "SharedDeferred", "Spool", "waiting_for"]
