"""The endpoint pool: least-loaded routing, per-endpoint caps and rate limits, circuit breakers.

Every request asks the pool for a lease on one endpoint and gives it back with the outcome. The
pool never lets an endpoint hold more than ``max_concurrency`` leases, never admits a request its
rate limits cannot take, and stops routing to an endpoint that keeps failing until a cool-down has
passed and a single probe request has succeeded.

Prefix affinity: a request with a prefix key (its prompt's long head, see
``prompts.prefix_key``) goes to the endpoint that took that key last, while that one has room,
its limits admit the request and it has not failed since; else to the least-loaded, which then
owns the key. So the head stays in one endpoint's prefix cache rather than being computed on
each, and a failing endpoint's keys move to the others. While every endpoint is busy, a freed
slot would otherwise go to whichever request asks next, moving its key there: so a slot freed
on an endpoint wakes a waiting request whose key that endpoint owns, and a request whose owner
is full waits for it rather than take a slot already promised to a woken waiter. Only free
slots nobody is woken for are taken from under another owner, so no capacity idles.

Failing endpoints (see :mod:`.endpoint_state`): a caller that passes a ``FailingBound`` to
:meth:`EndpointPool.acquire` gets ``EndpointFailingError`` once every endpoint serving the model
has answered nothing usable for that long, also while it waits for a cool-down or a probe's
slot: the breaker's probing never stretches the bound.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..errors import (
    EndpointFailingError,
    NoHealthyEndpointError,
    RequestTooLargeError,
    UnsupportedModelError,
)
from ..settings import EndpointSpec
from .endpoint_state import (
    EndpointState,
    FailingBound,
    failing_deadline,
    failing_error,
    probes_early,
)

# A waiter re-checks at least this often, so a lost wake-up can delay a request but never hang it.
_MAX_WAIT_S = 1.0
# Prefix keys remembered per model, least recently used forgotten first: a few hundred KB.
_MAX_PREFIX_KEYS = 4096
# Waiters a freed slot looks through for one whose key its endpoint owns (then the first).
_MATCH_WAITERS = 16


def _wake_one(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)  # a timer's: no slot promised


@dataclass(slots=True)
class Lease:
    endpoint: EndpointState
    request_entry: object | None
    token_entry: object | None
    probe: bool


@dataclass(frozen=True)
class Allocation:
    """A run's part of each endpoint while other runs use them too (see ``coordination``).

    ``runs``: live runs per endpoint, each of which gets 1/N of its concurrency and rate
    limits; ``rate_limits``: per endpoint, (requests, tokens) limits that refine the share, each
    None or (limit per window, whether it is the full fair share); ``capacities``: per endpoint,
    the requests this run may have in flight, which refine the share too (0 holds sending until
    the others' claims leave room). Endpoints not named are the run's whole.
    """

    runs: Mapping[str, int] = field(default_factory=dict)
    rate_limits: Mapping[str, tuple] = field(default_factory=dict)
    capacities: Mapping[str, int] = field(default_factory=dict)


class EndpointPool:
    """Routes requests over endpoints; one instance is shared by all rows of a call."""

    def __init__(
        self,
        specs: tuple[EndpointSpec, ...],
        *,
        failure_threshold: int = 5,
        cooldown_s: float = 10.0,
        clock=time.monotonic,
        price_of: Callable[[str, str], Any] | None = None,
    ):
        """``price_of(model, endpoint name)``: the model's Price there (None: not priced,
        ranked as free), so of the endpoints with room the cheaper one goes first."""
        self._clock = clock
        self.endpoints = [
            EndpointState(s, failure_threshold=failure_threshold, cooldown_s=cooldown_s,
                          clock=clock)
            for s in specs
        ]
        self._by_model: dict[str, list[EndpointState]] = {}
        for state in self.endpoints:
            for model in state.spec.served_models:
                self._by_model.setdefault(model, []).append(state)
        # Per model, the requests waiting for a slot: (future, prefix key).
        self._waiters: dict[str, deque[tuple[asyncio.Future, int | None]]] = {
            m: deque() for m in self._by_model}
        # Per model, waiters woken for a freed slot that have not yet run to take it.
        self._promised: dict[str, int] = dict.fromkeys(self._by_model, 0)
        # Per model, prefix key -> the endpoint that took it last (see the module's docstring).
        self._owners: dict[str, OrderedDict[int, EndpointState]] = {
            m: OrderedDict() for m in self._by_model}
        self.group = uuid.uuid4().hex[:8]  # names this pool's limiters to other runs
        # Per model, what each endpoint serving it charges for a prompt and a completion token.
        self._dearness: dict[str, dict[EndpointState, float]] = {
            model: {state: _dearness(price_of, model, state.spec.name) for state in states}
            for model, states in self._by_model.items()}

    def serves(self, model: str) -> bool:
        return model in self._by_model

    def now(self) -> float:
        """The pool's clock (``time.monotonic`` unless a test gives another)."""
        return self._clock()

    def failing_deadline(self, model: str, bound: FailingBound) -> float:
        """When the rows of ``model`` waiting for an endpoint fail as ``endpoint_failing``, on
        the pool's clock (see :func:`.endpoint_state.failing_deadline`)."""
        return failing_deadline(self._by_model.get(model, ()), bound)

    def check_failing(self, model: str, bound: FailingBound) -> None:
        """Raise ``EndpointFailingError`` once every endpoint of ``model`` has answered nothing
        usable for longer than the bound, naming each one's last failure."""
        serving = self._by_model.get(model)
        if serving and self._clock() >= failing_deadline(serving, bound):
            raise failing_error(model, serving, bound)

    def capacity(self, model: str | None = None) -> int:
        states = self.endpoints if model is None else self._by_model.get(model, [])
        return sum(s.spec.max_concurrency for s in states)

    async def acquire(self, model: str, tokens: int, prefix_key: int | None = None,
                      failing: FailingBound | None = None) -> Lease:
        """A lease on an endpoint for a request of ``model`` that may use ``tokens``, waiting
        for room; with ``failing``, ``EndpointFailingError`` instead once every endpoint of the
        model has answered nothing usable for that bound (checked while it waits, too)."""
        serving = self._by_model.get(model)
        if not serving:
            raise UnsupportedModelError(
                f"no configured endpoint serves model '{model}' "
                f"(served: {sorted(self._by_model)})"
            )
        promised = False
        while True:
            if failing is not None and serving[0].failing_since is not None:
                try:
                    self.check_failing(model, failing)
                except EndpointFailingError:
                    if promised:
                        self._wake(model)  # hand the slot we were woken for to the next waiter
                    raise
            lease, wait_s = self._try_acquire(serving, model, tokens, prefix_key, failing)
            if lease is not None:
                return lease
            if failing is not None and serving[0].failing_since is not None:
                # Wake at the bound, not a probe's slot later.
                wait_s = min(wait_s, self.failing_deadline(model, failing) - self._clock())
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiters[model].append((waiter, prefix_key))
            # A timer rather than asyncio.wait_for: on Python 3.11 wait_for returns the result
            # of a waiter woken in the same loop turn as a cancellation and swallows the
            # cancellation, so a stopping run's worker would go on sending (and never end).
            timer = loop.call_later(max(0.0, min(wait_s, _MAX_WAIT_S)), _wake_one, waiter)
            try:
                promised = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    if waiter.result():
                        self._promised[model] -= 1
                    self._wake(model)  # hand the wake-up we consumed to the next waiter
                raise
            finally:
                timer.cancel()
            if promised:
                self._promised[model] -= 1

    def _try_acquire(
        self, serving: list[EndpointState], model: str, tokens: int, prefix_key: int | None,
        failing: FailingBound | None = None,
    ) -> tuple[Lease | None, float]:
        owner_full = False
        if prefix_key is not None:
            owners = self._owners[model]
            owner = owners.get(prefix_key)
            # Healthy (no failure since its last success), within its limits: the endpoint
            # whose cache holds the head, if it has room, at no more cost than the loop below.
            if (owner is not None and not owner.consecutive_failures
                    and owner.admits_size(tokens) and owner.rate_wait_s(tokens) <= 0):
                if owner.outstanding < owner.capacity:
                    owners.move_to_end(prefix_key)
                    return self._lease(owner, tokens), 0.0
                owner_full = True
        now = self._clock()
        room = 0  # free slots over the live endpoints
        best: EndpointState | None = None
        best_rank: tuple[int, float, int] = (-(1 << 30), -math.inf, 0)
        dearness = self._dearness[model]
        wait_s = math.inf
        alive = fits = False
        for state in serving:
            if not state.admits_size(tokens):
                continue
            fits = True
            if state.is_open(now) and not probes_early(state, serving, failing):
                wait_s = min(wait_s, state.open_until - now)
                continue
            alive = True
            if state.tripped:  # half-open: exactly one probe at a time
                free = 0 if state.probe_in_flight else 1
            else:
                free = state.capacity - state.outstanding
            # Healthy endpoints first (an endpoint that fails at once never has requests
            # outstanding and would otherwise look the least loaded), then the cheapest for
            # the model (the same model costs differently at each provider), then the most
            # free capacity.
            rank = (-state.consecutive_failures, -dearness[state], free)
            if free > 0:
                room += free
            if free <= 0 or rank <= best_rank:
                continue
            rate_wait = state.rate_wait_s(tokens)
            if rate_wait > 0:
                wait_s = min(wait_s, rate_wait)
                continue
            best, best_rank = state, rank
        if best is not None:
            if owner_full and room <= self._promised[model]:
                return None, wait_s  # those slots are woken waiters': wait for the owner's
            if prefix_key is not None:
                owners[prefix_key] = best
                owners.move_to_end(prefix_key)
                if len(owners) > _MAX_PREFIX_KEYS:
                    owners.popitem(last=False)
            return self._lease(best, tokens), 0.0
        if not fits:
            limits = ", ".join(
                f"'{s.spec.name}' tokens_per_minute={s.spec.tokens_per_minute} "
                f"({s.spec.tokens_per_minute * s.spec.rate_limit_window_s / 60.0:g} tokens per "
                f"{s.spec.rate_limit_window_s:g} s window)" for s in serving)
            raise RequestTooLargeError(
                f"the request may use up to {tokens} tokens (its prompt's upper bound plus "
                f"max_tokens), more than any endpoint serving '{model}' admits in one "
                f"rate-limit window: {limits}"
            )
        if not alive:
            error = NoHealthyEndpointError(
                f"every endpoint serving '{model}' is cooling down after repeated failures "
                f"({', '.join(s.spec.name for s in serving)})"
            )
            # The retry waits for the first cool-down to end (a probe may then go out), rather
            # than spending the row's remaining attempts in a few milliseconds of backoff.
            error.retry_after_s = wait_s if math.isfinite(wait_s) else None
            raise error
        return None, wait_s

    @staticmethod
    def _lease(state: EndpointState, tokens: int) -> Lease:
        state.outstanding += 1
        state.requests += 1
        probe = state.tripped
        if probe:
            state.probe_in_flight = True
        return Lease(
            endpoint=state,
            request_entry=state.request_limiter.take(1) if state.request_limiter else None,
            token_entry=state.token_limiter.take(tokens) if state.token_limiter else None,
            probe=probe,
        )

    def release(self, lease: Lease, *, success: bool, unhealthy: bool,
                actual_tokens: int | None, reason: str = "") -> None:
        """Give a lease back. ``unhealthy`` failures feed the breaker (429s and 4xx do not);
        ``reason``, such a failure in words, is what rows that fail as ``endpoint_failing``
        name."""
        state = lease.endpoint
        state.outstanding -= 1
        if lease.probe:
            state.probe_in_flight = False
        if success:
            state.record_success()
        elif unhealthy:
            state.record_failure(probe=lease.probe, reason=reason)
        elif lease.probe:
            state.record_success()  # it answered: alive, even if the answer was an error
        # Rate-limit entries count on for a window after the reply (see SlidingWindowLimiter);
        # a failure keeps its token reservation, as the server may have counted it.
        if lease.request_entry is not None:
            state.request_limiter.settle(lease.request_entry)
        if lease.token_entry is not None:
            state.token_limiter.settle(lease.token_entry, actual_tokens)
        for model in state.spec.served_models:
            self._wake(model, state)

    def give_back_unused(self, lease: Lease) -> None:
        """Give back a lease whose request was never sent: as if it had not been taken."""
        state = lease.endpoint
        state.outstanding -= 1
        state.requests -= 1
        if lease.probe:
            state.probe_in_flight = False
        if lease.request_entry is not None:
            state.request_limiter.settle(lease.request_entry, 0)
        if lease.token_entry is not None:
            state.token_limiter.settle(lease.token_entry, 0)
        for model in state.spec.served_models:
            self._wake(model, state)

    def _wake(self, model: str, freed: EndpointState | None = None) -> None:
        """Wake one waiter, promised a slot: of those first in line, one whose prefix key
        ``freed`` (the endpoint with a slot free now) owns, else the first."""
        waiters = self._waiters.get(model)
        if not waiters:
            return
        owners = self._owners[model]
        if freed is not None and owners:
            for i, (waiter, key) in enumerate(islice(waiters, _MATCH_WAITERS)):
                if key is not None and owners.get(key) is freed and not waiter.done():
                    del waiters[i]
                    self._promise(model, waiter)
                    return
        while waiters:
            waiter, _ = waiters.popleft()
            if not waiter.done():
                self._promise(model, waiter)
                return

    def _promise(self, model: str, waiter: asyncio.Future) -> None:
        waiter.set_result(True)
        self._promised[model] += 1

    def allocate(self, allocation: Allocation) -> None:
        """Use only this run's part of each endpoint (other runs use the rest); an empty
        ``Allocation()`` gives the run every endpoint whole again."""
        self._set_shares(allocation.runs)
        self._set_rate_limits(allocation.rate_limits)
        self._set_capacities(allocation.capacities)

    def _set_shares(self, runs_per_endpoint: Mapping[str, int]) -> None:
        for state in self.endpoints:
            runs = runs_per_endpoint.get(state.spec.name, 1)
            state.set_share(1.0 / max(1, runs))
            for model in state.spec.served_models:
                self._wake(model)  # a larger share may admit a waiter now

    def _set_rate_limits(self, limits: Mapping[str, tuple]) -> None:
        """Refine the shares (see ``Allocation.rate_limits``)."""
        for state in self.endpoints:
            pair = limits.get(state.spec.name, (None, None))
            for limiter, limit in zip((state.request_limiter, state.token_limiter), pair,
                                      strict=True):
                if limiter is not None and limit is not None:
                    limiter.limit, limiter.lone_request_ok = limit
            for model in state.spec.served_models:
                self._wake(model)

    def _set_capacities(self, capacities: Mapping[str, int]) -> None:
        """Refine the shares (see ``Allocation.capacities``)."""
        for state in self.endpoints:
            if state.spec.name in capacities:
                state.capacity = capacities[state.spec.name]
                for model in state.spec.served_models:
                    self._wake(model)

    def in_flight(self) -> dict[str, int]:
        return {s.spec.name: s.outstanding for s in self.endpoints}

    def window_usage(self) -> dict[str, tuple[float, float]]:
        """Per endpoint, the requests and tokens its rate limiters count now."""
        return {
            s.spec.name: (s.request_limiter.used if s.request_limiter else 0.0,
                          s.token_limiter.used if s.token_limiter else 0.0)
            for s in self.endpoints
        }

    def snapshot(self) -> dict[str, dict[str, int | bool]]:
        now = self._clock()
        return {
            s.spec.name: {
                "requests": s.requests, "succeeded": s.succeeded, "failed": s.failed,
                "outstanding": s.outstanding, "cooling_down": s.is_open(now),
            }
            for s in self.endpoints
        }


def _dearness(price_of: Callable[[str, str], Any] | None, model: str, endpoint: str) -> float:
    price = price_of(model, endpoint) if price_of is not None else None
    return price.upper_bound(1, 1) if price is not None else 0.0
