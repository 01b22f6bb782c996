"""One endpoint's live state as the pool sees it: leases out, rate limiters, circuit breaker,
and since when it has answered nothing usable.

The breaker alone lets one probe through per cool-down (10, 20, 40, 80 s), so an endpoint that
answers every request but never usably (a 200 whose body is not a reply, a connection closed
mid-body, 5xx) would hold the rows waiting on it for hours. So each endpoint also keeps when it
began failing (its first failure since its last usable answer) and its last failure in words;
:func:`failing_deadline` says when the rows of a model stop waiting, once every endpoint serving
it has failed for a :class:`FailingBound`, and :func:`failing_error` what they fail with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import EndpointFailingError
from ..settings import EndpointSpec
from .limits import SlidingWindowLimiter

_MAX_COOLDOWN_FACTOR = 8
# An endpoint's last failure as rows failing with endpoint_failing quote it.
_MAX_REASON_CHARS = 400


class EndpointState:
    """Live state of one endpoint: leases out, limits, breaker and counters."""

    def __init__(self, spec: EndpointSpec, *, failure_threshold: int, cooldown_s: float, clock):
        self.spec = spec
        self.outstanding = 0
        self._clock = clock
        self._failure_threshold = failure_threshold
        self._cooldown_s = cooldown_s
        self.consecutive_failures = 0
        self.trips = 0
        self.open_until = 0.0
        self.probe_in_flight = False
        # When it began answering nothing usable (its first unhealthy failure since its last
        # usable answer; None while it is healthy), and the last such failure, in words.
        self.failing_since: float | None = None
        self.last_failure = ""
        self.last_failure_at = -math.inf
        scale = spec.rate_limit_window_s / 60.0
        self.request_limiter = (
            SlidingWindowLimiter(spec.requests_per_minute * scale, spec.rate_limit_window_s, clock)
            if spec.requests_per_minute else None
        )
        self.token_limiter = (
            SlidingWindowLimiter(spec.tokens_per_minute * scale, spec.rate_limit_window_s, clock)
            if spec.tokens_per_minute else None
        )
        self.share = 1.0
        self.capacity = spec.max_concurrency
        self.requests = 0
        self.succeeded = 0
        self.failed = 0

    def set_share(self, share: float) -> None:
        """Use only this fraction of the endpoint's limits (other runs use the rest)."""
        self.share = share
        self.capacity = max(1, int(self.spec.max_concurrency * share))
        scale = self.spec.rate_limit_window_s / 60.0
        if self.request_limiter is not None:
            self.request_limiter.limit = max(1.0, self.spec.requests_per_minute * scale * share)
            self.request_limiter.lone_request_ok = True
        if self.token_limiter is not None:
            self.token_limiter.limit = self.spec.tokens_per_minute * scale * share
            self.token_limiter.lone_request_ok = True

    @property
    def tripped(self) -> bool:
        return self.consecutive_failures >= self._failure_threshold

    def is_open(self, now: float) -> bool:
        return self.tripped and now < self.open_until

    def admits_size(self, tokens: int) -> bool:
        if self.token_limiter is None:
            return True
        return tokens <= self.spec.tokens_per_minute * self.spec.rate_limit_window_s / 60.0

    def rate_wait_s(self, tokens: int) -> float:
        wait = 0.0
        if self.request_limiter is not None:
            wait = self.request_limiter.seconds_until_fits(1)
        if self.token_limiter is not None:
            wait = max(wait, self.token_limiter.seconds_until_fits(tokens))
        return wait

    def record_success(self) -> None:
        self.succeeded += 1
        self.consecutive_failures = 0
        self.trips = 0
        self.failing_since = None

    def record_failure(self, *, probe: bool = False, reason: str = "") -> None:
        """A failure that says the endpoint is unhealthy. The failure that trips the breaker
        opens it for the cool-down, and each failed probe doubles it (up to 8x); the failures
        of requests that were in flight when it tripped say nothing new and leave it as it is
        (at concurrency 16 they would otherwise stretch one cool-down to its 8x cap at once).
        ``reason``: the failure in words, which rows failing as ``endpoint_failing`` quote."""
        self.failed += 1
        self.consecutive_failures += 1
        now = self._clock()
        if self.failing_since is None:
            self.failing_since = now
        self.last_failure, self.last_failure_at = reason[:_MAX_REASON_CHARS], now
        if self.tripped and (probe or self.trips == 0):
            self.trips += 1
            factor = min(2 ** (self.trips - 1), _MAX_COOLDOWN_FACTOR)
            self.open_until = now + self._cooldown_s * factor


@dataclass(frozen=True, slots=True)
class FailingBound:
    """How long every endpoint serving a model may answer nothing usable while a call's rows
    wait (``after_s``), counted at the earliest from ``since`` (the call's start on the pool's
    clock: an endpoint that failed before the call is given the whole bound again)."""

    after_s: float
    since: float


def failing_deadline(serving: Sequence[EndpointState], bound: FailingBound) -> float:
    """When the rows of a model served by ``serving`` stop waiting (the pool's clock):
    ``bound.after_s`` after the last of them began failing, or after ``bound.since`` if that is
    later; infinity while one of them has not failed since its last usable answer."""
    latest = bound.since
    for state in serving:
        if state.failing_since is None:
            return math.inf
        latest = max(latest, state.failing_since)
    return latest + bound.after_s if serving else math.inf


def probes_early(state: EndpointState, serving: Sequence[EndpointState],
                  bound: FailingBound | None) -> bool:
    """Whether ``state``, cooling down, takes a probe now after all: the call's failing bound
    would end before its cool-down does, and it has not failed since the call began. So no call
    fails its rows as ``endpoint_failing`` without having asked each endpoint once (a rerun on
    the same client, the server fixed meanwhile, would otherwise fail untried)."""
    return (bound is not None and state.last_failure_at < bound.since
            and failing_deadline(serving, bound) <= state.open_until)


def failing_error(model: str, serving: Sequence[EndpointState], bound: FailingBound
                  ) -> EndpointFailingError:
    """What the rows of ``model`` fail with past :func:`failing_deadline`: each endpoint's last
    failure, so the row says why."""
    reasons = "; ".join(f"'{state.spec.name}': {state.last_failure or 'unknown'}"
                        for state in serving)
    return EndpointFailingError(
        f"no endpoint serving '{model}' gave a usable answer for {bound.after_s:g} s "
        f"(endpoint_failing_after_s); the last failure of each: {reasons}")
