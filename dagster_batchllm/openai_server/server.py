"""The server's HTTP side: the aiohttp app, its routes and `serve`.

Routes: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` (validated and
answered by chat.py and embeddings.py, image parts by images.py), ``GET /v1/models``, and the
controller's ``/_admin/{command}`` (`ServingState.control`: stats, reset_stats, configure, kill).

A model request goes: validate (auth, JSON, model, limits) -> build the reply -> `refuse`
(nothing here) -> take one of ``max_concurrency`` slots -> `respond` (the reply). The
simulator's app (`dagster_batchllm.simulator.server`) overrides `refuse` and `respond` with its
rate limits, latency and faults, and adds the Files and Batches routes. Thread mode and the
``python -m`` subprocess (`run_in_foreground`) both run `serve`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .chat import prepare_generation, tokenize_reply
from .embeddings import prepare_embeddings
from .images import ImageReject
from .protocol import Job, Reject, Serving, error_response, responder_failure
from .responder import Responder, load_responder, responder_embedding_models
from .state import ServingState, Tally


@dataclass
class ServerSettings:
    """What is fixed for a server's lifetime; everything changeable is its state's config."""

    host: str = "127.0.0.1"
    port: int = 0
    models: list[str] | None = None  # None: the responder's models()
    max_concurrency: int = 256
    api_key: str | None = None
    responder: Responder | str | None = None  # an object, or "module:attr"
    embedding_models: list[str] | None = None  # None: the responder's, if it embeds


class OpenAIApp:
    """Request handlers of one running server; all that outlives it lives in its state."""

    ADMIN_PREFIX = "/_admin"

    def __init__(self, settings: ServerSettings, state: ServingState):
        responder = self.responder_of(settings.responder)
        self.settings, self.state = settings, state
        self.serving = Serving(
            list(settings.models or responder.models()),
            list(settings.embedding_models or responder_embedding_models(responder)),
            responder, state)
        self.auth = f"Bearer {settings.api_key}" if settings.api_key else None
        self.slots = asyncio.Semaphore(settings.max_concurrency)

    @classmethod
    def responder_of(cls, spec: Responder | str | None) -> Responder:
        """The responder a spec names (a ``"module:attr"`` string is imported)."""
        if spec is None:
            raise ValueError("the server needs a responder")
        return load_responder(spec) if isinstance(spec, str) else spec

    def build(self) -> web.Application:
        app = web.Application()
        self.add_routes(app)
        return app

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.list_models)
        # vLLM's token counter, at the server's root as vLLM serves it (not below /v1)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_route("*", self.ADMIN_PREFIX + "/{command}", self.admin)

    def authorized(self, request: web.Request) -> bool:
        return not self.auth or request.headers.get("Authorization") == self.auth

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.chat, lambda body: prepare_generation(self.serving, body, True))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.chat, lambda body: prepare_generation(self.serving, body, False))

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(
            request, self.state.embeddings, lambda body: prepare_embeddings(self.serving, body))

    async def tokenize(self, request: web.Request) -> web.Response:
        """A prompt's token count, as vLLM's ``/tokenize`` gives it: no model runs, nothing
        is counted as a request in the stats."""
        if not self.authorized(request):
            return self.error(None, None, Reject(401, "Incorrect API key provided.",
                                                 "invalid_api_key"))
        try:
            return web.json_response(tokenize_reply(self.serving, json.loads(
                await request.read())))
        except ValueError:
            return self.error(None, None, Reject(400, "request body is not valid JSON"))
        except Reject as exc:
            return self.error(None, None, exc)

    async def list_models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.error(None, None, Reject(401, "Incorrect API key provided.",
                                                 "invalid_api_key"))
        data = [{"id": m, "object": "model", "owned_by": "dagster-batchllm"}
                for m in [*self.serving.models, *self.serving.embedding_models]]
        return web.json_response({"object": "list", "data": data})

    async def admin(self, request: web.Request) -> web.Response:
        payload = await request.json() if request.body_exists else dict(request.query)
        try:
            result = await self.command(request.match_info["command"], payload)
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        return web.json_response(result)

    async def command(self, name: str, payload: dict) -> dict:
        """One admin command; the state's, here."""
        return self.state.control(name, payload)

    async def _model_request(self, request: web.Request, tally: Tally,
                             prepare: Callable[[object], Job]) -> web.StreamResponse:
        st = self.state
        entry = [time.monotonic(), 0, 0, 0]  # the log row: arrival, status/outcome, usage
        tally.requests += 1
        tally.log.append(entry)
        if st.killed:
            return self.drop(request, entry, "killed")
        if not self.authorized(request):
            return self.error(tally, entry, Reject(401, "Incorrect API key provided.",
                                                   "invalid_api_key"))
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self.error(tally, entry, Reject(400, "request body is not valid JSON"))
        try:
            job = prepare(body)
        except ImageReject as exc:
            st.images.rejected += 1
            return self.error(tally, entry, exc)
        except Reject as exc:
            return self.error(tally, entry, exc)
        except Exception as exc:  # a responder's refusal, or a bug: answer, never hang
            return self.error(tally, entry, responder_failure(exc))
        if getattr(job, "images", None):
            st.images.record(entry, job.images, job.prompt)
        entry[1] = 200
        refused = self.refuse(tally, entry, job)
        if refused is not None:
            return refused
        async with self.slots:
            st.in_flight += 1
            if st.in_flight > st.max_concurrent:
                st.max_concurrent = st.in_flight
            try:
                return await self.respond(request, tally, entry, job)
            finally:
                st.in_flight -= 1

    def refuse(self, tally: Tally, entry: list, job: Job) -> web.Response | None:
        """An answer instead of the reply, decided before the request waits for a slot (it may
        also set what the log row says of the request, ``entry[1]``): none here."""
        return None

    async def respond(self, request: web.Request, tally: Tally, entry: list, job: Job
                      ) -> web.StreamResponse:
        """The answer, while the request holds a slot: the reply."""
        return json_reply(self.counted_reply(tally, entry, job))

    def counted_reply(self, tally: Tally, entry: list, job: Job) -> dict:
        """The reply's body, counted in the stats as an answer to the request."""
        payload, usage = job.render(self.serving)
        self.count_answer(tally, entry, usage)
        tally.count_ok(job.body)
        return payload

    @staticmethod
    def count_answer(tally: Tally, entry: list, usage: dict | None) -> None:
        """A 200 sent, and the usage it carries (chat: prompt and completion tokens;
        embeddings: prompt tokens and inputs)."""
        tally.count_status(200)
        if usage is not None:
            for name, value in usage.items():
                setattr(tally, name, getattr(tally, name) + value)
            entry[2], entry[3] = usage.values()

    @staticmethod
    def drop(request: web.Request, entry: list, why: str) -> web.Response:
        """No HTTP response at all: the connection closed (aiohttp ignores the write error)."""
        entry[1] = why
        if request.transport is not None:
            request.transport.close()
        return web.Response()

    @staticmethod
    def error(tally: Tally | None, entry: list | None, reject: Reject,
              retry_after: float | None = None) -> web.Response:
        if tally is not None and entry is not None:
            tally.count_status(reject.status)
            entry[1] = reject.status
        return error_response(reject.status, reject.body(), retry_after)


