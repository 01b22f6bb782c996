"""The HTTP call to an endpoint's route (``/chat/completions``) and the reading of its reply.

Two interchangeable transports send the same pre-serialized body:

* ``AiohttpTransport`` (default): a lean client, about 0.5 ms of CPU per request. On a 2-core
  machine the client's CPU per request decides throughput, and the official client costs ~10x.
* ``OpenAITransport``: the official ``openai`` client, for servers or proxies that only its exact
  behaviour satisfies.

Both raise the typed errors of :mod:`dagster_batchllm.core.errors`; neither retries (that is the
retry policy's job). Every text of the server's that an error keeps (its body, the message of
an exception raised while talking to it, a reply that could not be read) passes the call's
:class:`~dagster_batchllm.core.redaction.Redactor` as the error is made, so no API key (and no
``Bearer`` value) a server echoes reaches a row, the ledger or a log. Both read a reply no
further than its bound (:mod:`.reply_size`): a longer one fails its row with
``response_too_large``, the connection closed.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import (
    EndpointError,
    ErrorType,
    InferenceConfigError,
    MalformedResponseError,
    RowError,
)
from ..redaction import Redactor, server_error
from ..requests import Completion, RowRequest
from ..settings import EndpointSpec
from ..usage import reported_usage
from .reply_size import ReplyBound, read_bounded, reading, response_hook

CHAT_ROUTE = "/chat/completions"
EMBEDDINGS_ROUTE = "/embeddings"
_WORD_END = re.compile(rb"[^\s\"',;}\]]{0,400}")


#: How a 200 reply's bytes become a Completion (``parse_completion`` for chat).
ReplyParser = Callable[..., Completion]


class Transport(Protocol):
    async def open(self, endpoints: tuple[EndpointSpec, ...], route: str = CHAT_ROUTE,
                   parse: ReplyParser | None = None) -> None:
        """Connect to ``endpoints``; requests go to ``route`` below each one's base URL and
        their 200 replies are read by ``parse(raw, endpoint=..., latency_s=...)``."""
        ...

    async def send(self, endpoint: EndpointSpec, request: RowRequest) -> Completion: ...
    async def close(self) -> None: ...


def parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


def json_reply(raw: bytes, endpoint: str) -> Any:
    """A 200 reply's JSON body; a body that is not JSON is a ``MalformedResponseError``
    quoting its start (every route's parser begins here)."""
    try:
        return json.loads(raw)
    except ValueError:
        # Cut after the word at 120 bytes, not in it: a key there is quoted whole, so the
        # redaction the transport applies to this message finds it.
        snippet = raw[:120] + _WORD_END.match(raw, 120).group()
        snippet = snippet.decode("utf-8", "replace")
        raise MalformedResponseError(
            f"endpoint '{endpoint}' answered 200 with a body that is not JSON: {snippet!r}"
        ) from None


def parse_completion(raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
    """Read a 200 reply; anything but a usable completion is a ``MalformedResponseError``."""
    return completion_from_payload(json_reply(raw, endpoint), endpoint=endpoint,
                                   latency_s=latency_s)


def completion_from_payload(payload: Any, *, endpoint: str, latency_s: float) -> Completion:
    """``parse_completion`` of a reply already parsed from JSON (a batch result line holds
    the reply as a part of its own JSON)."""
    if not isinstance(payload, dict):
        raise MalformedResponseError(f"endpoint '{endpoint}' answered 200 with a non-object body")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponseError(
            f"endpoint '{endpoint}' answered 200 without 'choices' "
            f"(keys: {sorted(payload)[:8]})"
        )
    choice = choices[0]
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else choice.get("text")
    if not isinstance(content, str):
        raise MalformedResponseError(f"endpoint '{endpoint}' replied without message content")
    if not content.strip():
        raise MalformedResponseError(
            f"endpoint '{endpoint}' replied with empty content "
            f"(finish_reason={choice.get('finish_reason')!r})"
        )
    prompt, completed, cached, reported, corrected = reported_usage(payload.get("usage"))
    return Completion(content, prompt, completed, reported, choice.get("finish_reason"),
                      latency_s, cached_tokens=cached, usage_corrected=corrected)


def _connection_error(endpoint: str, exc: BaseException, *, unreachable: bool = False,
                      reason: str = "") -> EndpointError:
    """``unreachable``: no connection could be made (refused, DNS, TLS), as opposed to one
    that broke while the request was out; ``reason`` says which, in words."""
    detail = str(exc) or type(exc).__name__
    reason = reason or _connect_failure(exc)
    return EndpointError(
        f"connection to endpoint '{endpoint}' failed{': ' + reason if reason else ''}: "
        f"{type(exc).__name__}: {detail}"[:400],
        error_type=ErrorType.CONNECTION_ERROR, retryable=True, endpoint=endpoint,
        unreachable=unreachable,
    )


def _read_reply(parse: ReplyParser, redact: Redactor, raw: bytes, endpoint: str,
                latency_s: float) -> Completion:
    """``parse(raw)``, its errors redacted (they may quote the reply). A parser that fails on
    the reply's shape in a way it did not foresee (a field of another type) fails the row as a
    malformed reply, not as this library's error."""
    try:
        return parse(raw, endpoint=endpoint, latency_s=latency_s)
    except RowError as exc:
        raise redact.error(exc) from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise MalformedResponseError(redact(
            f"endpoint '{endpoint}' answered 200 with a reply that cannot be read: "
            f"{type(exc).__name__}: {exc}"[:400])) from None


def _status_error(redact: Redactor, status: int, body: bytes, headers: Any, endpoint: str,
                  url: str) -> EndpointError:
    """A non-200 reply's error, redacted (see :func:`..redaction.server_error`)."""
    return server_error(redact, status, body.decode("utf-8", "replace"), endpoint=endpoint,
                        retry_after_s=parse_retry_after(headers), url=url)


def _timeout_error(endpoint: str, timeout_s: float) -> EndpointError:
    return EndpointError(
        f"endpoint '{endpoint}' did not answer within {timeout_s:g} s",
        error_type=ErrorType.TIMEOUT, retryable=True, endpoint=endpoint,
    )


def json_headers(endpoint: EndpointSpec) -> dict[str, str]:
    """The headers of a JSON request to ``endpoint``: its content type and bearer token."""
    headers = {"Content-Type": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    return headers


class AiohttpTransport:
    """One keep-alive connection pool per endpoint, sized to its ``max_concurrency``."""

    def __init__(self, *, timeout_s: float, max_reply_bytes: int | None = None):
        self._timeout_s = timeout_s
        self._max_reply_bytes = max_reply_bytes
        self._sessions: dict[str, Any] = {}
        self._urls: dict[str, str] = {}  # built once: a URL per request would cost a string
        self._parse: ReplyParser = parse_completion
        self._redact = Redactor()
        self._bound = ReplyBound(CHAT_ROUTE, max_reply_bytes)

    async def open(self, endpoints: tuple[EndpointSpec, ...], route: str = CHAT_ROUTE,
                   parse: ReplyParser | None = None) -> None:
        import aiohttp

        self._parse = parse or parse_completion
        self._redact = Redactor.of(endpoints)
        self._bound = ReplyBound(route, self._max_reply_bytes)
        for spec in endpoints:
            self._urls[spec.name] = spec.base_url.rstrip("/") + route
            self._sessions[spec.name] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=spec.max_concurrency, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                headers=json_headers(spec),
                skip_auto_headers=("User-Agent",),
            )

    async def send(self, endpoint: EndpointSpec, request: RowRequest) -> Completion:
        import aiohttp

        session = self._sessions[endpoint.name]
        started = time.perf_counter()
        try:
            async with session.post(self._urls[endpoint.name], data=request.body) as response:
                raw = await read_bounded(response, request, self._bound, endpoint.name)
                status = response.status
                headers = response.headers
        except asyncio.TimeoutError:
            raise _timeout_error(endpoint.name, self._timeout_s) from None
        except aiohttp.ClientConnectorError as exc:  # refused, DNS, TLS: nothing was sent
            raise self._redact.error(_connection_error(
                endpoint.name, exc, unreachable=True, reason=_connect_failure(exc))) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self._redact.error(_connection_error(endpoint.name, exc)) from None
        latency = time.perf_counter() - started
        if status != 200:
            raise _status_error(self._redact, status, raw, headers, endpoint.name,
                                self._urls[endpoint.name])
        return _read_reply(self._parse, self._redact, raw, endpoint.name, latency)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()


class OpenAITransport:
    """The official ``openai.AsyncOpenAI`` client, retries off, reply read raw."""

    def __init__(self, *, timeout_s: float, max_reply_bytes: int | None = None):
        self._timeout_s = timeout_s
        self._max_reply_bytes = max_reply_bytes
        self._clients: dict[str, Any] = {}
        self._embeddings, self._route = False, CHAT_ROUTE
        self._parse: ReplyParser = parse_completion
        self._redact = Redactor()
        self._bound = ReplyBound(CHAT_ROUTE, max_reply_bytes)

    async def open(self, endpoints: tuple[EndpointSpec, ...], route: str = CHAT_ROUTE,
                   parse: ReplyParser | None = None) -> None:
        import openai

        if route not in (CHAT_ROUTE, EMBEDDINGS_ROUTE) or (
                route == CHAT_ROUTE and parse not in (None, parse_completion)):
            raise InferenceConfigError(
                f"http_client='openai' sends chat completions and embeddings only, not {route}; "
                "use http_client='aiohttp'")
        self._embeddings, self._route = route == EMBEDDINGS_ROUTE, route
        self._parse = parse or parse_completion
        self._redact = Redactor.of(endpoints)
        self._bound = ReplyBound(route, self._max_reply_bytes)
        httpx = openai_http_library()
        hooks = {"response": [response_hook(httpx)]}
        for spec in endpoints:
            self._clients[spec.name] = openai.AsyncOpenAI(
                base_url=spec.base_url,
                api_key=spec.api_key or "EMPTY",
                max_retries=0,
                timeout=self._timeout_s,
                http_client=httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=spec.max_concurrency,
                                        max_keepalive_connections=spec.max_concurrency),
                    timeout=self._timeout_s,
                    # Bodies as sent, so the hook counts the size the reply has in memory.
                    headers={"Accept-Encoding": "identity"}, event_hooks=hooks,
                ),
            )

    async def send(self, endpoint: EndpointSpec, request: RowRequest) -> Completion:
        import openai

        client = self._clients[endpoint.name]
        payload = json.loads(request.body)
        started = time.perf_counter()
        api = client.embeddings if self._embeddings else client.chat.completions
        try:
            with reading(request, self._bound, endpoint.name):
                raw = await api.with_raw_response.create(**payload)
        except openai.APITimeoutError:
            raise _timeout_error(endpoint.name, self._timeout_s) from None
        except openai.APIStatusError as exc:
            raise _status_error(self._redact, exc.status_code, exc.response.content,
                                exc.response.headers, endpoint.name,
                                endpoint.base_url.rstrip("/") + self._route) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            if isinstance(cause, RowError):  # the reply's bound, raised inside the client
                raise cause from None
            raise self._redact.error(_connection_error(
                endpoint.name, cause, unreachable=_never_connected(cause))) from None
        latency = time.perf_counter() - started
        return _read_reply(self._parse, self._redact, raw.http_response.content, endpoint.name,
                           latency)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()


