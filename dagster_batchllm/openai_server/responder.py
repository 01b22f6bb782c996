"""What the server answers with: a responder, a pure function from a request to its reply.

A responder turns a chat request into the assistant's text, and one that embeds turns texts into
vectors. The server does the rest (validation, token counting, ``max_tokens`` cuts, the reply's
envelope), so a responder stays a deterministic function that is easy to write.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Protocol, runtime_checkable

_WHITESPACE = re.compile(r"\s+")


@runtime_checkable
class Responder(Protocol):
    """Pluggable reply generator for `ServedEndpoint` (and the simulator's `SimulatedEndpoint`).

    ``params`` is the request body minus ``model`` and ``messages`` (``max_tokens``,
    ``temperature``, ``response_format``, ...). Message contents arrive as plain text,
    even when the client sent a list of content parts: text parts one per line, each image
    part as its marker line ``[image sha256:<12 hex>]`` (see `dagster_batchllm.openai_server.
    images`). Return the assistant message content; for structured output, a JSON string.

    A responder that embeds also has ``embedding_models()`` and ``embed(model, texts,
    dimensions)`` returning a float32 matrix (see `dagster_batchllm.openai_server.embeddings`).
    `ServedEndpoint`'s docstring shows one served and called with the ``openai`` client.
    """

    def models(self) -> list[str]: ...

    def respond(self, model: str, messages: list[dict], params: dict) -> str: ...


def content_text(content: Any) -> str:
    """Message content as text; OpenAI also allows a list of parts, of which text parts count."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def prompt_text(messages: list[dict]) -> str:
    """The last user message (the last message if none is a user's), whitespace-collapsed."""
    chosen: dict = messages[-1] if messages else {}
    for message in reversed(messages):
        if message.get("role") == "user":
            chosen = message
            break
    return _WHITESPACE.sub(" ", content_text(chosen.get("content"))).strip()


def responder_embedding_models(responder: Responder | str | None) -> list[str]:
    """The models a responder embeds with: what its ``embedding_models()`` lists, if it has
    one (and an ``embed(model, texts, dimensions)`` method), else none."""
    if responder is None:
        return []
    if isinstance(responder, str):
        responder = load_responder(responder)
    if not (callable(getattr(responder, "embed", None))
            and callable(getattr(responder, "embedding_models", None))):
        return []
    return list(responder.embedding_models())


def load_responder(spec: str) -> Responder:
    """Import ``"module:attr"`` (attr may be dotted); a class is instantiated without arguments."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"responder must look like 'module:attr', got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj() if isinstance(obj, type) else obj
