"""`ServedEndpoint`: start, stop and read a server of this package, on a thread or in a process."""

from __future__ import annotations

import asyncio
import atexit
import http.client
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .responder import Responder, responder_embedding_models
from .server import OpenAIApp, ServerSettings, serve
from .state import ServingState

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_LIVE: weakref.WeakSet = weakref.WeakSet()


class ServedEndpoint:
    """A real HTTP server on 127.0.0.1 speaking the OpenAI protocol, answered by a responder.

    ``process=False`` runs it on a daemon thread with its own event loop; ``process=True``
    runs ``python -m dagster_batchllm.openai_server`` so it does not share the caller's GIL
    (the responder is then a ``"module:attr"`` string, which the process imports). Its stats
    survive `restart`. Keyword arguments past the named ones are protocol limits
    (`SERVING_CONFIG`: ``max_context_tokens``, ``embedding_dimensions``, ``max_image_bytes`` ...).

    Example::

        import openai
        from dagster_batchllm.openai_server import ServedEndpoint

        class Upper:
            def models(self) -> list[str]:
                return ["upper"]

            def respond(self, model, messages, params) -> str:
                return messages[-1]["content"].upper()

        with ServedEndpoint(Upper()) as endpoint:
            client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
            reply = client.chat.completions.create(
                model="upper", messages=[{"role": "user", "content": "hello"}])
            assert reply.choices[0].message.content == "HELLO"
            assert endpoint.stats()["by_status"] == {"200": 1}
    """

    #: The app a server runs, the module ``process=True`` runs, and the environment variable
    #: that hands that process the API key (never a command line, which others can read).
    APP: type[OpenAIApp] = OpenAIApp
    MAIN_MODULE = "dagster_batchllm.openai_server"
    API_KEY_ENV = "DAGSTER_BATCHLLM_SERVING_API_KEY"

    def __init__(self, responder: Responder | str | None,
                 models: tuple[str, ...] | list[str] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, max_concurrency: int = 256, api_key: str | None = None,
                 process: bool = False,
                 embedding_models: tuple[str, ...] | list[str] | None = None,
                 state: ServingState | None = None, **config: Any):
        if process and responder is not None and not isinstance(responder, str):
            raise TypeError("process=True needs the responder as a 'module:attr' string")
        # Explicit models win; models=None serves what the responder's models() lists.
        self.settings = ServerSettings(host, port, list(models) if models else None,
                                       max_concurrency, api_key, responder,
                                       list(embedding_models) if embedding_models else None)
        self.process = process
        self.port = port
        self._state = state if state is not None else ServingState(config)
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
        return list(self.APP.responder_of(self.settings.responder).models())

    @property
    def embedding_models(self) -> list[str]:
        """The models it serves on /v1/embeddings (by default, those of a responder that
        embeds: see `dagster_batchllm.openai_server.embeddings`)."""
        if self.settings.embedding_models:
            return list(self.settings.embedding_models)
        return responder_embedding_models(self.settings.responder)

    @property
    def base_url(self) -> str:
        return f"http://{self._connect_host}:{self.port}/v1"

    @property
    def _connect_host(self) -> str:
        return "127.0.0.1" if self.settings.host in ("", "0.0.0.0") else self.settings.host

    def start(self) -> ServedEndpoint:
        with self._lock:
            if self.running:
                return self
            self._state.killed = False
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
                    self._state = type(self._state).from_export(exported)
            else:
                try:
                    self._stop_thread()
                except RuntimeError:
                    pass  # its loop already ended
                self._thread.join(timeout=10)
                self._thread = None
            self._state.killed = False
            _LIVE.discard(self)

    def restart(self) -> ServedEndpoint:
        self.stop()
        return self.start()

    def __enter__(self) -> ServedEndpoint:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- control ---------------------------------------------------------------------

    def stats(self, log: bool = True) -> dict:
        """Counters since start or reset_stats(), kept across restart().

        requests, ok (valid 200 answers), by_status {"429": n, ...}, max_concurrent,
        in_flight, prompt_tokens and completion_tokens (usage of the 200 answers),
        duplicates (ok answers to a request, by canonical JSON body, that an earlier ok answer
        already served), and log: one [t_monotonic, status, prompt_tokens, completion_tokens]
        row per request at arrival; all of chat and completions. ``embeddings`` has the same
        of its requests (inputs, where chat has completion_tokens), and ``images`` counts the
        image parts received. ``log=False`` leaves the logs out, which is cheaper on long runs.
        """
        return self._control("stats", {"log": log})

    def reset_stats(self) -> None:
        self._control("reset_stats", {})

    def _control(self, command: str, payload: dict) -> dict:
        with self._lock:
            if self.running:
                return self._admin(command, payload)
            return self._state.control(command, payload)  # stopped: edit what restart loads

    def _admin(self, command: str, payload: dict, timeout: float = 30.0) -> dict:
        # http.client, not urllib: urllib would route 127.0.0.1 through an HTTP(S)_PROXY.
        conn = http.client.HTTPConnection(self._connect_host, self.port, timeout=timeout)
        try:
            conn.request("POST", f"{self.APP.ADMIN_PREFIX}/{command}", body=json.dumps(payload),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read() or b"{}")
        finally:
            conn.close()
        if response.status != 200:
            raise ValueError(f"{type(self).__name__} rejected {command}: {data}")
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
                await serve(self.APP(self.settings, self._state), on_ready, stop)

            try:
                loop.run_until_complete(main())
            except BaseException as exc:  # reported to start(), which re-raises it
                box["error"] = exc
                ready.set()
            finally:
                loop.close()

        thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        thread.start()
        if not ready.wait(30) or "error" in box:
            raise RuntimeError(f"{type(self).__name__} failed to start") from box.get("error")
        self._thread, self._stop_thread, self.port = thread, box["stop"], box["port"]

    # -- process mode ----------------------------------------------------------------

    def _start_process(self) -> None:
        s = self.settings
        cmd = [sys.executable, "-m", self.MAIN_MODULE, "--host", s.host,
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
        env.pop(self.API_KEY_ENV, None)
        if s.api_key:
            env[self.API_KEY_ENV] = s.api_key
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


def stop_process(proc: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
            raise RuntimeError(f"server process exited with code {proc.returncode}")
    raise RuntimeError(f"server process not ready after {timeout:.0f} s")


@atexit.register
def _stop_all() -> None:
    for endpoint in list(_LIVE):
        if endpoint._proc is not None:  # daemon threads die with us; subprocesses would not
            endpoint._halt_process()


__all__ = ["ServedEndpoint", "stop_process"]