def _connect_failure(exc: BaseException) -> str:
    """Why no connection was made, in words ("" when it is none of the usual reasons)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (nothing listening at that host and port)"
        if "DNS" in name or isinstance(exc, socket.gaierror):
            return "the host name does not resolve (DNS failure)"
        if "SSL" in name or "Certificate" in name:
            return "TLS failed"
        exc = getattr(exc, "os_error", None) or exc.__cause__ or exc.__context__
    return ""


def _never_connected(exc: BaseException) -> bool:
    """Whether an httpx error says no connection was made (refused, DNS, TLS)."""
    return type(exc).__name__ == "ConnectError" or isinstance(exc, ConnectionRefusedError)


def openai_http_library() -> Any:
    """The HTTP library the installed ``openai`` is built on: ``httpx``, or ``httpx2`` (openai 3).

    ``openai.AsyncOpenAI(http_client=...)`` only accepts a client of that library.
    """
    import openai

    if hasattr(openai, "DefaultAsyncHttpx2Client"):
        import httpx2

        return httpx2
    import httpx

    return httpx


def make_transport(kind: str, *, timeout_s: float,
                   max_reply_bytes: int | None = None) -> Transport:
    """``max_reply_bytes``: the setting of that name (None: each request's own bound)."""
    if kind == "openai":
        return OpenAITransport(timeout_s=timeout_s, max_reply_bytes=max_reply_bytes)
    return AiohttpTransport(timeout_s=timeout_s, max_reply_bytes=max_reply_bytes)
