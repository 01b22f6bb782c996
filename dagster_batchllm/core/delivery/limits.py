"""Token budgets and rate limits: reserve before a request, settle from the reply's usage.

Both count *before* the call, so no amount of concurrency can overrun them: a request that does
not fit is not sent. Reservations are upper bounds (see :mod:`dagster_batchllm.core.requests`);
settling replaces them by the server's ``usage`` so the unused part becomes available again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import TYPE_CHECKING

from ..errors import DeferredError

if TYPE_CHECKING:
    from ..requests import RowRequest
    from ..settings import InferenceSettings


class TokenBudget:
    """A cap on the tokens one call may spend (prompt + completion, as the server counts them)."""

    def __init__(self, total: int):
        if total < 0:
            raise ValueError("token_budget must not be negative")
        self.total = total
        self.spent = 0
        self.reserved = 0
        self._changed: asyncio.Event | None = None

    @property
    def remaining(self) -> int:
        return self.total - self.spent - self.reserved

    @property
    def idle(self) -> bool:
        """Nothing reserved: no settlement to wait for (what does not fit now never will)."""
        return self.reserved == 0

    def try_reserve(self, tokens: int) -> bool:
        if tokens > self.remaining:
            return False
        self.reserved += tokens
        return True

    def settle(self, reserved: int, actual: int) -> None:
        """Replace a reservation by what the reply used (0 when nothing was billed)."""
        self.reserved -= reserved
        self.spent += actual
        self._notify()

    async def wait_for_settlement(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.clear()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()


class CostBudget(TokenBudget):
    """A cap on the USD one call may spend: each request reserves the most it can cost (its
    prompt's bound and max_tokens at the dearest price it may get) and settles to what its
    reply cost. So what was paid never passes the cap, however many requests are in flight."""

    def __init__(self, total_usd: float):
        if not total_usd >= 0:
            raise ValueError("budget_usd must not be negative")
        super().__init__(0)
        self.total = float(total_usd)
        self.in_flight = 0
        #: The budget the call's plan says sends every row (``Plan.budget_needed_usd``), which
        #: a deferral names; None where the call was not planned.
        self.needed_usd: float | None = None

    def sends_every_row(self) -> str:
        """What a deferral adds: the budget that would have sent every row, where known."""
        if self.needed_usd is None or self.needed_usd <= self.total:
            return ""
        return f" (a budget of at least ${self.needed_usd:.6f} sends every row; see plan())"

    @property
    def idle(self) -> bool:
        return self.in_flight == 0  # (float reservations need not add back up to 0.0)

    def try_reserve(self, usd: float) -> bool:  # type: ignore[override]
        if self.spent + self.reserved + usd > self.total:
            return False
        self.reserved += usd
        self.in_flight += 1
        return True

    def settle(self, reserved: float, actual: float) -> None:  # type: ignore[override]
        self.in_flight -= 1
        self.reserved = self.reserved - reserved if self.in_flight else 0.0
        self.spent += actual
        self._notify()


class _Entry:
    __slots__ = ("at", "amount", "settled")

    def __init__(self, at: float, amount: int):
        self.at = at
        self.amount = amount
        self.settled = False


class SlidingWindowLimiter:
    """At most ``limit`` units in any window of ``window_s`` seconds, as the server counts them.

    A request counts from the moment it is admitted (``take``, before it is sent) until
    ``window_s`` after its reply came back (``settle``). The server saw it arrive somewhere in
    between, so however sending, the network or the server's queue delay and bunch up requests,
    no window of arrivals at the server holds more than ``limit``. (Counting a window from the
    send time alone does not: a burst whose sending or delivery was slow still arrives inside
    the window of the next burst.) The price is that a window effectively lasts a latency longer.

    A sliding log rather than a token bucket: a bucket with any burst allowance lets through up
    to ``limit + burst`` in some window, and users read ``tokens_per_minute`` as a hard ceiling.
    """

    def __init__(self, limit: float, window_s: float, clock=time.monotonic):
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._entries: deque[_Entry] = deque()  # settled entries, in settle (= time) order
        self._used = 0  # what the settled entries still in the window count
        self._in_flight = 0  # entries taken and not settled yet
        self._in_flight_used = 0
        # Whether an empty window admits one request larger than the limit (see below); off
        # while other runs' recent sending holds part of the endpoint's window.
        self.lone_request_ok = True

    def _evict(self, now: float) -> None:
        horizon = now - self.window_s
        entries = self._entries
        while entries and entries[0].at <= horizon:
            self._used -= entries.popleft().amount

    @property
    def used(self) -> float:
        """Units counted in the window now (in-flight requests included)."""
        self._evict(self._clock())
        return self._used + self._in_flight_used

    def take(self, amount: int) -> _Entry:
        entry = _Entry(self._clock(), amount)
        self._in_flight += 1
        self._in_flight_used += amount
        return entry

    def settle(self, entry: _Entry, actual: int | None = None) -> None:
        """The reply came back: from now on the entry counts ``actual`` (what the server
        reported; ``None`` keeps what was taken) for one more window."""
        if entry.settled:
            return
        entry.settled = True
        self._in_flight -= 1
        self._in_flight_used -= entry.amount
        if actual is not None:
            entry.amount = actual
        entry.at = self._clock()
        self._entries.append(entry)
        self._used += entry.amount

    def seconds_until_fits(self, amount: int) -> float:
        now = self._clock()
        self._evict(now)
        excess = self._used + self._in_flight_used + amount - self.limit
        if excess <= 0 or (self.lone_request_ok and not self._entries and not self._in_flight):
            # An empty window admits any single request: a share smaller than one request
            # (many runs on one endpoint) must slow a run down, not stall it forever.
            return 0.0
        freed = 0
        for entry in self._entries:
            freed += entry.amount
            if freed >= excess:
                return max(0.0, entry.at + self.window_s - now)
        # Requests in flight hold the rest; a reply wakes the pool's waiters.
        return self.window_s


def cost_bound(settings: InferenceSettings, request: RowRequest, *, batch: bool) -> float:
    """The most ``request`` can cost: its prompt's strict token bound and its max_tokens at
    the dearest price of its model (inf where the model has no price and the request has
    tokens)."""
    prompt = max(0, request.reserve_tokens - request.max_tokens)
    if not (prompt or request.max_tokens):
        return 0.0  # (an in-process model's prediction)
    price = settings.price_at(request.model)
    if price is None:
        return math.inf
    return price.upper_bound(prompt, request.max_tokens, batch=batch)


def charge_submission(tokens: TokenBudget | None, usd: CostBudget | None,
                      settings: InferenceSettings, request: RowRequest) -> DeferredError | None:
    """Batch mode's budgets: a line in a provider's file cannot be taken back, so it is
    charged for good when submitted, its token bound and (budget_usd) its most possible cost
    at the batch price; the error that defers it where either does not fit."""
    if tokens is not None:
        if not tokens.try_reserve(request.reserve_tokens):
            return DeferredError(
                f"the token budget ({tokens.total}) has {tokens.remaining} tokens left, this "
                f"request may need {request.reserve_tokens}; a later call will submit it")
        tokens.settle(request.reserve_tokens, request.reserve_tokens)
    if usd is not None:
        bound = cost_bound(settings, request, batch=True)
        if not usd.try_reserve(bound):
            if tokens is not None:
                tokens.spent -= request.reserve_tokens
            return DeferredError(
                f"the budget (${usd.total:.6f}) has ${max(0.0, usd.remaining):.6f} left, "
                f"this line may cost up to ${bound:.6f} at the batch price; a later call will "
                f"submit it{usd.sends_every_row()}")
        usd.settle(bound, bound)
    return None


def refund_submissions(tokens: TokenBudget | None, usd: CostBudget | None,
                       settings: InferenceSettings, requests: list[RowRequest]) -> None:
    """Give back what :func:`charge_submission` charged for lines this call did not submit
    after all (another run's batch has them)."""
    if tokens is not None:
        tokens.spent -= sum(request.reserve_tokens for request in requests)
    if usd is not None:
        usd.spent -= sum(cost_bound(settings, request, batch=True) for request in requests)
