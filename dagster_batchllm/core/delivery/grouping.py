"""Several rows in one request: embeddings' ``input`` arrays, a scoring model's ``/invocations``.

The engine still hands its delivery one item (row request) at a time, keyed, deduplicated,
budgeted and written to the ledger on its own. :class:`GroupingDelivery` sits in front of the
delivery that sends one request: it gathers the items that workers hand it at about the same
moment into groups (per model, up to the task's ``items_per_request`` and ``max_request_tokens``,
or whatever arrived within ``linger_s``), sends each group as one request through the inner
delivery (so pool, limits, breakers and the retry loop apply to it as to any request), and hands
each waiting item its own part of the reply. A caller with several items at hand
(``send_many``: the run's worker hands over ``items_per_send`` at once) waits on one future for
all of them, not one per item.

A group that fails for a reason that may belong to one of its items (a 400: too long, not valid
text) is split in halves and each half sent again, down to single items; so only the bad item
fails, with the server's reason, and the others are answered. A failure that belongs to the
request as a whole (a timeout, 5xx after its retries, an unreachable endpoint) fails every item
of the group with that reason.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ..errors import ErrorType, InternalError, RowError
from ..requests import Completion, RowRequest
from .base import Attempts, DelegatingDelivery

# Errors a single item may cause; a group failing with one of them is split to find it.
_ITEM_ERRORS = frozenset({
    ErrorType.INVALID_INPUT, ErrorType.BAD_REQUEST, ErrorType.CONTEXT_LENGTH_EXCEEDED,
    ErrorType.REQUEST_TOO_LARGE, ErrorType.MALFORMED_RESPONSE,
})


class GroupedTask(Protocol):
    """What a task that puts several items in one request adds to :class:`~.tasks.base.Task`."""

    #: Most items in one request.
    items_per_request: int
    #: Most ``reserve_tokens`` summed over one request's items (None: no cap beyond the count).
    max_request_tokens: int | None

    def group_request(self, items: list[RowRequest]) -> RowRequest:
        """One request carrying ``items`` (all of one model): its body is what is sent, its
        ``reserve_tokens`` the items' sum; its key is not used."""
        ...

    def split_reply(self, reply: Completion, items: list[RowRequest]
                    ) -> list[Completion | RowError]:
        """One Completion (or the item's error) per item, in order. Each Completion's
        ``content`` is what the ledger keeps for the item and ``Task.value`` reads back; its
        tokens are the item's share. Raises ``RowError`` when the reply as a whole does not
        fit the items (the wrong number of results): every item fails with it."""
        ...


class _Waiter:
    """One ``send_many`` call waiting: a result per item, one future for them all."""

    __slots__ = ("future", "results", "left")

    def __init__(self, future: asyncio.Future, n: int):
        self.future = future
        self.results: list[Completion | RowError | None] = [None] * n
        self.left = n

    def settle(self, index: int, result: Completion | RowError) -> None:
        if self.future.done():  # its caller was cancelled
            return
        self.results[index] = result
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.results)


# Per item of a group: (its waiter, its index there, its Attempts)
_Slot = tuple[_Waiter, int, Any]


class _Group:
    __slots__ = ("model", "items", "waiters", "tokens", "timer")

    def __init__(self, model: str):
        self.model = model
        self.items: list[RowRequest] = []
        self.waiters: list[_Slot] = []
        self.tokens = 0
        self.timer: asyncio.TimerHandle | None = None


