"""``EmbedCall``: what one embeddings call says, frozen and checked before a row is read.

The embeddings counterpart of :class:`~.call.InferenceCall`: which text to embed (a template
over the input's columns, or one column), with which model and size, how many inputs go in
one request, and where the vectors go. ``embed()``, the embeddings asset and the SQL and Spark
functions all build one.

Example::

    >>> call = EmbedCall(input="{title}: {body}", model="bge-large")
    >>> call.input_columns(), call.output_column, call.error_column
    (['title', 'body'], 'embedding', 'embedding_error')
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InferenceConfigError
from ...settings import described
from ..base import CallBase, version_of
from ..chat.call import check_template, template_fields

# OpenAI takes up to 2048 inputs per request; vLLM and TEI batch whatever they are sent.
MAX_INPUTS_PER_REQUEST = 2048
# What a request's inputs may reserve together by default (one token per UTF-8 byte, an upper
# bound): 64 transcripts of ~150 words fit, and no server sees one request of megabytes.
DEFAULT_MAX_REQUEST_TOKENS = 65_536


@dataclass(frozen=True)
class EmbedCall(CallBase):
    """Which text of each row to embed, with what, and where the vectors go."""

    job, entry = "embed", "embed"
    sent_fields = ("input", "input_column", "model", "dimensions", "cells_as_text")

    input: str | None = described(
        "A template over the input's columns giving the text to embed, e.g. "
        "'{title}: {body}' (literal braces as {{ and }}).", None)
    input_column: str | None = described("A column holding each row's text as it is.", None)
    model: str | None = described(
        "The embedding model (as in an Endpoint's embedding_models); by default the only "
        "one served.", None)
    output_column: str = described(
        "The column that receives the vectors (errors go to <column>_error).", "embedding")
    error_column: str | None = described(
        "The error column; by default <output_column>_error.", None)
    dimensions: int | None = described(
        "Vector size to ask for (models that support it, e.g. OpenAI's text-embedding-3); "
        "None: the model's own size.", None)
    inputs_per_request: int = described("Most inputs sent in one request.", 64)
    max_request_tokens: int | None = described(
        "Most tokens one request's inputs may hold together, "
        "counted as an upper bound (one per UTF-8 byte); a request closes early at it.",
        DEFAULT_MAX_REQUEST_TOKENS)
    max_input_tokens: int | None = described(
        "Longest input, in estimated tokens (4 characters each), sent at all; longer "
        "inputs fail as rows before sending. By default the endpoints' max_context_tokens, "
        "where they set it, and otherwise the server decides.", None)
    cells_as_text: bool = described(
        "Render numbers, booleans, timestamps and UTF-8 bytes as text; by default such "
        "a cell is a per-row error.", False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalized values are set once, here
        if (self.input is None) == (self.input_column is None):
            raise InferenceConfigError(
                "pass exactly one of input= (a template such as '{title}: {body}') or "
                "input_column= (a column of texts).")
        if self.input is not None:
            check_template(self.input, "input template")
        self._check_common()
        if self.dimensions is not None:
            set_(self, "dimensions", _positive("dimensions", self.dimensions))
        per_request = _positive("inputs_per_request", self.inputs_per_request)
        if per_request > MAX_INPUTS_PER_REQUEST:
            raise InferenceConfigError(
                f"inputs_per_request must be at most {MAX_INPUTS_PER_REQUEST} (OpenAI's limit), "
                f"got {per_request}.")
        set_(self, "inputs_per_request", per_request)
        for name in ("max_request_tokens", "max_input_tokens", "token_budget"):
            if getattr(self, name) is not None:
                set_(self, name, _positive(name, getattr(self, name)))

    def bind(self, columns: Sequence[str], settings: Any) -> EmbedCall:
        """The call checked against a table's columns and the served embedding models, with
        the model filled in when only one is served; every mistake raises before sending."""
        embedding_models, chat_models = settings.embedding_models, settings.models
        call = self
        if self.model is None:
            if settings.embedding_model_when_unnamed is None:
                raise InferenceConfigError(
                    "Pass model= (an embedding model): "
                    + (f"the endpoints serve {sorted(embedding_models)}." if embedding_models
                       else "no endpoint lists embedding_models=[...]."))
            call = self.as_sent_by(settings)
        if call.model not in embedding_models:
            hint = (f" '{call.model}' is served on /chat/completions; a model served on "
                    "/embeddings goes in the Endpoint's embedding_models=[...]."
                    if call.model in chat_models else
                    " Add it to an Endpoint's embedding_models=[...].")
            raise InferenceConfigError(
                f"No configured endpoint serves embedding model '{call.model}'. Served "
                f"embedding models: {sorted(embedding_models)}.{hint}")
        call.check_columns(columns)
        return call

    def input_columns(self) -> list[str]:
        return template_fields(self.input) if self.input is not None else [self.input_column]

    def columns_read(self) -> list[str]:
        return self.input_columns()

    @property
    def code_version(self) -> str:
        return version_of({"task": "embed", **{n: getattr(self, n) for n in self.sent_fields}})

    def as_sent_by(self, settings: Any) -> EmbedCall:
        """The call with the only embedding model served where it names none."""
        if self.model is None and settings.embedding_model_when_unnamed:
            return dataclasses.replace(self, model=settings.embedding_model_when_unnamed)
        return self


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InferenceConfigError(f"{name} must be a positive whole number, got {value!r}.")
    return int(value)
