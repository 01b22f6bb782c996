"""What every batch protocol hands the collector, and the one TLS context their clients share.

Apart from :mod:`.protocol` so that each protocol's module (:mod:`.anthropic`) can use them
while :func:`.protocol.protocol_for` imports every protocol.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

from ...errors import RowError

_TLS: list[Any] = []  # the process's TLS context for the clients, once made
_TLS_LOCK = threading.Lock()


def http_client(sdk: Any) -> Any:
    """The HTTP client for a client of ``sdk`` (``openai`` or ``anthropic``, both on httpx),
    on one TLS context per process. A new client makes a
    context, which loads the system's CA certificates: about 50 ms of CPU, that every batch
    call (a protocol per endpoint) and every batch sensor tick paid again. The context is
    made as the client's HTTP library makes its default one; None (the client's default)
    where that library offers no such call."""
    with _TLS_LOCK:
        if not _TLS:
            library = sys.modules.get(sdk.DefaultHttpxClient.__mro__[1].__module__
                                      .partition(".")[0])
            make = getattr(library, "create_ssl_context", None)
            _TLS.append(make() if callable(make) else None)
    return sdk.DefaultHttpxClient(verify=_TLS[0]) if _TLS[0] is not None else None


@dataclass(frozen=True, slots=True)
class BatchStatus:
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


__all__ = ["BatchStatus", "LineResult", "http_client"]
