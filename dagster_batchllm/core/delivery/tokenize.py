"""A server's own count of a request's prompt tokens: vLLM's ``POST /tokenize``.

``plan()`` forecasts prompt tokens from a 4-characters estimate calibrated by the ledger's
past records; an endpoint with ``tokenize_route=True`` can do better: the server counts each
request's prompt with the model's own tokenizer and chat template, and nothing runs on the
GPU. vLLM serves the route at its root (``http://host:8000/tokenize``, beside ``/v1``), takes
a chat request's ``model`` and ``messages`` (or a completions ``prompt``) and answers
``{"count": N, "max_model_len": ..., "tokens": [...]}``; the project's own servers answer
the same route by their count.

The counts come from a server the user may not control, so each is checked before the plan
uses it: a whole number from 0 to the request's strict prompt bound (a token per UTF-8 byte
plus the template's, :func:`~..usage.prompt_bound`). One figure outside that, a non-200 reply
or a failed connection, and :class:`TokenCountUnavailable` says why (the server's text
redacted): the plan then keeps its calibrated estimate and its basis says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from ..errors import BatchLLMError
from ..redaction import Redactor
from ..requests import RowRequest
from ..settings import EndpointSpec
from ..usage import figure_in_words, prompt_bound, token_figure
from .transport import json_headers

TOKENIZE_ROUTE = "/tokenize"
#: Requests counted at once: the route is cheap for the server, but a plan is no reason to
#: take every slot of an endpoint a run may be using.
TOKENIZE_CONCURRENCY = 8
#: Most characters of a server's reply an error quotes (redacted first).
_QUOTED_CHARS = 200


class TokenCountUnavailable(BatchLLMError):
    """The server's token counts could not be had or trusted (the message says why)."""


def tokenize_url(base_url: str) -> str:
    """The route at the server's root: ``http://h:8000/v1`` -> ``http://h:8000/tokenize``
    (vLLM serves it beside ``/v1``, not below); a base URL without ``/v1`` gets it below."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path[:-len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit(parts._replace(path=path + TOKENIZE_ROUTE))


def tokenize_body(request: RowRequest) -> bytes | None:
    """What ``/tokenize`` takes for ``request``: its model and messages (the generation prompt
    added, as a chat completion renders it) or its prompt; None for a body without either
    (an embedding's input, an in-process model's features)."""
    try:
        body = json.loads(request.body)
    except ValueError:
        return None
    if isinstance(body.get("messages"), list):
        return json.dumps({"model": body.get("model"), "messages": body["messages"],
                           "add_generation_prompt": True}).encode()
    if "prompt" in body:
        return json.dumps({"model": body.get("model"), "prompt": body["prompt"]}).encode()
    return None


async def server_token_counts(endpoint: EndpointSpec, requests: Sequence[RowRequest], *,
                              timeout_s: float) -> list[int]:
    """The prompt tokens of each of ``requests`` as ``endpoint``'s ``/tokenize`` counts
    them, in order; :class:`TokenCountUnavailable` where a request has no prompt to count,
    the server does not answer one, or a count is no count within the request's bound."""
    import aiohttp

    url = tokenize_url(endpoint.base_url)
    redact = Redactor.of([endpoint])
    bodies = [tokenize_body(r) for r in requests]
    if None in bodies:
        raise TokenCountUnavailable("a request has no chat messages or prompt to count")
    slots = asyncio.Semaphore(min(TOKENIZE_CONCURRENCY, endpoint.max_concurrency))

    async def count(session: aiohttp.ClientSession, request: RowRequest, body: bytes) -> int:
        async with slots:
            try:
                async with session.post(url, data=body) as response:
                    raw = await response.content.read(64 * 1024)
                    status = response.status
            except asyncio.TimeoutError:
                raise TokenCountUnavailable(
                    f"{url} did not answer within {timeout_s:g} s") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise TokenCountUnavailable(redact(
                    f"{url} could not be reached: {type(exc).__name__}: {exc}")) from None
        text = raw.decode("utf-8", "replace")
        if status != 200:
            raise TokenCountUnavailable(
                f"{url} answered {status}: {redact(text)[:_QUOTED_CHARS]}")
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
        said = reply.get("count") if isinstance(reply, dict) else None
        figure = token_figure(said, default=-1)
        if not 0 <= figure <= prompt_bound(request):
            raise TokenCountUnavailable(
                f"{url} counted {figure_in_words(said)} tokens for a prompt of at most "
                f"{prompt_bound(request)}: not a count the plan can use")
        return figure

    async with aiohttp.ClientSession(headers=json_headers(endpoint),
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        return list(await asyncio.gather(*(count(session, r, b)
                                           for r, b in zip(requests, bodies, strict=True))))


__all__ = ["TOKENIZE_ROUTE", "TokenCountUnavailable", "server_token_counts", "tokenize_body",
           "tokenize_url"]
