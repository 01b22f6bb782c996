"""How request items reach a model: the :class:`Delivery` interface, declared.

The engine hands a delivery request items and gets back each one's reply or final error; what
happens in between (which endpoint, how many attempts, how long to wait, whether the request
goes into a batch file) is the delivery's business. A new way of sending is a new subclass,
not branches through the run, and the engine reads the optional capabilities below as the
plain attributes they are: a delivery that has none keeps the defaults.

:class:`DelegatingDelivery` is the base of a delivery that wraps another (grouping rows into
requests, falling back to float vectors, routing in-process models): it passes every call and
capability it does not change to the delivery it wraps.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from ..errors import RowError

if TYPE_CHECKING:
    from ..ledger.writer import LedgerWriter
    from ..requests import Completion, RowRequest


class Attempts:
    """What one request's attempts did: how many, how many were sent, the last endpoint, the
    tokens billed. The engine keeps it, so it knows them also when the request fails."""

    __slots__ = ("count", "sent", "endpoint", "spent")

    def __init__(self) -> None:
        self.count = 0
        self.sent = 0
        self.endpoint: str | None = None
        self.spent = 0


class Delivery:
    """Gets request items to a model. Subclasses implement :meth:`capacity` and :meth:`send`
    or :meth:`send_many` (each defaults to the other)."""

    #: Items a worker best hands over at once (:meth:`send_many`): a grouped request's worth,
    #: or a batch file's parcel. One: each item on its own (:meth:`send`).
    items_per_send: int = 1
    #: Whether answers are durable before the engine sees them (the batch book holds them), so
    #: the run keeps no journal of its own.
    keeps_answers: bool = False
    #: Keys whose paid answers the delivery holds already (a batch just collected): the run
    #: hands those to it without asking the ledger first.
    held_answers: Container[str] = frozenset()
    #: Requests sent and waiting for their reply now (None: the delivery cannot say, e.g. a
    #: batch file's lines): what a stop cancels, and what a rerun may pay for again.
    requests_in_flight: int | None = None

    def capacity(self) -> int:
        """Requests it can usefully have outstanding at once (sizes the run's workers)."""
        raise NotImplementedError

    def refusal(self, request: RowRequest) -> RowError | None:
        """Why ``request`` cannot be delivered at all, before it waits for anything; or None."""
        return None

    async def open(self, writer: LedgerWriter) -> None:
        """Before the first item; ``writer`` is the run's: a delivery that sends over the
        network waits while it holds a room's worth of unwritten answers."""

    async def close(self) -> None:
        """After the last item, also when the run stops."""

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        """The reply to ``request``, or its final ``RowError``; ``attempts`` counts as it goes."""
        (result,) = await self.send_many([request], [attempts])
        if isinstance(result, RowError):
            raise result
        return result

    async def send_many(self, requests: list[RowRequest], attempts: list[Attempts]
                        ) -> list[Completion | RowError]:
        """Each request's reply or final error, in order."""
        results: list[Completion | RowError] = []
        for request, tried in zip(requests, attempts, strict=True):
            try:
                results.append(await self.send(request, tried))
            except RowError as exc:
                results.append(exc)
        return results

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Figures per endpoint, for the run's stats."""
        return {}


class DelegatingDelivery(Delivery):
    """A delivery in front of ``inner``: everything it does not change is ``inner``'s."""

    def __init__(self, inner: Delivery):
        self.inner = inner

    @property
    def keeps_answers(self) -> bool:  # type: ignore[override]
        return self.inner.keeps_answers

    @property
    def held_answers(self) -> Container[str]:  # type: ignore[override]
        return self.inner.held_answers

    @property
    def requests_in_flight(self) -> int | None:  # type: ignore[override]
        return self.inner.requests_in_flight

    def capacity(self) -> int:
        return self.inner.capacity()

    def refusal(self, request: RowRequest) -> RowError | None:
        return self.inner.refusal(request)

    async def open(self, writer: LedgerWriter) -> None:
        await self.inner.open(writer)

    async def close(self) -> None:
        await self.inner.close()

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        return await self.inner.send(request, attempts)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.inner.snapshot()


__all__ = ["Attempts", "DelegatingDelivery", "Delivery"]
