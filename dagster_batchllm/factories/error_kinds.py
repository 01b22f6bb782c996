"""What a row's error type means for the person who has to act on it: can a retry fix it?

The one home of "retryable per error type" for the Dagster layer: the asset's metadata and
checks, and the retry-partitions sensor, all say it with these words. (Transport-level retries
inside one run follow the ``retryable`` flags of :mod:`dagster_batchllm.core.errors`; this is
about running a partition again later. It lives here, not in the core, because only this layer
reads it.)

Example::

    >>> kind_of("invalid_input").advice
    'a retry cannot fix these; fix the input'
    >>> kind_of("rate_limited").retryable
    True
"""

from __future__ import annotations

from enum import Enum

from ..core import ErrorType


class ErrorKind(Enum):
    """A family of error types that call for the same action."""

    # (retryable by running the partition again, what to tell the user)
    TRANSIENT = (True, "a retry may fix these; the endpoint was busy, failing or unreachable")
    REPLY = (True, "the model's reply was unusable; a retry asks again, and cut-off replies "
                   "need a larger max_tokens")
    CONFIGURATION = (True, "fix the endpoint or the call (URL, API key, model, parameters), "
                           "then a retry sends them again")
    DEFERRED = (True, "not sent because the token budget ran out or the endpoint asked to "
                      "wait longer than endpoint_failing_after_s; a later run sends them")
    INPUT = (False, "a retry cannot fix these; fix the input")
    UNSUPPORTED = (False, "the model cannot do this task, a retry cannot fix these; send "
                          "them to a model endpoint that can")

    @property
    def retryable(self) -> bool:
        return self.value[0]

    @property
    def advice(self) -> str:
        return self.value[1]


# Every ErrorType code, classified on purpose (a test keeps this complete).
KIND_BY_TYPE: dict[str, ErrorKind] = {
    ErrorType.INVALID_INPUT.value: ErrorKind.INPUT,
    ErrorType.CONTEXT_LENGTH_EXCEEDED.value: ErrorKind.INPUT,
    ErrorType.REQUEST_TOO_LARGE.value: ErrorKind.INPUT,
    ErrorType.UNSUPPORTED_TASK.value: ErrorKind.UNSUPPORTED,
    ErrorType.UNSUPPORTED_MODEL.value: ErrorKind.CONFIGURATION,
    ErrorType.BAD_REQUEST.value: ErrorKind.CONFIGURATION,
    # Not retried within a run (the same request mostly gets the same oversized reply: a
    # server that ignores max_tokens), but a partition may be run again once the endpoint or
    # max_reply_bytes is fixed, and a sampled reply that ran away once may not again.
    ErrorType.RESPONSE_TOO_LARGE.value: ErrorKind.CONFIGURATION,
    ErrorType.AUTHENTICATION.value: ErrorKind.CONFIGURATION,
    ErrorType.NOT_FOUND.value: ErrorKind.CONFIGURATION,
    ErrorType.RATE_LIMITED.value: ErrorKind.TRANSIENT,
    ErrorType.SERVER_ERROR.value: ErrorKind.TRANSIENT,
    ErrorType.CONNECTION_ERROR.value: ErrorKind.TRANSIENT,
    ErrorType.TIMEOUT.value: ErrorKind.TRANSIENT,
    ErrorType.NO_HEALTHY_ENDPOINT.value: ErrorKind.TRANSIENT,
    ErrorType.ENDPOINT_UNREACHABLE.value: ErrorKind.TRANSIENT,
    ErrorType.ENDPOINT_FAILING.value: ErrorKind.TRANSIENT,
    ErrorType.INTERNAL.value: ErrorKind.TRANSIENT,
    ErrorType.MALFORMED_RESPONSE.value: ErrorKind.REPLY,
    ErrorType.STRUCTURED_OUTPUT.value: ErrorKind.REPLY,
    ErrorType.DEFERRED.value: ErrorKind.DEFERRED,
}


def kind_of(error_type: str | ErrorType | None) -> ErrorKind:
    """The kind of an error type (its code, as in the ledger and ``InferenceResult``). A code
    this table does not know is treated as transient: retrying is the safe default."""
    code = error_type.value if isinstance(error_type, ErrorType) else error_type
    return KIND_BY_TYPE.get(code or "", ErrorKind.TRANSIENT)


def unretryable_rows(errors_by_type: dict[str, int]) -> dict[str, int]:
    """The part of ``{error_type: rows}`` that no retry can fix."""
    return {t: n for t, n in errors_by_type.items() if n and not kind_of(t).retryable}


def describe_errors(errors_by_type: dict[str, int]) -> str:
    """The error counts grouped by what to do, the kinds no retry can fix first::

        'invalid_input 3 - a retry cannot fix these; fix the input. timeout 1 - a retry may ...'
    """
    by_kind: dict[ErrorKind, list[tuple[str, int]]] = {}
    for error_type, rows in sorted(errors_by_type.items(), key=lambda item: (-item[1], item[0])):
        if rows:
            by_kind.setdefault(kind_of(error_type), []).append((error_type, rows))
    order = sorted(by_kind, key=lambda kind: (kind.retryable, list(ErrorKind).index(kind)))
    return ". ".join(
        ", ".join(f"{error_type} {rows}" for error_type, rows in by_kind[kind])
        + f" - {kind.advice}"
        for kind in order
    )
