"""Two ways a careless server misbehaves, for the tests of what a client keeps of its replies.

* ``echo_credentials``: its error messages quote the credentials the request carried (the
  ``Authorization`` and ``x-api-key`` headers, and the bare key), as a debugging proxy or a
  server that prints its request does. Every error reply of every route says them (an
  aiohttp middleware adds them to the OpenAI or Anthropic error envelope's message), and so do
  the errored lines of a batch (the key the server was started with: the one a batch's
  creator had to send).
* ``huge_reply_bytes``: every successful model reply (chat, completions, embeddings) is
  padded to that many bytes, its text (or a ``padding`` field) made of ``x``, as a server
  that ignores ``max_tokens`` or a proxy that answers with a file would send. The body is
  streamed in 1 MB writes of one buffer, so the server's memory stays flat however large it
  is; ``huge_reply_declared`` says whether it declares its length (``Content-Length``) or
  sends it chunked, with no length known in advance. A client that stops reading and closes
  the connection ends the reply. A batch's answered lines are padded the same way (built in
  memory: keep them to a few MB).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .state import SimState

_WRITE = b"x" * (1 << 20)
_MARKER = "\x00huge-reply\x00"
_RETRY_HEADERS = ("Retry-After", "retry-after-ms")


def credentials_text(authorization: str | None, api_key: str | None) -> str:
    """What an echoing server appends to an error's message."""
    bare = (authorization or "").removeprefix("Bearer ") or api_key or ""
    return (f" [request headers: Authorization: {authorization or '(none)'}; x-api-key: "
            f"{api_key or '(none)'}] [the key received: {bare or '(none)'}]")


def echo_middleware(state: SimState) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware that adds the request's credentials to every error reply's message,
    while ``echo_credentials`` is on."""

    @web.middleware
    async def echo_credentials(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if (not state.config["echo_credentials"] or response.status < 400
                or not isinstance(response, web.Response) or not response.body):
            return response
        try:
            body = json.loads(bytes(response.body))
        except (TypeError, ValueError):
            return response
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            return response
        error["message"] += credentials_text(request.headers.get("Authorization"),
                                             request.headers.get("x-api-key"))
        headers = {name: response.headers[name] for name in _RETRY_HEADERS
                   if name in response.headers}
        return web.Response(status=response.status, body=json.dumps(body).encode(),
                            content_type="application/json", headers=headers)

    return echo_credentials


def line_error_message(state: SimState, message: str, api_key: str | None) -> str:
    """A batch line's error message, with the key quoted while ``echo_credentials`` is on."""
    if not state.config["echo_credentials"]:
        return message
    return message + credentials_text(f"Bearer {api_key}" if api_key else None, api_key)


def _marked(payload: dict) -> tuple[bytes, bytes]:
    """A reply body around the place its padding goes: its text (or a ``padding`` field)."""
    choices = payload.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
        choice["message"]["content"] = _MARKER
    elif isinstance(choice, dict) and "text" in choice:
        choice["text"] = _MARKER
    else:
        payload["padding"] = _MARKER
    head, tail = json.dumps(payload).encode().split(json.dumps(_MARKER).encode()[1:-1])
    return head, tail


def padded(payload: dict, size: int) -> dict:
    """``payload`` padded to about ``size`` bytes, whole in memory: a batch line's reply
    (a test's few MB; the online routes stream theirs)."""
    head, tail = _marked(payload)
    padding = "x" * max(0, size - len(head) - len(tail))
    return json.loads(head + padding.encode() + tail)


async def huge_reply(request: web.Request, payload: dict, size: int,
                     declared: bool) -> web.StreamResponse:
    """``payload`` (a reply body) padded to ``size`` bytes and streamed; see the module."""
    head, tail = _marked(payload)
    padding = max(0, size - len(head) - len(tail))
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    if declared:
        response.content_length = len(head) + padding + len(tail)
    else:
        response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        await response.write(head)
        left = padding
        while left > 0:
            chunk = _WRITE if left >= len(_WRITE) else _WRITE[:left]
            await response.write(chunk)
            left -= len(chunk)
        await response.write(tail)
        await response.write_eof()
    except (ConnectionError, RuntimeError):  # the client stopped reading and closed
        if request.transport is not None:
            request.transport.close()
    return response


__all__ = ["credentials_text", "echo_middleware", "huge_reply", "line_error_message", "padded"]
