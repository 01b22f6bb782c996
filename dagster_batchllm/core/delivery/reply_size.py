"""How large a reply may be, and reading one no further than that.

A server that ignores ``max_tokens`` (or a proxy that answers with a file) can send 50 MB for
a request that needs a few hundred bytes; read whole, that reply sits in memory, and then in
the ledger as the row's answer. So each reply has a bound, derived from its request unless
``max_reply_bytes`` sets one for all (:func:`reply_limit`), and the transports stop reading at
it: a declared ``Content-Length`` past it is refused before a byte of the body is read, a body
without one is read in chunks with a running total and refused the moment the total passes
it. The connection is closed (its unread rest is never drained) and the row fails with
``response_too_large`` (:func:`too_large`), saying the size seen, the bound and how to raise
it. Memory stays that of the bound, whatever the server sends.

An error reply (not 200) is read up to :data:`ERROR_BODY_BYTES` and cut there: only its first
1,000 characters are kept anyway, and its status still says what happened.

The bounds leave room: a token is about 4 bytes of text, at most a few dozen escaped in JSON.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from ..errors import EndpointError, ErrorType
from ..requests import RowRequest

#: What a reply holds besides its text (ids, usage, finish reason, a server's extra fields).
ENVELOPE_BYTES = 64 * 1024
#: Of a chat reply, per token of ``max_tokens`` (a token is ~4 bytes of text; 64 leaves room
#: for JSON escapes, long tokens and a reasoning field).
BYTES_PER_TOKEN = 64
#: Per token and per logprob asked for (``logprobs``: the token's, each of ``top_logprobs``).
BYTES_PER_LOGPROB = 128
#: The most a chat reply may be by default, whatever its ``max_tokens``.
CHAT_REPLY_CAP = 4 * 1024 * 1024
#: Of an embeddings reply, per dimension of each input's vector (a float in JSON).
BYTES_PER_DIMENSION = 24
#: The dimensions assumed where a call names none (the widest common models have 4,096).
UNNAMED_DIMENSIONS = 8192
#: Per row of a reply on another route (a served model's prediction).
BYTES_PER_ROW = 64 * 1024
#: An error reply is read this far and cut.
ERROR_BODY_BYTES = 64 * 1024
#: The chunks a body without a declared length is read in.
CHUNK_BYTES = 64 * 1024

_EMBEDDINGS_ROUTE, _CHAT_ROUTE = "/embeddings", "/chat/completions"


def reply_limit(request: RowRequest, route: str, configured: int | None = None) -> int:
    """The most bytes the reply to ``request`` may have: ``configured`` (the setting
    ``max_reply_bytes``) where given, else what the request asks for (see the module)."""
    if configured is not None:
        return configured
    return _derived_limit(request, route)[0]


def _derived_limit(request: RowRequest, route: str) -> tuple[int, str]:
    """The bound a request's own parameters give, and how it was reached, in words."""
    body = request.body
    if route == _EMBEDDINGS_ROUTE:
        inputs = _rows(request.payload)
        dimensions = _int_parameter(body, b"dimensions") or UNNAMED_DIMENSIONS
        return (ENVELOPE_BYTES + inputs * dimensions * BYTES_PER_DIMENSION,
                f"{inputs} inputs of {dimensions} dimensions")
    if route == _CHAT_ROUTE or request.max_tokens > 0:
        per_token, logprobs = BYTES_PER_TOKEN, ""
        if b'"logprobs":true' in body:
            alternatives = 1 + (_int_parameter(body, b"top_logprobs") or 0)
            per_token += BYTES_PER_LOGPROB * alternatives
            logprobs = f" with {alternatives} logprobs"
        choices = max(1, _int_parameter(body, b"n") or 1)
        tokens = max(request.max_tokens, 1) * choices
        derived = ENVELOPE_BYTES + tokens * per_token
        how = (f"max_tokens={request.max_tokens}" + (f" x n={choices}" if choices > 1 else "")
               + logprobs)
        return min(derived, CHAT_REPLY_CAP), how
    rows = _rows(request.payload)
    return ENVELOPE_BYTES + rows * BYTES_PER_ROW, f"{rows} rows"


def _rows(payload: Any) -> int:
    """The rows a grouped request carries (its items, or a scoring request's feature rows)."""
    if isinstance(payload, list):
        return max(1, len(payload))
    if isinstance(payload, tuple) and payload and isinstance(payload[-1], list):
        return max(1, len(payload[-1]))
    return 1


def _int_parameter(body: bytes, name: bytes) -> int | None:
    """A top-level integer parameter of a JSON body, found without parsing it. Text inside
    the body's strings cannot match: its quotes are escaped (``\\"n\\":``)."""
    if b'"' + name + b'":' not in body:
        return None
    found = re.search(rb'(?<!\\)"' + re.escape(name) + rb'":(\d{1,9})', body)
    return int(found.group(1)) if found else None


def too_large(request: RowRequest, route: str, configured: int | None, *, seen: int,
              declared: bool, endpoint: str, status: int) -> EndpointError:
    """The row's error for a reply refused at ``seen`` bytes (``declared``: by its
    Content-Length, before reading it)."""
    limit = reply_limit(request, route, configured)
    if configured is not None:
        why = f"max_reply_bytes={configured:,}"
        fix = "raise max_reply_bytes if replies this large are expected"
    else:
        _, how = _derived_limit(request, route)
        why = f"the most this request can need ({how})"
        fix = ("set max_reply_bytes (bytes, for every reply) if replies this large are "
               "expected, or check that the server honours max_tokens")
    size = (f"declared {seen:,} bytes (Content-Length)" if declared
            else f"was still coming at {seen:,} bytes")
    return EndpointError(
        f"the reply of endpoint '{endpoint}' {size}, over the bound of {limit:,} bytes, "
        f"{why}: not read further, the connection closed; {fix}",
        error_type=ErrorType.RESPONSE_TOO_LARGE, status=status, retryable=False,
        endpoint=endpoint)


