"""Token budgets and rate limits: reserve before a request, settle from the reply's usage.

Both count *before* the call, so no amount of concurrency can overrun them: a request that does
not fit is not sent. Reservations are upper bounds (see ``prompts``); settling replaces them by the
server's ``usage`` so the unused part becomes available again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


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


class _Entry:
    __slots__ = ("at", "amount")

    def __init__(self, at: float, amount: int):
        self.at = at
        self.amount = amount


class SlidingWindowLimiter:
    """At most ``limit`` units in any window of ``window_s`` seconds, counted at send time.

    A sliding log rather than a token bucket: a bucket with any burst allowance lets through up
    to ``limit + burst`` in some window, and users read ``tokens_per_minute`` as a hard ceiling.
    """

    def __init__(self, limit: float, window_s: float, clock=time.monotonic):
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._entries: deque[_Entry] = deque()
        self._used = 0

    def _evict(self, now: float) -> None:
        horizon = now - self.window_s
        entries = self._entries
        while entries and entries[0].at <= horizon:
            entry = entries.popleft()
            self._used -= entry.amount
            entry.at = float("-inf")  # marks it evicted, so a late settle() leaves _used alone

    def take(self, amount: int) -> _Entry:
        entry = _Entry(self._clock(), amount)
        self._entries.append(entry)
        self._used += amount
        return entry

    def settle(self, entry: _Entry, actual: int) -> None:
        """Correct an entry to the amount the server reported (if it is still in the window)."""
        self._evict(self._clock())
        if entry.at != float("-inf"):
            self._used += actual - entry.amount
        entry.amount = actual

    def seconds_until_fits(self, amount: int) -> float:
        now = self._clock()
        self._evict(now)
        excess = self._used + amount - self.limit
        if excess <= 0 or not self._entries:
            # An empty window admits any single request: a share smaller than one request
            # (many runs on one endpoint) must slow a run down, not stall it forever.
            return 0.0
        freed = 0
        for entry in self._entries:
            freed += entry.amount
            if freed >= excess:
                return max(0.0, entry.at + self.window_s - now)
        return self.window_s
