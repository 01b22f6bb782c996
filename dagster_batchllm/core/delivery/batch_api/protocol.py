"""A provider's batch protocol: how request lines are written, submitted, polled and read back.

:class:`BatchProtocol` is all that the batch delivery and its collector know of a provider:
:class:`~.openai.OpenAIBatchProtocol` (OpenAI's Files and Batches API, which Azure OpenAI,
Together, Groq and Mistral also speak) and :class:`~.anthropic.AnthropicBatchProtocol`
(Anthropic's Message Batches: requests posted inline, results as JSONL); an endpoint's
``batch_protocol`` picks one (:func:`~.providers.protocol_for`). Every call is blocking and few
(one upload and one create per batch, one retrieve per poll): the delivery runs them on a
thread, with the provider's official client.

Each line's ``custom_id`` is its request key, so the results tie back to table rows. What a
provider says of a failure (a line's error, a batch's errors, a refused call) passes the
protocol's :attr:`~BatchProtocol.redact` (the endpoint's key and the ``Bearer`` forms masked:
see :mod:`...redaction`) before it is kept or logged.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...errors import RowError
from ...redaction import Redactor
from .lines import AnswerBlock

_TLS: list[Any] = []  # the process's TLS context for the clients, once made
_TLS_LOCK = threading.Lock()


def http_client(sdk: Any) -> Any:
    """The HTTP client for a protocol's client of ``sdk`` (``openai`` or ``anthropic``, both
    on httpx), on one TLS context per process. A new client makes a context, which loads the
    system's CA certificates: about 50 ms of CPU, that every batch call (a protocol per
    endpoint) and every batch sensor tick paid again. The context is made as the client's
    HTTP library makes its default one; None (the client's default) where that library offers
    no such call."""
    with _TLS_LOCK:
        if not _TLS:
            library = sys.modules.get(sdk.DefaultHttpxClient.__mro__[1].__module__
                                      .partition(".")[0])
            make = getattr(library, "create_ssl_context", None)
            _TLS.append(make() if callable(make) else None)
    return sdk.DefaultHttpxClient(verify=_TLS[0]) if _TLS[0] is not None else None


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """What a poll says of a batch."""

    batch_id: str
    status: str  # the provider's word; see :data:`~.book.ENDED`
    ended: bool
    request_counts: dict[str, int]
    output_file_id: str | None
    error_file_id: str | None
    errors: str | None  # why the batch as a whole failed, if it did


@dataclass(slots=True)  # not frozen: one is made per result line (see RowRequest)
class LineResult:
    """One result line: the request key, and the 200 reply or the error it got."""

    request_key: str
    reply: Any  # the reply body, parsed from the line's JSON, when answered 200
    error: RowError | None
    expired: bool = False


class BatchProtocol(Protocol):
    provider: str
    #: Masks the endpoint's key in what the provider says (errors kept, exceptions logged).
    redact: Redactor

    def line(self, key: str, route: str, body: bytes) -> bytes | RowError:
        """One request line (ending in a newline) for a request body already serialized; or
        the row's error, where the provider's API cannot express the request."""
        ...

    def submit(self, path: Path, *, route: str, submission_id: str,
               metadata: dict[str, str]) -> tuple[str, str | None]:
        """Upload the file at ``path`` and create a batch over it: (batch id, input file id).
        The submission id goes into the batch's metadata."""
        ...

    def find(self, submission_id: str) -> str | None:
        """The id of the batch created for ``submission_id``, if the provider has one."""
        ...

    def poll(self, batch_id: str) -> BatchStatus: ...

    def results(self, status: BatchStatus, route: str
                ) -> Iterator[LineResult | AnswerBlock]:
        """The ended batch's result lines (output then errors), streamed: a line each, or
        the answers of many lines as columns where the protocol read ``route``'s replies
        itself (see :mod:`.lines`)."""
        ...

    def cancel(self, batch_id: str) -> None: ...


__all__ = ["BatchProtocol", "BatchStatus", "LineResult", "http_client"]
