"""Requests the embedded classical models refuse, as the OpenAI error the server answers.

A refusal is final: the same request would be refused again, so each is a 4xx status, which
the client does not retry.  The server (:mod:`dagster_batchllm.openai_server`) turns an
exception that carries a 4xx ``status_code`` into ``{"error": {"message": str(exc), "type":
error_type, "code": code}}``.
"""

from __future__ import annotations

REAL_ENDPOINT_HINT = "point the resource at a real model endpoint (Endpoint(base_url=...))"


class RequestRefused(ValueError):
    """A request answered with an OpenAI error body instead of a completion."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class UnsupportedTask(RequestRefused):
    """A task no classical method here can do honestly (translation, free generation, ...).

    >>> str(UnsupportedTask("translate text"))
    'the embedded classical models cannot translate text; point the resource at a real model endpoint (Endpoint(base_url=...))'
    """  # noqa: E501 (a doctest shows the message whole)

    status_code = 422
    code = "unsupported_task"

    def __init__(self, what: str) -> None:
        super().__init__(f"the embedded classical models cannot {what}; {REAL_ENDPOINT_HINT}")
        self.what = what


class UnknownModelError(RequestRefused):
    """The request named a model this responder does not serve."""

    status_code = 404
    code = "model_not_found"
