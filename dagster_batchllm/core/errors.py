"""The typed error hierarchy.

Two kinds of failure exist and are kept apart on purpose:

* Mistakes in the call itself (a template naming a missing column, a model that no endpoint
  serves) raise :class:`InferenceConfigError` before any request is sent.
* Failures of a single row are data, not exceptions: the row's error column holds
  ``"<error_type>: <message>"`` where ``error_type`` is one of the stable codes in
  :class:`ErrorType`, and the ledger stores the code in its own column (as does
  ``InferenceResult.error_types``, so no caller needs to parse the text). The vocabulary is
  closed: rows the token budget deferred and internal failures have their codes here too.

Transport errors carry ``retryable`` so the retry policy needs no knowledge of HTTP.
"""

from __future__ import annotations

from enum import Enum


class ErrorType(str, Enum):
    """Stable codes for per-row errors (safe to filter on in SQL)."""

    INVALID_INPUT = "invalid_input"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNSUPPORTED_MODEL = "unsupported_model"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    CONNECTION_ERROR = "connection_error"
    TIMEOUT = "timeout"
    BAD_REQUEST = "bad_request"
    AUTHENTICATION = "authentication_error"
    NOT_FOUND = "not_found"
    MALFORMED_RESPONSE = "malformed_response"
    STRUCTURED_OUTPUT = "invalid_structured_output"
    NO_HEALTHY_ENDPOINT = "no_healthy_endpoint"
    ENDPOINT_UNREACHABLE = "endpoint_unreachable"
    #: Every endpoint of the model answered, but nothing usable (5xx, bodies that are not a
    #: reply, connections closed mid-body, timeouts), for ``endpoint_failing_after_s``.
    ENDPOINT_FAILING = "endpoint_failing"
    REQUEST_TOO_LARGE = "request_too_large"
    #: The reply was longer than the request could need (``max_reply_bytes``): its reading
    #: was stopped and the connection closed, nothing of it kept.
    RESPONSE_TOO_LARGE = "response_too_large"
    #: The model cannot do what the request asks (the embedded default asked to translate or
    #: to read an image answers 422 with this code): the same request is refused every time.
    UNSUPPORTED_TASK = "unsupported_task"
    DEFERRED = "deferred"
    INTERNAL = "internal_error"


class BatchLLMError(Exception):
    """Base class of every error this library raises."""


class InferenceConfigError(BatchLLMError, ValueError):
    """The call itself is wrong (raised before any request is sent)."""


class JournalUnsafeError(BatchLLMError):
    """The run cannot keep its crash journal safely: the journal directory belongs to another
    user, is a symbolic link or is not a directory (another user could plant answers there
    that a run would serve as paid for). Raised before anything is sent; the message names
    the path, what is wrong and how to fix it."""


class LedgerVanishedError(BatchLLMError):
    """The SQLite ledger file was deleted or replaced while a run was using it: what the run
    writes goes to a file no one can open again. The run stops sending and keeps its journal;
    the message names the file and the journal, which the next run folds into a ledger at
    ``path``."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class LedgerUnwritable(BatchLLMError):
    """The ledger database could not be written for ``ledger_outage_s``: the run stops
    sending, the answers it received stay in its journal (the next run writes them), and the
    message names the database and the last error."""


class ClaimsUnavailableError(LedgerUnwritable):
    """The ledger database could not take this run's claims on its requests (which keep runs
    sharing a ledger from paying twice) for the outage bound: the same outage as a write that
    fails, found by the claim first."""


class RowError(BatchLLMError):
    """A failure that belongs to one row; becomes that row's error value."""

    error_type: ErrorType = ErrorType.SERVER_ERROR
    retryable: bool = False

    def __init__(self, message: str, *, error_type: ErrorType | None = None):
        super().__init__(message)
        if error_type is not None:
            self.error_type = error_type

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def as_cell(self) -> str:
        return f"{self.error_type.value}: {self.message}"


class InvalidInputError(RowError):
    error_type = ErrorType.INVALID_INPUT


class FileRefusedError(InvalidInputError):
    """A path cell the file policy does not read (:mod:`.file_policy`): outside ``files_roots``,
    missing, not a regular file, too large or unreadable. The message names the path and the
    reason, without the column (the caller adds it), and never quotes the file's bytes."""


class ContextLengthExceededError(RowError):
    error_type = ErrorType.CONTEXT_LENGTH_EXCEEDED


class UnsupportedModelError(RowError):
    error_type = ErrorType.UNSUPPORTED_MODEL


class MalformedResponseError(RowError):
    """The server answered 200 but the body is not a usable completion."""

    error_type = ErrorType.MALFORMED_RESPONSE


class StructuredOutputError(RowError):
    """The reply is not valid JSON, or does not match the requested schema."""

    error_type = ErrorType.STRUCTURED_OUTPUT


