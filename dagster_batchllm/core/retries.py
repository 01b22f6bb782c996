"""The retry policy, on tenacity, following openai-python's rules.

Retry 408, 409, 429, 5xx, timeouts and dropped connections; honour ``Retry-After``; otherwise back
off exponentially with jitter. Everything else (400, 401, 404, context length, malformed replies)
is final at once: retrying cannot fix it and may pay again.
"""

from __future__ import annotations

import random

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)


def is_retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


class WaitRetryAfterOrBackoff:
    """Wait what the server asked for (capped), else exponential backoff with full jitter."""

    def __init__(self, *, initial_s: float, max_s: float, max_retry_after_s: float,
                 attempts_before: int = 0):
        self._initial_s = initial_s
        self._max_s = max_s
        self._max_retry_after_s = max_retry_after_s
        self._attempts_before = attempts_before  # tries made before tenacity took over

    def delay(self, exc: BaseException | None, attempt_number: int) -> float:
        """Seconds to wait after failed attempt number ``attempt_number`` (1-based)."""
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            return min(float(retry_after), self._max_retry_after_s)
        # initial * 2^(n-1) plus up to `initial` of jitter, capped (tenacity's
        # wait_exponential_jitter, whose `initial` argument newer tenacity deprecates).
        backoff = (self._initial_s * 2 ** min(attempt_number - 1, 62)
                   + random.uniform(0, self._initial_s))
        return min(backoff, self._max_s)

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return self.delay(exc, retry_state.attempt_number + self._attempts_before)


def retrying(
    *, max_attempts: int, initial_backoff_s: float, max_backoff_s: float,
    max_retry_after_s: float, before_sleep=None, attempts_before: int = 0,
) -> AsyncRetrying:
    """The retry loop for what is left of ``max_attempts`` after ``attempts_before`` tries.

    The engine makes a request's first try without it (see ``InferenceRun._process``): a
    tenacity loop per request costs ~25 us and, worse, ~20 objects in reference cycles, which
    at a thousand requests a second trigger full garbage collections that stall the event
    loop for a fifth of a second each.
    """
    return AsyncRetrying(
        stop=stop_after_attempt(max_attempts - attempts_before),
        wait=WaitRetryAfterOrBackoff(
            initial_s=initial_backoff_s, max_s=max_backoff_s,
            max_retry_after_s=max_retry_after_s, attempts_before=attempts_before,
        ),
        retry=retry_if_exception(is_retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