def json_reply(payload: dict) -> web.Response:
    return web.Response(body=json.dumps(payload, ensure_ascii=False).encode(),
                        content_type="application/json")


async def serve(app: OpenAIApp, on_ready: Callable[[int], None], stop: asyncio.Event) -> None:
    """Run one server until ``stop`` is set; ``on_ready(port)`` once it accepts connections."""
    # A short shutdown: stop() is how an endpoint is killed, not a graceful drain.
    runner = web.AppRunner(app.build(), access_log=None, handle_signals=False,
                           shutdown_timeout=0.1)
    await runner.setup()
    try:
        site = web.TCPSite(runner, app.settings.host, app.settings.port, backlog=4096,
                           reuse_address=True)
        await site.start()
        on_ready(runner.addresses[0][1])
        await stop.wait()
    finally:
        app.state.killed = True
        await runner.cleanup()


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the process that started us is gone, so a crashed caller leaves no orphan."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            stop.set()
        await asyncio.sleep(0.5)


def run_in_foreground(app: OpenAIApp, parent_pid: int | None = None) -> None:
    """Serve until SIGTERM or SIGINT (or until ``parent_pid`` is gone), printing the base URL on
    one line once it accepts connections: what a ``python -m`` server process runs."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if parent_pid:
            loop.create_task(watch_parent(parent_pid, stop))

        def on_ready(port: int) -> None:
            print(f"http://{app.settings.host}:{port}/v1", flush=True)

        await serve(app, on_ready, stop)

    runner: Any
    try:
        import uvloop  # optional: a faster loop when the environment has it
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    runner(main())