class RequestTooLargeError(RowError):
    """The request may need more tokens than any endpoint's rate-limit window admits: it could
    never be sent, however long it waited."""

    error_type = ErrorType.REQUEST_TOO_LARGE


class DeferredError(RowError):
    """Not sent: the call's token budget cannot pay for it now; a later call will send it."""

    error_type = ErrorType.DEFERRED
    #: The delivery keeps this row's state durably itself (a line in the batch book), so the
    #: engine writes no ledger record of the deferral (see ``BatchDelivery``).
    kept_by_delivery = False


class InternalError(RowError):
    """This library failed, not the row or the endpoint; a rerun sends the row again."""

    error_type = ErrorType.INTERNAL


class EndpointError(RowError):
    """An HTTP or connection failure talking to one endpoint."""

    def __init__(
        self,
        message: str,
        *,
        error_type: ErrorType,
        status: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        endpoint: str | None = None,
        unreachable: bool = False,
    ):
        super().__init__(message, error_type=error_type)
        #: the request never reached the server: no connection could be made at all
        self.unreachable = unreachable
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.endpoint = endpoint

    @property
    def counts_against_endpoint(self) -> bool:
        """Whether this failure says the endpoint is unhealthy (feeds the circuit breaker).

        A 429 means the endpoint is alive and busy; a 4xx means the request is wrong.
        """
        return self.error_type in (
            ErrorType.SERVER_ERROR,
            ErrorType.CONNECTION_ERROR,
            ErrorType.TIMEOUT,
        )


class NoHealthyEndpointError(RowError):
    """Every endpoint serving the model is cooling down after repeated failures."""

    error_type = ErrorType.NO_HEALTHY_ENDPOINT
    retryable = True


class EndpointUnreachableError(RowError):
    """No endpoint serving the model could be connected to (connection refused, name not
    resolved, TLS failed) for longer than the bound: the row is not sent; a later run may."""

    error_type = ErrorType.ENDPOINT_UNREACHABLE


class EndpointFailingError(RowError):
    """Every endpoint serving the model has answered nothing usable for longer than the bound
    (``endpoint_failing_after_s``) while the row waited: the row is not sent; its message names
    each endpoint's last failure. Not retried within the run (that is what the bound ends), but
    a later run may send it (its kind is transient)."""

    error_type = ErrorType.ENDPOINT_FAILING


RETRYABLE_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))


def classify_http_error(
    status: int, body: str, *, retry_after_s: float | None, endpoint: str,
    url: str | None = None,
) -> EndpointError:
    """Turn a non-200 reply into a typed error, following openai-python's retry rules;
    ``url``, the URL the request went to, makes a 404's message say where it looked."""
    snippet, code = _error_message_from_body(body)
    if status == 404:
        where = f" for {url}" if url else ""
        snippet += (f" (no such route{where}: the endpoint's base_url usually ends in /v1, "
                    "e.g. http://host:8000/v1; or the server does not serve that model)")
    lowered = snippet.lower()
    if status == 429:
        error_type = ErrorType.RATE_LIMITED
    elif status == 408:
        error_type = ErrorType.TIMEOUT
    elif status >= 500:
        error_type = ErrorType.SERVER_ERROR
    elif status in (401, 403):
        error_type = ErrorType.AUTHENTICATION
    elif status == 404:
        error_type = ErrorType.NOT_FOUND
    elif code == ErrorType.UNSUPPORTED_TASK.value:
        error_type = ErrorType.UNSUPPORTED_TASK
    elif "context_length" in lowered or "context length" in lowered or "maximum context" in lowered:
        error_type = ErrorType.CONTEXT_LENGTH_EXCEEDED
    else:
        error_type = ErrorType.BAD_REQUEST
    return EndpointError(
        f"HTTP {status} from endpoint '{endpoint}': {snippet}",
        error_type=error_type,
        status=status,
        retryable=status in RETRYABLE_STATUSES,
        retry_after_s=retry_after_s,
        endpoint=endpoint,
    )


def _error_message_from_body(body: str) -> tuple[str, str | None]:
    """The error's message (an OpenAI error body's, else the body's text) and its code. A
    server's message is kept whole up to 1,000 characters, a body that is no error object (a
    proxy's HTML page) up to 300; what is longer is cut at a word, marked with "..."."""
    import json

    code, limit = None, 300
    message = body.strip() or "(empty body)"
    try:
        parsed = json.loads(body)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict):
            code = str(error["code"]) if error.get("code") else None
            message, limit = str(error.get("message", "")), 1000
            if code and code not in message:
                message = f"{message} (code {code})"
        elif isinstance(error, str):
            message, limit = error, 1000
    except (ValueError, AttributeError):
        pass
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " ..."
    return message, code
