"""The simulated endpoint's HTTP side: the aiohttp app and `serve`.

One request goes: validate (auth, JSON, model, context length) -> build the reply ->
rate-limit window -> scripted or random outcome -> take a slot and sleep ``latency_s``
-> answer with that outcome. Thread mode and the ``python -m dagster_batchllm.simulator``
subprocess both run `serve`; the controller changes a running server only through the
``/_sim/{command}`` admin routes, which call `state.control`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from .responders import EchoResponder, Responder, content_text, load_responder
from .state import SimState, control, tokens

DEFAULT_MAX_TOKENS = 256
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
# A body cut mid-object, as a broken proxy would send it.
MALFORMED_BODY = b'{"id": "chatcmpl-sim", "object": "chat.completion", "choices": [{"ind'
BAD_STRUCTURED = '{"sim": "bad_structured", "value": '
STALL_POLL_S = 0.05


@dataclass
class ServerSettings:
    """What is fixed for a server's lifetime; everything changeable is `SimState.config`."""

    host: str = "127.0.0.1"
    port: int = 0
    models: list[str] | None = None  # None: the responder's models()
    max_concurrency: int = 256
    api_key: str | None = None
    responder: Responder | str | None = None


class _Reject(Exception):
    def __init__(self, status: int, message: str, code: str | int | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


class _App:
    """Request handlers of one running server; all state lives in `SimState`."""

    def __init__(self, settings: ServerSettings, state: SimState):
        responder = settings.responder or EchoResponder()
        self.responder = load_responder(responder) if isinstance(responder, str) else responder
        self.models = list(settings.models or self.responder.models())
        self.auth = f"Bearer {settings.api_key}" if settings.api_key else None
        self.slots = asyncio.Semaphore(settings.max_concurrency)
        self.state = state
        self.ids = itertools.count(1)

    def build(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_route("*", "/_sim/{command}", self.admin)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def list_models(self, request: web.Request) -> web.Response:
        if self.auth and request.headers.get("Authorization") != self.auth:
            return self._error(None, 401, "Incorrect API key provided.", "invalid_api_key")
        data = [{"id": m, "object": "model", "owned_by": "dagster-batchllm-sim"}
                for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def admin(self, request: web.Request) -> web.Response:
        payload = await request.json() if request.body_exists else dict(request.query)
        try:
            result = control(self.state, request.match_info["command"], payload)
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        return web.json_response(result)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        st = self.state
        entry = [time.monotonic(), 0, 0, 0]  # the log row: arrival, status/outcome, tokens
        st.requests += 1
        st.log.append(entry)
        if st.killed:
            return self._drop(request, entry, "killed")
        if self.auth and request.headers.get("Authorization") != self.auth:
            return self._error(entry, 401, "Incorrect API key provided.", "invalid_api_key")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._error(entry, 400, "request body is not valid JSON")
        try:
            model, prompt_tokens, text, finish, n = self._prepare(body, chat)
        except _Reject as exc:
            return self._error(entry, exc.status, exc.message, exc.code)
        except Exception as exc:  # a broken responder must answer, not hang the client
            return self._error(entry, 500, f"responder failed: {type(exc).__name__}: {exc}")

        wait = st.admit(entry[0], prompt_tokens + tokens(text) * n)
        if wait is not None:
            message = "Rate limit reached for requests or tokens per minute (simulated)."
            return self._error(entry, 429, message, "rate_limit_exceeded", retry_after=wait)
        outcome = st.next_outcome()
        entry[1] = 200 if outcome == "ok" else outcome
        async with self.slots:
            st.in_flight += 1
            if st.in_flight > st.max_concurrent:
                st.max_concurrent = st.in_flight
            try:
                latency = st.config["latency_s"]
                if latency > 0:
                    await asyncio.sleep(latency)
                if st.killed:
                    return self._drop(request, entry, "killed")
                if request.transport is None or request.transport.is_closing():
                    entry[1] = "abandoned"  # the client gave up: nothing was delivered
                    return web.Response()
                return await self._answer(request, entry, outcome, body, chat, model,
                                          prompt_tokens, text, finish, n)
            finally:
                st.in_flight -= 1

    def _prepare(self, body: object, chat: bool) -> tuple[str, int, str, str, int]:
        """Validate a request and build its reply text (cut to max_tokens unless structured)."""
        if not isinstance(body, dict):
            raise _Reject(400, "request body must be a JSON object")
        model = body.get("model")
        if model not in self.models:
            raise _Reject(404, f"The model `{model}` does not exist.", 404)
        if body.get("stream"):
            raise _Reject(400, "streaming not supported by the simulated endpoint")
        if chat:
            raw = body.get("messages")
            if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
                raise _Reject(400, "'messages' must be a non-empty list of objects")
            messages = [{"role": m.get("role", "user"), "content": content_text(m.get("content"))}
                        for m in raw]
            prompt_tokens = sum(tokens(m["content"]) + 4 for m in messages)
            params = {k: v for k, v in body.items() if k not in ("model", "messages")}
        else:
            prompt = body.get("prompt", "")
            prompt = "\n".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
            messages = [{"role": "user", "content": prompt}]
            prompt_tokens = tokens(prompt)
            params = {k: v for k, v in body.items() if k not in ("model", "prompt")}
        requested = body.get("max_completion_tokens")
        if requested is None:
            requested = body.get("max_tokens")
        if requested is not None and (type(requested) is not int or requested < 0):
            raise _Reject(400, "max_tokens must be an integer")
        limit = self.state.config["max_context_tokens"]
        if limit and (prompt_tokens + (requested or 0) > limit or prompt_tokens >= limit):
            asked = prompt_tokens + (requested or 0)
            raise _Reject(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{asked} tokens ({prompt_tokens} in the messages, {requested or 0} in the "
                "completion). Please reduce the length of the messages or completion.",
                "context_length_exceeded",
            )
        if requested is None:  # like vLLM: what is left of the context, capped by our default
            requested = DEFAULT_MAX_TOKENS
            if limit:
                requested = min(requested, limit - prompt_tokens)
        text = self.responder.respond(model, messages, params)
        fmt = body.get("response_format")
        structured = isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")
        finish = "stop"
        if not structured and tokens(text) > requested:
            text, finish = text[: max(requested, 0) * 4], "length"
        n = body.get("n") or 1
        return model, prompt_tokens, text, finish, n if isinstance(n, int) and n > 0 else 1

    async def _answer(self, request, entry, outcome, body, chat, model,
                      prompt_tokens, text, finish, n) -> web.StreamResponse:
        st = self.state
        if isinstance(outcome, int):
            retry = st.config["retry_after_s"] if outcome == 429 else None
            return self._error(entry, outcome, f"simulated {outcome} error", retry_after=retry)
        if outcome == "drop":
            st.dropped += 1
            return self._drop(request, entry, "drop")
        if outcome == "malformed":
            st.count_status(200)
            return web.Response(body=MALFORMED_BODY, content_type="application/json")
        if outcome == "empty":
            text, finish = "", "stop"
        elif outcome == "bad_structured":
            text, finish = BAD_STRUCTURED, "stop"
        completion_tokens = tokens(text) * n
        payload = self._payload(chat, model, text, finish, n, prompt_tokens, completion_tokens)
        if outcome == "no_choices":
            del payload["choices"], payload["usage"]
        data = json.dumps(payload, ensure_ascii=False).encode()
        if outcome == "stall":
            return await self._stall(request, data)
        st.count_status(200)
        if outcome != "no_choices":
            st.prompt_tokens += prompt_tokens
            st.completion_tokens += completion_tokens
            entry[2], entry[3] = prompt_tokens, completion_tokens
        if outcome == "ok":
            st.ok += 1
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            key = hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()
            if key in st.answered:
                st.duplicates += 1
            else:
                st.answered.add(key)
        return web.Response(body=data, content_type="application/json")

    def _payload(self, chat, model, text, finish, n, prompt_tokens, completion_tokens) -> dict:
        if chat:
            kind, prefix = "chat.completion", "chatcmpl-sim"
            choices = [{"index": i, "message": {"role": "assistant", "content": text},
                        "finish_reason": finish, "logprobs": None} for i in range(n)]
        else:
            kind, prefix = "text_completion", "cmpl-sim"
            choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None}
                       for i in range(n)]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        return {"id": f"{prefix}{next(self.ids)}", "object": kind, "created": int(time.time()),
                "model": model, "choices": choices, "usage": usage}

    async def _stall(self, request: web.Request, data: bytes) -> web.StreamResponse:
        """Send headers and half the body, then wait until the client gives up or we stop."""
        st = self.state
        st.stalled += 1
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        # Without handler cancellation, a closed transport is how we see the client give up.
        while not st.killed and request.transport and not request.transport.is_closing():
            await asyncio.sleep(STALL_POLL_S)
        if request.transport is not None:
            request.transport.close()
        return response

    def _drop(self, request: web.Request, entry: list, why: str) -> web.Response:
        entry[1] = why
        if request.transport is not None:
            request.transport.close()  # no HTTP response at all; aiohttp ignores the write error
        return web.Response()

    def _error(self, entry, status, message, code=None, retry_after=None) -> web.Response:
        if entry is not None:
            self.state.count_status(status)
            entry[1] = status
        headers = None
        if retry_after is not None:
            headers = {"Retry-After": _seconds(retry_after),
                       "retry-after-ms": str(max(1, round(retry_after * 1000)))}
        error = {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": None,
                 "code": status if code is None else code}
        return web.Response(status=status, body=json.dumps({"error": error}).encode(),
                            content_type="application/json", headers=headers)


async def serve(settings: ServerSettings, state: SimState, on_ready: Callable[[int], None],
                stop: asyncio.Event) -> None:
    """Run one server until ``stop`` is set; ``on_ready(port)`` once it accepts connections."""
    app = _App(settings, state).build()
    # A short shutdown: stop() is how tests kill an endpoint, not a graceful drain.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, backlog=4096, reuse_address=True)
        await site.start()
        on_ready(runner.addresses[0][1])
        await stop.wait()
    finally:
        state.killed = True
        await runner.cleanup()


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the process that started us is gone, so a crashed test leaves no orphan."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            stop.set()
        await asyncio.sleep(0.5)