class GroupingDelivery(DelegatingDelivery):
    """A :class:`~.delivery.Delivery` that sends items in groups through ``inner``."""

    def __init__(self, inner: Any, task: GroupedTask, *, linger_s: float = 0.005):
        """``inner``: the delivery that sends one (grouped) request, with its retries;
        ``linger_s``: how long a group that is not full waits for more items before it goes."""
        if task.items_per_request < 1:
            raise ValueError("items_per_request must be at least 1")
        super().__init__(inner)
        self.task = task
        self.linger_s = linger_s
        self._filling: dict[str, _Group] = {}
        self._sending: set[asyncio.Task] = set()

    # -- what grouping changes of the delivery it wraps ---------------------------------------
    def capacity(self) -> int:
        """Items, not requests: the run keeps enough workers to fill every request."""
        return self.inner.capacity() * self.task.items_per_request

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        (result,) = await self.send_many([request], [attempts])
        if isinstance(result, RowError):
            raise result
        return result

    async def close(self) -> None:
        for group in self._filling.values():
            if group.timer is not None:
                group.timer.cancel()
            _fail_waiters(group.waiters, asyncio.CancelledError())
        self._filling.clear()
        sending, self._sending = self._sending, set()
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)
        await self.inner.close()

    @property
    def items_per_send(self) -> int:
        """How many items a caller best hands over at once (``send_many``): a request's."""
        return self.task.items_per_request

    # -- gathering ---------------------------------------------------------------------------
    async def send_many(self, requests: list[RowRequest], attempts: list[Any]
                        ) -> list[Completion | RowError]:
        """The reply (or the final error) of each of ``requests``, in order; each item's
        ``attempts`` counts as for ``send``."""
        if not requests:
            return []
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), len(requests))
        cap = self.task.max_request_tokens
        per_request = self.task.items_per_request
        filling = self._filling
        for index, request in enumerate(requests):
            group = filling.get(request.model)
            if group is not None and cap is not None and group.items \
                    and group.tokens + request.reserve_tokens > cap:
                self._dispatch(group)
                group = None
            if group is None:
                group = filling[request.model] = _Group(request.model)
                group.timer = loop.call_later(self.linger_s, self._dispatch, group)
            group.items.append(request)
            group.waiters.append((waiter, index, attempts[index]))
            group.tokens += request.reserve_tokens
            if len(group.items) >= per_request:
                self._dispatch(group)
        return await waiter.future

    def _dispatch(self, group: _Group) -> None:
        if self._filling.get(group.model) is group:
            del self._filling[group.model]
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if not group.items:
            return
        task = asyncio.get_running_loop().create_task(
            self._deliver(group.items, group.waiters))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        group.items, group.waiters = [], []

    # -- sending -----------------------------------------------------------------------------
    async def _deliver(self, items: list[RowRequest], waiters: list[_Slot], *,
                       resend: bool = False) -> None:
        """Send ``items`` as one request and settle every waiter; split on an item's error.
        ``resend``: a half of a rejected group, whose items were counted when first sent."""
        attempts = Attempts()
        try:
            reply = await self.inner.send(self.task.group_request(items), attempts)
            parts = self.task.split_reply(reply, items)
            if len(parts) != len(items):
                raise InternalError(f"the task split a reply of {len(items)} items into "
                                    f"{len(parts)} parts")
        except asyncio.CancelledError:
            _fail_waiters(waiters, asyncio.CancelledError())
            raise
        except RowError as exc:
            if len(items) > 1 and exc.error_type in _ITEM_ERRORS:
                _count(waiters, attempts, resend)
                half = len(items) // 2
                await asyncio.gather(
                    self._deliver(items[:half], waiters[:half], resend=True),
                    self._deliver(items[half:], waiters[half:], resend=True))
                return
            _count(waiters, attempts, resend)
            _fail_waiters(waiters, exc)
            return
        except Exception as exc:  # a bug in a task's split must not hang its items
            _count(waiters, attempts, resend)
            _fail_waiters(waiters, InternalError(f"{type(exc).__name__}: {exc}"))
            return
        _count(waiters, attempts, resend)
        for (waiter, index, item_attempts), item, part in zip(waiters, items, parts,
                                                              strict=True):
            if not isinstance(part, RowError):
                # what the budget settles to: the item's usage, or its bound when not told
                item_attempts.spent += (part.prompt_tokens + part.completion_tokens
                                        if part.usage_reported else item.reserve_tokens)
            waiter.settle(index, part)


def _count(waiters: list[_Slot], attempts: Any, resend: bool) -> None:
    """Give each item the group's endpoint, and its attempts and HTTP requests once, on the
    first item, so the run's ``requests`` and ``retries`` figures count requests, not items;
    the other items count one attempt (they were sent, so their answers are journaled).

    A half of a rejected group (``resend``) is sent again to find the bad item, not retried:
    its request counts in ``requests``, and only its own retries (attempts past its first)
    in the items' attempts, which the run reads as ``retries``. Else one bad row among 72
    would show as some 140 retries."""
    first_counts = attempts.count - 1 if resend else attempts.count
    others_count = 0 if resend else min(attempts.count, 1)
    for i, (_waiter, _index, item_attempts) in enumerate(waiters):
        item_attempts.count += max(0, first_counts) if i == 0 else others_count
        item_attempts.endpoint = attempts.endpoint
        if i == 0:
            item_attempts.sent += attempts.sent


def _fail_waiters(waiters: list[_Slot], exc: BaseException) -> None:
    for waiter, index, _attempts in waiters:
        if isinstance(exc, asyncio.CancelledError):
            waiter.future.cancel()
        else:
            waiter.settle(index, exc)
