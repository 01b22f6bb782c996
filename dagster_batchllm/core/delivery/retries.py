"""The retry policy, following openai-python's rules, as two small functions and one plain loop.

Retry 408, 409, 429, 5xx, timeouts, dropped connections and "no healthy endpoint" (the errors
that say ``retryable``); honour ``Retry-After`` (capped by ``max_retry_after_s``); otherwise back
off exponentially with jitter. Everything else (400, 401, 404, context length, malformed replies)
is final at once: retrying cannot fix it and may pay again. ``max_attempts`` counts the first try.
A server's ``Retry-After`` longer than ``max_wait_s`` (``endpoint_failing_after_s``) is not
waited for at all: the row is deferred to a later call (see ``waits_too_long``).

Like openai-python (``_should_retry`` / ``_calculate_retry_timeout`` around a ``while`` loop),
the loop that uses this policy is plain code (see ``delivery.OnlineDelivery.send``), not a
tenacity object per request: building one costs ~25 us and, worse, ~20 objects in reference
cycles, which at a thousand requests a second trigger full garbage collections that stall the
event loop for a fifth of a second each. A request's first try therefore allocates nothing here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import EndpointError
from ..settings import InferenceSettings


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    initial_backoff_s: float
    max_backoff_s: float
    max_retry_after_s: float
    #: The longest a row waits for a server's Retry-After within the call.
    max_wait_s: float = float("inf")

    @classmethod
    def from_settings(cls, settings: InferenceSettings) -> RetryPolicy:
        return cls(max_attempts=settings.max_attempts,
                   initial_backoff_s=settings.retry_initial_backoff_s,
                   max_backoff_s=settings.retry_max_backoff_s,
                   max_retry_after_s=settings.max_retry_after_s,
                   max_wait_s=settings.endpoint_failing_after_s)

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether to try again after attempt number ``attempt`` (1-based) failed with ``exc``."""
        return attempt < self.max_attempts and is_retryable(exc)

    def retry_delay(self, exc: BaseException | None, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            return min(float(retry_after), self.max_retry_after_s)
        # initial * 2^(n-1) plus up to `initial` of jitter, capped (what tenacity's
        # wait_exponential_jitter computes, which this policy used before).
        initial = self.initial_backoff_s
        backoff = initial * 2 ** min(attempt - 1, 62) + random.uniform(0, initial)
        return min(backoff, self.max_backoff_s)


    def waits_too_long(self, exc: BaseException, delay: float) -> bool:
        """Whether ``delay`` (from ``retry_delay``) is a server's Retry-After longer than a row
        waits for within the call: the row is then deferred, not held for it. (The breaker's
        own waits end at the failing bound instead; see ``OnlineDelivery.send``.)"""
        return (delay > self.max_wait_s and isinstance(exc, EndpointError)
                and exc.retry_after_s is not None)


def is_retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))