class ReplyBound:
    """What the transports need to bound the replies of one call: its route and the setting."""

    __slots__ = ("configured", "route")

    def __init__(self, route: str, configured: int | None):
        self.route, self.configured = route, configured

    def limit(self, request: RowRequest) -> int:
        return reply_limit(request, self.route, self.configured)

    def refuse(self, request: RowRequest, *, seen: int, declared: bool, endpoint: str,
               status: int) -> EndpointError:
        return too_large(request, self.route, self.configured, seen=seen, declared=declared,
                         endpoint=endpoint, status=status)

    def floor(self) -> int:
        """A size every reply may have whatever its request (so the limit is worked out
        only for a reply larger than that: most are well below)."""
        return min(ENVELOPE_BYTES, self.configured or ENVELOPE_BYTES)


async def read_bounded(response: Any, request: RowRequest, bound: ReplyBound,
                       endpoint: str) -> bytes:
    """An aiohttp response's body, read no further than the reply's bound (an error reply's
    to :data:`ERROR_BODY_BYTES`, cut); a body past it raises ``response_too_large`` with the
    connection closed."""
    status = response.status
    # A compressed body's Content-Length is not the size it decodes to: counted as read.
    declared = response.content_length if not _encoded(response.headers) else None
    if status != 200:
        if declared is not None and declared <= ERROR_BODY_BYTES:
            return await response.read()
        return await _read_cut(response, ERROR_BODY_BYTES)
    if declared is not None and declared <= bound.floor():
        return await response.read()  # the usual reply: one read, no limit worked out
    limit = bound.limit(request)
    if declared is not None:
        if declared > limit:
            response.close()  # nothing of the body read: the connection is not reused
            raise bound.refuse(request, seen=declared, declared=True, endpoint=endpoint,
                               status=status)
        return await response.read()
    chunks, total = [], 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        total += len(chunk)
        if total > limit:
            response.close()
            raise bound.refuse(request, seen=total, declared=False, endpoint=endpoint,
                               status=status)
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_cut(response: Any, most: int) -> bytes:
    """Up to ``most`` bytes of the body; the connection closed where more was left."""
    chunks, total = [], 0
    while total < most:
        chunk = await response.content.read(most - total)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
    if not response.content.at_eof():
        response.close()
    return b"".join(chunks)


def _encoded(headers: Any) -> bool:
    encoding = headers.get("Content-Encoding")
    return bool(encoding) and encoding.lower() != "identity"




# -- the official client's transport (httpx) ------------------------------------------------
#: The request whose reply the running task reads (set by ``OpenAITransport.send`` around its
#: call), for the response hook, which httpx calls with no request of ours at hand.
_READING: ContextVar[tuple[RowRequest, ReplyBound, str] | None] = ContextVar(
    "batchllm_reading_reply", default=None)


@contextlib.contextmanager
def reading(request: RowRequest, bound: ReplyBound, endpoint: str) -> Iterator[None]:
    """While the block runs, replies this task receives are bound by ``request``'s limit."""
    token = _READING.set((request, bound, endpoint))
    try:
        yield
    finally:
        _READING.reset(token)


def response_hook(library: Any) -> Callable[[Any], Awaitable[None]]:
    """An httpx (or httpx2) ``response`` event hook that bounds the body the client reads
    next: a declared length past the bound is refused at once, else the body's stream counts
    what it yields and refuses the reply past the bound (an error reply is cut instead). The
    client asks for no compression (``Accept-Encoding: identity``), so what the stream counts
    is the body's size; a server that compresses anyway is bounded in the bytes it sends."""
    stream_class = _bounded_stream_class(library)

    async def bound_reply(response: Any) -> None:
        current = _READING.get()
        if current is None:
            return
        request, bound, endpoint = current
        status = response.status_code
        length = response.headers.get("Content-Length")
        declared = (int(length) if length and length.isdigit()
                    and not _encoded(response.headers) else None)
        if status != 200:
            if declared is None or declared > ERROR_BODY_BYTES:
                response.stream = stream_class(response.stream, ERROR_BODY_BYTES, None)
            return
        if declared is not None and declared <= bound.floor():
            return
        limit = bound.limit(request)
        if declared is not None and declared > limit:
            raise bound.refuse(request, seen=declared, declared=True, endpoint=endpoint,
                               status=status)

        def refuse(seen: int) -> EndpointError:
            return bound.refuse(request, seen=seen, declared=False, endpoint=endpoint,
                                status=status)

        response.stream = stream_class(response.stream, limit, refuse)

    return bound_reply


@functools.cache
def _bounded_stream_class(library: Any) -> type:
    class BoundedStream(library.AsyncByteStream):
        """A response body that ends at ``limit`` bytes: cut there (``refuse`` None), or
        refused with ``refuse(bytes seen)``; closing it closes the connection unread."""

        def __init__(self, inner: Any, limit: int, refuse: Callable[[int], BaseException] | None):
            self.inner, self.limit, self.refuse = inner, limit, refuse

        async def __aiter__(self) -> AsyncIterator[bytes]:
            total = 0
            async for chunk in self.inner:
                total += len(chunk)
                if total > self.limit:
                    if self.refuse is not None:
                        raise self.refuse(total)
                    yield chunk[:len(chunk) - (total - self.limit)]
                    return
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    return BoundedStream


__all__ = ["CHAT_REPLY_CAP", "ENVELOPE_BYTES", "ERROR_BODY_BYTES", "ReplyBound",
           "read_bounded", "reading", "reply_limit", "response_hook", "too_large"]
