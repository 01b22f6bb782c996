"""The simulated endpoint's HTTP side: the aiohttp app, its routing and `serve`.

A model request (chat, completions, embeddings) goes: validate (auth, JSON, model, limits)
-> build the reply -> rate-limit window -> scripted or random outcome -> take a slot and
sleep the latency -> answer with that outcome. What each API validates and answers lives
in its module (chat.py, embeddings.py, images.py); the Files and Batches API in
batch_api.py, Anthropic's Message Batches in anthropic_batches.py, their lifecycle in
batch_runner.py. Thread mode and the
``python -m dagster_batchllm.simulator`` subprocess both run `serve`; the controller changes
a running server only through the ``/_sim/{command}`` admin routes, which call
`state.control` (or the batch runner, for the commands that process lines).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from .anthropic_batches import MAX_BODY_BYTES, AnthropicBatches
from .batch_api import BatchApi
from .batch_runner import BatchRunner
from .chat import prepare_generation
from .embeddings import prepare_embeddings
from .images import ImageReject
from .misbehaving import echo_middleware, huge_reply
from .protocol import Job, Reject, Serving, error_response, responder_failure
from .responders import EchoResponder, Responder, load_responder, responder_embedding_models
from .state import SERVER_COMMANDS, SimState, Tally, control

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
    embedding_models: list[str] | None = None  # None: the responder's, if it embeds


class _App:
    """Request handlers of one running server; all state lives in `SimState`."""

    def __init__(self, settings: ServerSettings, state: SimState):
        responder = settings.responder or EchoResponder()
        responder = load_responder(responder) if isinstance(responder, str) else responder
        self.serving = Serving(
            list(settings.models or responder.models()),
            list(settings.embedding_models or responder_embedding_models(responder)),
            responder, state)
        self.auth = f"Bearer {settings.api_key}" if settings.api_key else None
        self.api_key = settings.api_key  # (Anthropic's routes read it from x-api-key)
        self.slots = asyncio.Semaphore(settings.max_concurrency)
        self.state = state
        self.runner = BatchRunner(self.serving)
        self.runner.api_key = settings.api_key  # (quoted by its line errors: echo_credentials)

    def build(self) -> web.Application:
        # (Anthropic's batches come inline, up to 256 MB in one create call)
        app = web.Application(client_max_size=MAX_BODY_BYTES,
                              middlewares=[echo_middleware(self.state)])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.list_models)
        BatchApi(self.state, self.authorized, self.runner).add_routes(app.router)
        AnthropicBatches(self.state, self.api_key, self.runner).add_routes(app.router)
        app.router.add_route("*", "/_sim/{command}", self.admin)
        return app

    def authorized(self, request: web.Request) -> bool:
        return not self.auth or request.headers.get("Authorization") == self.auth

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.chat, lambda body: prepare_generation(self.serving, body, True),
            "latency_s")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.chat, lambda body: prepare_generation(self.serving, body, False),
            "latency_s")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.embeddings, lambda body: prepare_embeddings(self.serving, body),
            "embedding_latency_s")

    async def list_models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self._error(None, None, Reject(401, "Incorrect API key provided.",
                                                  "invalid_api_key"))
        data = [{"id": m, "object": "model", "owned_by": "dagster-batchllm-sim"}
                for m in [*self.serving.models, *self.serving.embedding_models]]
        return web.json_response({"object": "list", "data": data})

    async def admin(self, request: web.Request) -> web.Response:
        payload = await request.json() if request.body_exists else dict(request.query)
        name = request.match_info["command"]
        try:
            if name in SERVER_COMMANDS:
                result = await self.runner.command(name, payload)
            else:
                result = control(self.state, name, payload)
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        return web.json_response(result)

    async def _model_request(self, request: web.Request, tally: Tally,
                             prepare: Callable[[object], Job], latency_key: str
                             ) -> web.StreamResponse:
        st = self.state
        entry = [time.monotonic(), 0, 0, 0]  # the log row: arrival, status/outcome, usage
        tally.requests += 1
        tally.log.append(entry)
        if st.killed:
            return self._drop(request, entry, "killed")
        if not self.authorized(request):
            return self._error(tally, entry, Reject(401, "Incorrect API key provided.",
                                                    "invalid_api_key"))
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._error(tally, entry, Reject(400, "request body is not valid JSON"))
        try:
            job = prepare(body)
        except ImageReject as exc:
            st.images.rejected += 1
            return self._error(tally, entry, exc)
        except Reject as exc:
            return self._error(tally, entry, exc)
        except Exception as exc:  # a responder's refusal, or a bug: answer, never hang
            return self._error(tally, entry, responder_failure(exc))
        if getattr(job, "images", None):
            st.images.record(entry, job.images, job.prompt)

        wait = st.admit(entry[0], job.cost)
        if wait is not None:
            message = "Rate limit reached for requests or tokens per minute (simulated)."
            return self._error(tally, entry, Reject(429, message, "rate_limit_exceeded"),
                               retry_after=wait)
        outcome = st.next_outcome()
        entry[1] = 200 if outcome == "ok" else outcome
        async with self.slots:
            st.in_flight += 1
            if st.in_flight > st.max_concurrent:
                st.max_concurrent = st.in_flight
            try:
                latency = st.config[latency_key]
                if latency is None:
                    latency = st.config["latency_s"]
                latency += getattr(job, "prefill_s", 0.0)  # a chat prompt's uncached tokens
                if latency > 0:
                    await asyncio.sleep(latency)
                if st.killed:
                    return self._drop(request, entry, "killed")
                if request.transport is None or request.transport.is_closing():
                    entry[1] = "abandoned"  # the client gave up: nothing was delivered
                    return web.Response()
                return await self._answer(request, tally, entry, outcome, job)
            finally:
                st.in_flight -= 1

    async def _answer(self, request: web.Request, tally: Tally, entry: list,
                      outcome: int | str, job: Job) -> web.StreamResponse:
        st = self.state
        if isinstance(outcome, int):
            retry = st.config["retry_after_s"] if outcome == 429 else None
            return self._error(tally, entry, Reject(outcome, f"simulated {outcome} error"),
                               retry_after=retry)
        if outcome == "drop":
            tally.dropped += 1
            return self._drop(request, entry, "drop")
        if outcome == "malformed":
            tally.count_status(200)
            return web.Response(body=job.malformed, content_type="application/json")
        payload, usage = job.render(self.serving, outcome)
        data = json.dumps(payload, ensure_ascii=False).encode()
        if outcome == "stall":
            tally.stalled += 1
            return await self._stall(request, data)
        if outcome == "drop_mid_body":
            tally.dropped += 1
            return await self._drop_mid_body(request, data)
        tally.count_status(200)
        if usage is not None:  # chat: prompt and completion tokens; embeddings: prompt, inputs
            for name, value in usage.items():
                setattr(tally, name, getattr(tally, name) + value)
            entry[2], entry[3] = usage.values()
        if outcome == "ok":
            tally.count_ok(job.body)
        if st.config["huge_reply_bytes"]:
            return await huge_reply(request, payload, st.config["huge_reply_bytes"],
                                    st.config["huge_reply_declared"])
        return web.Response(body=data, content_type="application/json")

    async def _stall(self, request: web.Request, data: bytes) -> web.StreamResponse:
        """Send headers and half the body, then wait until the client gives up or we stop."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        # Without handler cancellation, a closed transport is how we see the client give up.
        while not self.state.killed and request.transport and not request.transport.is_closing():
            await asyncio.sleep(STALL_POLL_S)
        if request.transport is not None:
            request.transport.close()
        return response

    async def _drop_mid_body(self, request: web.Request, data: bytes) -> web.StreamResponse:
        """200 headers announcing the whole body, half of it, then the connection closed: a
        proxy or server that dies while it answers."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        if request.transport is not None:
            request.transport.close()
        return response

    def _drop(self, request: web.Request, entry: list, why: str) -> web.Response:
        entry[1] = why
        if request.transport is not None:
            request.transport.close()  # no HTTP response at all; aiohttp ignores the write error
        return web.Response()

    def _error(self, tally: Tally | None, entry: list | None, reject: Reject,
               retry_after: float | None = None) -> web.Response:
        if tally is not None and entry is not None:
            tally.count_status(reject.status)
            entry[1] = reject.status
        return error_response(reject.status, reject.body(), retry_after)


async def serve(settings: ServerSettings, state: SimState, on_ready: Callable[[int], None],
                stop: asyncio.Event) -> None:
    """Run one server until ``stop`` is set; ``on_ready(port)`` once it accepts connections.

    Without a batch-file directory in the state (a standalone run), files go to a temp dir
    removed when the server stops.
    """
    scratch = None
    if state.store.directory is None:
        scratch = tempfile.TemporaryDirectory(prefix="batchllm-sim-files-")
        state.store.directory = scratch.name
    app_handlers = _App(settings, state)
    # A short shutdown: stop() is how tests kill an endpoint, not a graceful drain.
    runner = web.AppRunner(app_handlers.build(), access_log=None, handle_signals=False,
                           shutdown_timeout=0.1)
    await runner.setup()
    driver = asyncio.get_running_loop().create_task(app_handlers.runner.drive())
    try:
        site = web.TCPSite(runner, settings.host, settings.port, backlog=4096, reuse_address=True)
        await site.start()
        on_ready(runner.addresses[0][1])
        await stop.wait()
    finally:
        state.killed = True
        driver.cancel()
        await runner.cleanup()
        if scratch is not None:
            state.store.directory = None
            scratch.cleanup()
        try:
            await driver  # re-raises what the driver died of, if anything but our cancel
        except asyncio.CancelledError:
            pass


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the process that started us is gone, so a crashed test leaves no orphan."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            stop.set()
        await asyncio.sleep(0.5)
