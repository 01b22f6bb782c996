"""OpenAI protocol pieces every API module of the server shares.

`Reject` is how request validation says "answer this status"; `error_body` is OpenAI's error
envelope; `Serving` is what answering a model request needs (models, responder, state, ids),
used alike by the online routes and by the simulator's batch runner, so both answer a body the
same way; `tokens` is the server's token count.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from .responder import Responder
from .state import ServingState

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def tokens(text: str) -> int:
    """The server's token count: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


class Reject(Exception):
    """A request the server answers with an error status instead of a reply."""

    def __init__(self, status: int, message: str, code: str | int | None = None,
                 param: str | None = None, error_type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.error_type = error_type

    def body(self) -> dict:
        return error_body(self.status, self.message, self.code, self.param, self.error_type)


def error_body(status: int, message: str, code: str | int | None = None,
               param: str | None = None, error_type: str | None = None) -> dict:
    """OpenAI's error envelope; ``code`` defaults to the status."""
    kind = error_type or ERROR_TYPES.get(status, "APIError")
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": status if code is None else code}}


def responder_failure(exc: Exception) -> Reject:
    """What a responder's exception answers: its own ``status_code`` (an int from 400 to 599,
    with optional ``error_type`` and ``code`` attributes) when it carries one, as a refusal
    the client should not retry; else a 500, as a broken responder."""
    status = getattr(exc, "status_code", None)
    if type(status) is int and 400 <= status <= 599:
        return Reject(status, str(exc), getattr(exc, "code", None), None,
                      getattr(exc, "error_type", None))
    return Reject(500, f"responder failed: {type(exc).__name__}: {exc}")


def seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def error_response(status: int, body: dict, retry_after: float | None = None) -> web.Response:
    headers = None
    if retry_after is not None:
        headers = {"Retry-After": seconds(retry_after),
                   "retry-after-ms": str(max(1, round(retry_after * 1000)))}
    return web.Response(status=status, body=json.dumps(body).encode(),
                        content_type="application/json", headers=headers)


class Job(Protocol):
    """A validated model request (`chat.Generation`, `embeddings.EmbeddingJob`)."""

    body: dict

    @property
    def cost(self) -> int:
        """The tokens the request costs: its prompt and its whole reply."""

    def render(self, serving: Serving) -> tuple[dict, dict | None]:
        """The reply body and the usage counted for it (None: no usage)."""


@dataclass
class Serving:
    """What answering one model request needs; shared by online routes and batch lines."""

    models: list[str]
    embedding_models: list[str]
    responder: Responder
    state: ServingState
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def check_model(self, model: object, embeddings: bool) -> str:
        """The model name, or a Reject: unknown (404) or served for the other API (400)."""
        wanted, other = ((self.embedding_models, self.models) if embeddings
                         else (self.models, self.embedding_models))
        if model in wanted:
            return model  # type: ignore[return-value]
        if model in other:
            if embeddings:
                raise Reject(400, f"The model `{model}` does not support embeddings.",
                             "model_not_supported", "model")
            raise Reject(400, f"The model `{model}` is an embedding model; use /v1/embeddings.",
                         "model_not_supported", "model")
        raise Reject(404, f"The model `{model}` does not exist.", 404)
