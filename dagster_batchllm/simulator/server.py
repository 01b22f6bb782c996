"""The simulated endpoint's HTTP side: the server's app (`dagster_batchllm.openai_server.server`)
with latency, rate limits, fault injection and the batch APIs.

A model request goes: validate (auth, JSON, model, limits) -> build the reply -> rate-limit
window -> scripted or random outcome -> take a slot and sleep the latency -> answer with that
outcome. What each API validates and answers lives in the server's modules (chat, embeddings,
images); the Files and Batches API in batch_api.py, Anthropic's Message Batches in
anthropic_batches.py, their lifecycle in batch_runner.py. Thread mode and the
``python -m dagster_batchllm.simulator`` subprocess both run the server's `serve`; the
controller changes a running server only through the ``/_sim/{command}`` admin routes, which
call `SimState.control` (or the batch runner, for the commands that process lines).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import replace

from aiohttp import web

from ..openai_server.chat import Generation
from ..openai_server.embeddings import EmbeddingJob
from ..openai_server.protocol import Job, Reject, Serving
from ..openai_server.responder import Responder
from ..openai_server.server import OpenAIApp, ServerSettings, json_reply
from ..openai_server.state import Tally
from .anthropic_batches import MAX_BODY_BYTES, AnthropicBatches
from .batch_api import BatchApi
from .batch_runner import BatchRunner
from .misbehaving import echo_middleware, huge_reply
from .responders import EchoResponder
from .state import SERVER_COMMANDS, SimState

STALL_POLL_S = 0.05
# Bodies cut mid-object, as a broken proxy would send them (the "malformed" fault).
MALFORMED_CHAT = b'{"id": "chatcmpl-sim", "object": "chat.completion", "choices": [{"ind'
MALFORMED_EMBEDDINGS = b'{"object": "list", "data": [{"object": "embedding", "ind'
BAD_STRUCTURED = '{"sim": "bad_structured", "value": '


class SimApp(OpenAIApp):
    """Request handlers of one running simulated server; all state lives in `SimState`."""

    ADMIN_PREFIX = "/_sim"
    state: SimState

    def __init__(self, settings: ServerSettings, state: SimState):
        super().__init__(settings, state)
        self.api_key = settings.api_key  # (Anthropic's routes read it from x-api-key)
        self.runner = BatchRunner(self.serving)
        self.runner.api_key = settings.api_key  # (quoted by its line errors: echo_credentials)
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._driver: asyncio.Task | None = None

    @classmethod
    def responder_of(cls, spec: Responder | str | None) -> Responder:
        return EchoResponder() if spec is None else super().responder_of(spec)

    def build(self) -> web.Application:
        # (Anthropic's batches come inline, up to 256 MB in one create call)
        app = web.Application(client_max_size=MAX_BODY_BYTES,
                              middlewares=[echo_middleware(self.state)])
        self.add_routes(app)
        BatchApi(self.state, self.authorized, self.runner).add_routes(app.router)
        AnthropicBatches(self.state, self.api_key, self.runner).add_routes(app.router)
        app.on_startup.append(self._start_batches)
        app.on_cleanup.append(self._stop_batches)
        return app

    async def _start_batches(self, app: web.Application) -> None:
        """Without a batch-file directory in the state (a standalone run), files go to a temp
        dir removed when the server stops; the batch runner drives batches in the background."""
        if self.state.store.directory is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="batchllm-sim-files-")
            self.state.store.directory = self._scratch.name
        self._driver = asyncio.get_running_loop().create_task(self.runner.drive())

    async def _stop_batches(self, app: web.Application) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.cancel()
        if self._scratch is not None:
            self.state.store.directory = None
            self._scratch.cleanup()
            self._scratch = None
        try:
            if driver is not None:
                await driver  # re-raises what the driver died of, if anything but our cancel
        except asyncio.CancelledError:
            pass

    async def command(self, name: str, payload: dict) -> dict:
        if name in SERVER_COMMANDS:
            return await self.runner.command(name, payload)
        return await super().command(name, payload)

    def refuse(self, tally: Tally, entry: list, job: Job) -> web.Response | None:
        """A server-side rate limit's 429; else the outcome the script or the fault rates give
        the request, in its log row."""
        wait = self.state.admit(entry[0], job.cost)
        if wait is not None:
            message = "Rate limit reached for requests or tokens per minute (simulated)."
            return self.error(tally, entry, Reject(429, message, "rate_limit_exceeded"),
                              retry_after=wait)
        outcome = self.state.next_outcome()
        entry[1] = 200 if outcome == "ok" else outcome
        return None

    async def respond(self, request: web.Request, tally: Tally, entry: list, job: Job
                      ) -> web.StreamResponse:
        st = self.state
        outcome = "ok" if entry[1] == 200 else entry[1]
        latency = st.config["embedding_latency_s" if isinstance(job, EmbeddingJob) else
                            "latency_s"]
        if latency is None:
            latency = st.config["latency_s"]
        latency += getattr(job, "prefill_s", 0.0)  # a chat prompt's uncached tokens
        if latency > 0:
            await asyncio.sleep(latency)
        if st.killed:
            return self.drop(request, entry, "killed")
        if request.transport is None or request.transport.is_closing():
            entry[1] = "abandoned"  # the client gave up: nothing was delivered
            return web.Response()
        return await self._answer(request, tally, entry, outcome, job)

    async def _answer(self, request: web.Request, tally: Tally, entry: list,
                      outcome: int | str, job: Job) -> web.StreamResponse:
        st = self.state
        if isinstance(outcome, int):
            retry = st.config["retry_after_s"] if outcome == 429 else None
            return self.error(tally, entry, Reject(outcome, f"simulated {outcome} error"),
                              retry_after=retry)
        if outcome == "drop":
            tally.dropped += 1
            return self.drop(request, entry, "drop")
        if outcome == "malformed":
            tally.count_status(200)
            body = MALFORMED_EMBEDDINGS if isinstance(job, EmbeddingJob) else MALFORMED_CHAT
            return web.Response(body=body, content_type="application/json")
        if outcome == "ok":
            payload = self.counted_reply(tally, entry, job)
        else:
            payload, usage = broken_reply(job, self.serving, outcome)
            if outcome in ("stall", "drop_mid_body"):
                data = json.dumps(payload, ensure_ascii=False).encode()
                if outcome == "stall":
                    tally.stalled += 1
                    return await self._stall(request, data)
                tally.dropped += 1
                return await self._drop_mid_body(request, data)
            self.count_answer(tally, entry, usage)
        if st.config["huge_reply_bytes"]:
            return await huge_reply(request, payload, st.config["huge_reply_bytes"],
                                    st.config["huge_reply_declared"])
        return json_reply(payload)

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


def broken_reply(job: Job, serving: Serving, outcome: str) -> tuple[dict, dict | None]:
    """The body of a broken-but-200 outcome and the usage counted for it: "empty" (chat: content
    ""; embeddings: an empty ``data`` list), "bad_structured" (chat: content that is not JSON;
    embeddings: vectors of half the size), "no_choices" (no ``choices``, or ``data``, nor
    usage); "stall" and "drop_mid_body" send part of a plain reply."""
    if isinstance(job, Generation):
        if outcome in ("empty", "bad_structured"):
            text = "" if outcome == "empty" else BAD_STRUCTURED
            return replace(job, text=text, finish="stop", logprobs=None).render(serving)
        payload, usage = replace(job, logprobs=None).render(serving)
        if outcome == "no_choices":
            del payload["choices"], payload["usage"]
            return payload, None
        return payload, usage
    if isinstance(job, EmbeddingJob) and outcome == "bad_structured":
        half = job.dimensions // 2
        return replace(job, dimensions=half,
                       vectors=[v[: 4 * half] for v in job.packed_vectors()]).render(serving)
    payload, usage = job.render(serving)
    if outcome == "no_choices":  # like chat's: neither the vectors nor usage
        del payload["data"], payload["usage"]
        return payload, None
    if outcome == "empty":
        payload["data"] = []
    return payload, usage
