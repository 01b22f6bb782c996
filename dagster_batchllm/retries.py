"""The retry policy, on tenacity, following openai-python's rules.

Retry 408, 409, 429, 5xx, timeouts and dropped connections; honour ``Retry-After``; otherwise back
off exponentially with jitter. Everything else (400, 401, 404, context length, malformed replies)
is final at once: retrying cannot fix it and may pay again.
"""

from __future__ import annotations

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)


def is_retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


class WaitRetryAfterOrBackoff:
    """Wait what the server asked for (capped), else exponential backoff with full jitter."""

    def __init__(self, *, initial_s: float, max_s: float, max_retry_after_s: float):
        self._backoff = wait_exponential_jitter(initial=initial_s, max=max_s, jitter=initial_s)
        self._max_retry_after_s = max_retry_after_s

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            return min(float(retry_after), self._max_retry_after_s)
        return self._backoff(retry_state)


def retrying(
    *, max_attempts: int, initial_backoff_s: float, max_backoff_s: float,
    max_retry_after_s: float, before_sleep=None,
) -> AsyncRetrying:
    return AsyncRetrying(
        stop=stop_after_attempt(max_attempts),
        wait=WaitRetryAfterOrBackoff(
            initial_s=initial_backoff_s, max_s=max_backoff_s, max_retry_after_s=max_retry_after_s
        ),
        retry=retry_if_exception(is_retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
