"""`SimulatedEndpoint`: start, stop and steer a simulated OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import atexit
import http.client
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from .clients import stop_process
from .responders import EchoResponder, Responder, load_responder, responder_embedding_models
from .server import ServerSettings, serve
from .state import BATCH_STAGES, DEFAULT_CONFIG, SimState, control, normalize_outcome

API_KEY_ENV = "DAGSTER_BATCHLLM_SIM_API_KEY"  # the key travels by env, never on a command line
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_LIVE: weakref.WeakSet = weakref.WeakSet()


class SimulatedEndpoint:
    """A real HTTP server on 127.0.0.1 speaking the OpenAI protocol, with fault injection.

    ``process=False`` runs it on a daemon thread with its own event loop; ``process=True``
    runs ``python -m dagster_batchllm.simulator`` so it does not share the client's GIL.
    Faults, settings and stats go through the ``/_sim/`` admin routes in both modes, and
    survive `restart` (so do the duplicate counts).

    Example::

        import openai
        from dagster_batchllm.testing import SimulatedEndpoint

        with SimulatedEndpoint(latency_s=0.01) as sim:
            client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
            messages = [{"role": "user", "content": "hello"}]
            sim.script(429)  # the next request gets a 429, then normal answers
            try:
                client.chat.completions.create(model="sim-model", messages=messages)
            except openai.RateLimitError:
                pass
            reply = client.chat.completions.create(model="sim-model", messages=messages)
            assert reply.choices[0].message.content == "[sim] hello"
            assert sim.stats()["by_status"] == {"429": 1, "200": 1}

    Besides chat and completions it serves ``/v1/embeddings`` for ``embedding_models``
    (see `dagster_batchllm.simulator.embeddings`; the fault script, random fault rates,
    rate-limit windows, auth and ``max_concurrency`` cover it too, its latency is
    ``embedding_latency_s`` or else ``latency_s``), image parts in chat messages (see
    `dagster_batchllm.simulator.images`) and the Files and Batches API (see
    `dagster_batchllm.simulator.batch_runner`; its calls and its lines have scripts of
    their own): ``batch_stage_s`` is how long a batch stays in each stage, None to hold it
    there until `advance_batches`. Anthropic's Message Batches (``/v1/messages/batches``, for
    ``anthropic.Anthropic(base_url=<base_url without /v1>)``; see
    `dagster_batchllm.simulator.anthropic_batches`) run through the same lifecycle, scripts
    and controls. ``prefix_cache_tokens`` gives it vLLM's prefix cache of that many tokens
    (see `dagster_batchllm.simulator.prefix_cache`; 0, the default, has none): replies report
    ``usage.prompt_tokens_details.cached_tokens`` and ``stats()["prefix_cache"]`` the totals;
    ``prefill_s_per_token`` adds latency per prompt token not cached. Files live in a temp
    dir of this endpoint's, removed when it is garbage-collected or the interpreter exits.
    """

    def __init__(
        self,
        models: tuple[str, ...] | list[str] | None = ("sim-model",),
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        max_concurrency: int = 256,
        max_context_tokens: int | None = None,
        api_key: str | None = None,
        responder: Responder | str | None = None,
        process: bool = False,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        rate_limit_window_s: float = 60.0,
        seed: int = 0,
        embedding_models: tuple[str, ...] | list[str] | None = None,
        embedding_dimensions: int = 384,
        max_inputs_per_request: int = 2048,
        embedding_base64: bool = True,
        max_image_bytes: int | None = 20 * 1024 * 1024,
        batch_stage_s: float | None = 0.0,
        prefix_cache_tokens: int = 0,
        prefill_s_per_token: float = 0.0,
    ):
        if process and responder is not None and not isinstance(responder, str):
            raise TypeError("process=True needs the responder as a 'module:attr' string")
        # Explicit models win; models=None serves what the responder's models() lists.
        self.settings = ServerSettings(host, port, list(models) if models else None,
                                       max_concurrency, api_key, responder,
                                       list(embedding_models) if embedding_models else None)
        self.process = process
        self.port = port
        self._state: SimState = SimState({
            "latency_s": latency_s, "max_context_tokens": max_context_tokens, "seed": seed,
            "requests_per_minute": requests_per_minute, "tokens_per_minute": tokens_per_minute,
            "rate_limit_window_s": rate_limit_window_s,
            "embedding_dimensions": embedding_dimensions,
            "max_inputs_per_request": max_inputs_per_request,
            "embedding_base64": embedding_base64, "max_image_bytes": max_image_bytes,
            "prefix_cache_tokens": prefix_cache_tokens, "prefill_s_per_token": prefill_s_per_token,
            **dict.fromkeys(BATCH_STAGES, batch_stage_s),
        })
        self._files_dir: tempfile.TemporaryDirectory | None = None
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop_thread = None
        self._proc: subprocess.Popen | None = None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._thread is not None and self._thread.is_alive()

    @property
    def models(self) -> list[str]:
        """The model names it serves (what /v1/models lists)."""
        if self.settings.models:
            return list(self.settings.models)
        responder = self.settings.responder or EchoResponder()
        return list((load_responder(responder) if isinstance(responder, str)
                     else responder).models())

    @property
    def embedding_models(self) -> list[str]:
        """The models it serves on /v1/embeddings (by default, those of a responder that
        embeds: see `dagster_batchllm.simulator.embeddings`)."""
        if self.settings.embedding_models:
            return list(self.settings.embedding_models)
        return responder_embedding_models(self.settings.responder)

    @property
    def base_url(self) -> str:
        return f"http://{self._connect_host}:{self.port}/v1"

    @property
    def _connect_host(self) -> str:
        return "127.0.0.1" if self.settings.host in ("", "0.0.0.0") else self.settings.host

    def start(self) -> SimulatedEndpoint:
        with self._lock:
            if self.running:
                return self
            self._state.killed = False
            if self._state.store.directory is None:  # kept across restarts, with the batches
                self._files_dir = tempfile.TemporaryDirectory(prefix="batchllm-sim-files-")
                self._state.store.directory = self._files_dir.name
            if self.process:
                self._start_process()
            else:
                self._start_thread()
            self.settings.port = self.port  # restart() binds the same port
            _LIVE.add(self)
        return self

    def stop(self) -> None:
        """Kill the server: in-flight requests get no answer, new connections are refused."""
        with self._lock:
            if self._thread is None and self._proc is None:
                return
            try:  # a thread server shares self._state, so only a subprocess exports it
                exported = self._admin("kill", {"export": self.process}) if self.running else None
            except OSError:
                exported = None  # the process died; keep the last state we knew
            if self._proc is not None:
                self._halt_process()
                if exported is not None:
                    self._state = SimState.from_export(exported)
            else:
                try:
                    self._stop_thread()
                except RuntimeError:
                    pass  # its loop already ended
                self._thread.join(timeout=10)
                self._thread = None
            self._state.killed = False
            _LIVE.discard(self)

    def restart(self) -> SimulatedEndpoint:
        self.stop()
        return self.start()

    def __enter__(self) -> SimulatedEndpoint:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- control ---------------------------------------------------------------------

    def script(self, *outcomes: int | str) -> None:
        """The next len(outcomes) valid model requests (chat, completions, embeddings) get
        these outcomes in order.

        Outcomes: 200/"ok"; an HTTP error status (429 carries Retry-After: retry_after_s);
        "drop" (close the connection, no response); "malformed" (200, body cut mid-JSON);
        "no_choices" (200, JSON without choices); "empty" (200, content ""); "bad_structured"
        (200, content that is not JSON); "stall" (200 headers and half the body, then
        nothing until the client gives up; it holds its slot meanwhile); "drop_mid_body"
        (200 headers and half the body, then the connection closed). Every outcome
        first holds a slot for latency_s. Requests rejected before that (auth, unknown
        model, context length, server-side rate limit) do not consume the script.
        """
        self._control("script", {"outcomes": [normalize_outcome(o) for o in outcomes]})

    def script_batch_api(self, *outcomes: int | str) -> None:
        """The next Files/Batches API calls get these outcomes: an HTTP error status (and no
        effect), "ok", or "drop" (the call takes effect, then the connection closes unanswered:
        e.g. a batch the client never hears was created)."""
        self._control("script", {"outcomes": [normalize_outcome(o, "batch_api") for o in outcomes],
                                 "target": "batch_api"})

    def script_batch_lines(self, *outcomes: int | str) -> None:
        """The next batch lines answered (over all batches, in order) get these outcomes: an
        HTTP error status (the line goes to the error file) or 200/"ok". After the script,
        ``batch_line_error_rate`` of lines get ``batch_line_error_status``."""
        self._control("script", {"outcomes": [normalize_outcome(o, "batch_lines")
                                              for o in outcomes], "target": "batch_lines"})

    # -- batches ---------------------------------------------------------------------

    def batches(self) -> list[dict]:
        """Every batch as ``client.batches.retrieve`` returns it, newest first, plus
        ``lines_read`` (input lines answered or expired so far)."""
        return self._control("batches", {})["data"]

    def files(self) -> list[dict]:
        """Every file, uploaded or written by a batch, newest first."""
        return self._control("files", {})["data"]

    def advance_batches(self, batch_id: str | None = None, lines: int | None = None
                        ) -> list[dict]:
        """Move each unfinished batch (or just ``batch_id``) on by one stage, or answer
        ``lines`` more of its lines if in progress, then do what became due; the batches after.

        With ``batch_stage_s=None`` this is the only way batches move, so a test controls
        every step; with the default 0 one call runs a batch to its end.
        """
        return self._control("advance_batches", {"batch_id": batch_id, "lines": lines})["data"]

    def complete_batches(self, batch_id: str | None = None) -> list[dict]:
        """Advance stage by stage until each unfinished batch (or ``batch_id``) is done."""
        return self._control("advance_batches",
                             {"batch_id": batch_id, "until_done": True})["data"]

    def expire_batches(self, batch_id: str | None = None) -> list[dict]:
        """Expire each unfinished batch (or ``batch_id``) now: its output keeps the lines
        answered so far, its error file lists the others as ``batch_expired``."""
        return self._control("expire_batches", {"batch_id": batch_id})["data"]

    def configure(self, **settings) -> None:
        """Change any `DEFAULT_CONFIG` setting while running: latency_s, fault rates,
        retry_after_s, seed, rate limits, embedding and image limits, the batch_*_s stage
        times, batch_line_error_rate / _status, batch_expire_after_fraction, echo_credentials
        and huge_reply_bytes / huge_reply_declared (a careless server: see
        `dagster_batchllm.simulator.misbehaving`), ..."""
        unknown = set(settings) - set(DEFAULT_CONFIG)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; "
                             f"known: {sorted(DEFAULT_CONFIG)}")
        self._control("configure", settings)

    def stats(self, log: bool = True) -> dict:
        """Counters since start or reset_stats(), kept across restart().

        requests, ok (valid 200 answers), by_status {"429": n, ...}, dropped, stalled,
        max_concurrent, in_flight, prompt_tokens and completion_tokens (usage of 200 answers
        that carry usage), duplicates (ok answers to a request, by canonical JSON body,
        that an earlier ok answer already served), script_pending, and log: one
        [t_monotonic, status_or_outcome, prompt_tokens, completion_tokens] row per request
        at arrival. ``log=False`` leaves the logs out, which is cheaper on long runs.

        Apart from those (chat and completions only): ``embeddings`` (requests, ok, inputs,
        prompt_tokens, by_status, dropped, stalled, duplicates, log rows of [t, status,
        prompt_tokens, inputs]); ``images`` (requests with images, images, bytes, remote,
        rejected, and a log of {status, prompt, sha256: [...], bytes, remote} per request);
        ``batches`` (files_uploaded, bytes_uploaded, batches_created, lines_answered,
        lines_ok, lines_failed, lines_expired, line_duplicates, api_requests, ...);
        ``prefix_cache`` (requests looked up, their prompt_tokens, the cached_tokens found,
        blocks held, capacity_tokens; all zero without one).
        """
        return self._control("stats", {"log": log})

    def reset_stats(self) -> None:
        self._control("reset_stats", {})

    def max_in_window(self, window_s: float, what: str = "requests") -> float:
        """Peak requests (or tokens of 200 answers) arriving within any window_s window."""
        if what not in ("requests", "tokens"):
            raise ValueError("what must be 'requests' or 'tokens'")
        return self._control("max_in_window", {"window_s": window_s, "what": what})["value"]

    def _control(self, command: str, payload: dict) -> dict:
        with self._lock:
            if self.running:
                return self._admin(command, payload)
            return control(self._state, command, payload)  # stopped: edit what restart loads

    def _admin(self, command: str, payload: dict, timeout: float = 30.0) -> dict:
        # http.client, not urllib: urllib would route 127.0.0.1 through an HTTP(S)_PROXY.
        conn = http.client.HTTPConnection(self._connect_host, self.port, timeout=timeout)
        try:
            conn.request("POST", f"/_sim/{command}", body=json.dumps(payload),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read() or b"{}")
        finally:
            conn.close()
        if response.status != 200:
            raise ValueError(f"simulated endpoint rejected {command}: {data}")
        return data

    # -- thread mode -----------------------------------------------------------------

    def _start_thread(self) -> None:
        ready, box = threading.Event(), {}

        def on_ready(port: int) -> None:
            box["port"] = port
            ready.set()

        def run() -> None:
            loop = asyncio.new_event_loop()

            async def main() -> None:
                stop = asyncio.Event()
                box["stop"] = lambda: loop.call_soon_threadsafe(stop.set)
                await serve(self.settings, self._state, on_ready, stop)

            try:
                loop.run_until_complete(main())
            except BaseException as exc:  # reported to start(), which re-raises it
                box["error"] = exc
                ready.set()
            finally:
                loop.close()

        thread = threading.Thread(target=run, name="simulated-endpoint", daemon=True)
        thread.start()
        if not ready.wait(30) or "error" in box:
            raise RuntimeError("simulated endpoint failed to start") from box.get("error")
        self._thread, self._stop_thread, self.port = thread, box["stop"], box["port"]

    # -- process mode ----------------------------------------------------------------

    def _start_process(self) -> None:
        s = self.settings
        cmd = [sys.executable, "-m", "dagster_batchllm.simulator", "--host", s.host,
               "--port", str(s.port), "--max-concurrency", str(s.max_concurrency),
               "--parent-pid", str(os.getpid()), "--state-from-stdin"]
        if s.models:
            cmd += ["--models", ",".join(s.models)]
        if s.responder:
            cmd += ["--responder", s.responder]
        if s.embedding_models:
            cmd += ["--embedding-models", ",".join(s.embedding_models)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p))
        env.pop(API_KEY_ENV, None)
        if s.api_key:
            env[API_KEY_ENV] = s.api_key
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._proc = proc
        try:
            proc.stdin.write(json.dumps(self._state.export()).encode())
            proc.stdin.close()
            url = _read_line(proc, timeout=60)
        except BaseException:
            self._halt_process()
            raise
        self.port = int(url.rsplit(":", 1)[1].split("/", 1)[0])

    def _halt_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The subprocess's ready line (its base URL), or an error if it dies or hangs first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], 0.1)
        if readable:
            line = proc.stdout.readline().decode().strip()
            if line:
                return line
        if proc.poll() is not None:
            raise RuntimeError(f"simulated endpoint process exited with code {proc.returncode}")
    raise RuntimeError(f"simulated endpoint process not ready after {timeout:.0f} s")


@atexit.register
def _stop_all() -> None:
    for sim in list(_LIVE):
        if sim._proc is not None:  # daemon threads die with us; subprocesses would not
            sim._halt_process()
