"""``ClassicalResponder``: "traditional AI" models behind the OpenAI chat protocol.

The example pipeline's default endpoint cannot ship an instruction-tuned LLM, so it serves
these instead (through ``dagster_batchllm.openai_server.ServedEndpoint``):

``local-summarizer``
    extractive summary of the input; honours "in at most N words" (default 40 words).
``local-classifier``
    with a JSON-schema ``response_format``: a JSON object filling the schema field by field
    (:mod:`.structured`); without one: the best of the labels the prompt lists, else a
    sentiment word.
``local``
    alias (the example's default model): structured output goes to the classifier, a prompt
    that names a task (summarize, classify, sentiment, mask, extract, similarity) is done; a
    non-empty prompt that names none is refused: it asks for an answer (``ai_gen``), not for a
    text to be worked on.
``local-embedder``
    embeddings only (:meth:`ClassicalResponder.embed`): hashed word and character n-gram TF
    vectors, 384 dimensions by default (:mod:`.embedder`).

What the chat models do classically, whichever AI function or prompt asks:

* summarize (``ai_summarize``; any prompt to ``local-summarizer`` that names no other task);
* classify and judge sentiment (``ai_classify``, ``ai_analyze_sentiment``, the enums of any
  schema): lexicon + VADER;
* extract (``ai_extract``, schema fields named after an entity): only what a pattern finds for
  the label (:mod:`.patterns`: e-mails, phone numbers, names where the text introduces them,
  dates, order numbers, amounts, products ...), else null; never the whole text;
* mask (``ai_mask``): e-mails, phone numbers, Luhn-valid card numbers, IBAN- and SSN-like
  numbers, introduced names, addresses ... replaced by ``[MASKED]``;
* rate similarity (``ai_similarity``): the cosine of the two texts' ``local-embedder``
  vectors, a lexical (shared words and word pieces) similarity, not one of meaning.

What they refuse, with :class:`~.errors.UnsupportedTask` (the server answers HTTP 422, code
``unsupported_task``, a message saying a real model endpoint is needed; the client does not
retry it): translation (``ai_translate``), grammar correction (``ai_fix_grammar``), free
generation (``ai_gen`` prompts and any prompt that asks to write, explain, answer ...), short
open questions, reading images (any request with an image part: a vision model is needed),
masking a kind of data no pattern finds (``ai_mask(t, ['city'])``: masking
the rest would leak it), and extracting a plain-text answer no pattern finds.

Deterministic (``temperature``/``seed`` are ignored), thread-safe (no per-request state is
shared; the VADER and YAKE objects are built once), and offline.  Empty input gives ``""``
from the summarizer (nothing to summarize).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from dagster_batchllm.managed.classical import embedder, patterns
from dagster_batchllm.managed.classical.aggregates import aggregate_answer
from dagster_batchllm.managed.classical.classifier import TextContext, choose_label
from dagster_batchllm.managed.classical.errors import (
    RequestRefused,
    UnknownModelError,
    UnsupportedTask,
)
from dagster_batchllm.managed.classical.structured import fill
from dagster_batchllm.managed.classical.summarizer import DEFAULT_WORDS
from dagster_batchllm.managed.classical.tasks import (
    Request,
    listed_labels,
    open_ended,
    parse,
    text_pair,
)

SUMMARIZER = "local-summarizer"
CLASSIFIER = "local-classifier"
ALIAS = "local"
EMBEDDER = embedder.MODEL_NAME
LOCAL_MODELS: tuple[str, ...] = (SUMMARIZER, CLASSIFIER)
EMBEDDING_MODELS: tuple[str, ...] = (EMBEDDER,)
# How the server shows the responder an image part (openai_server/images.py ImagePart.marker):
# the pixels never reach a responder, so an image is a line like this in the user message.
_IMAGE_MARKER = re.compile(r"^\[(?:remote )?image sha256:[0-9a-f]{12}\]$", re.M)
IMAGE_REFUSAL = ("read images: an image has no text layer for a classical model to work on, "
                 "so a vision model endpoint is needed (a PDF's text layer needs no model: "
                 "ai_parse_document, or dagster_batchllm.documents.parse_document, and send "
                 "the text)")
# Tasks a prompt can name that no classical method here does.
REFUSED_TASKS = {"translate": "translate text", "fix_grammar": "correct grammar or spelling"}

__all__ = ["ALIAS", "CLASSIFIER", "EMBEDDER", "EMBEDDING_MODELS", "LOCAL_MODELS", "SUMMARIZER",
           "ClassicalResponder", "UnknownModelError", "UnsupportedTask"]


def _schema_of(response_format: object) -> dict | None:
    """The JSON schema a ``response_format`` asks for; ``{}`` for plain JSON mode."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema", spec) if isinstance(spec, dict) else {}
        return schema if isinstance(schema, dict) else {}
    if kind == "json_object":
        return {}
    return None


class ClassicalResponder:
    """Responder (``models()`` / ``respond()``) for ``ServedEndpoint``, plus embeddings
    (``embedding_models()`` / ``embed()``) for an embeddings route.

    ``respond`` raises :class:`UnsupportedTask` (a :class:`~.errors.RequestRefused`, with
    ``status_code`` 422) for what it cannot do honestly; see the module docstring.
    """

    def models(self) -> list[str]:
        return [*LOCAL_MODELS, ALIAS]

    def embedding_models(self) -> list[str]:
        return list(EMBEDDING_MODELS)

    def embed(self, model: str, texts: Sequence[str], dimensions: int | None = None
              ) -> np.ndarray:
        """``(len(texts), dimensions)`` float32 unit vectors (384 dimensions by default).

        Raises :class:`UnknownModelError` for a model other than ``local-embedder`` and
        :class:`~.errors.RequestRefused` (400) for bad ``dimensions`` or inputs.
        """
        if model not in EMBEDDING_MODELS:
            raise UnknownModelError(
                f"model {model!r} is not an embedding model here; try {EMBEDDING_MODELS}")
        try:
            return embedder.embed(
                list(texts), embedder.DEFAULT_DIMENSIONS if dimensions is None else dimensions)
        except ValueError as exc:
            raise RequestRefused(str(exc)) from exc

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        """The assistant message content for one chat completion request."""
        if model not in (*LOCAL_MODELS, ALIAS):
            raise UnknownModelError(f"model {model!r} is not served here; try {LOCAL_MODELS}")
        if any(_IMAGE_MARKER.search(str(m.get("content") or "")) for m in messages
               if m.get("role", "user") == "user"):
            raise UnsupportedTask(IMAGE_REFUSAL)
        aggregated = aggregate_answer(messages)  # a group's rows at once (ai_summarize_agg)
        if aggregated is not None:
            return aggregated
        request = parse(messages)
        schema = _schema_of((params or {}).get("response_format"))
        task = request.task
        if task in REFUSED_TASKS:
            raise UnsupportedTask(REFUSED_TASKS[task])
        if task == "similarity":
            return self._similarity(request, schema)
        ctx = TextContext(request.body)
        if schema is not None:
            return json.dumps(self._structured(schema, ctx), ensure_ascii=False)
        if task is None:
            refusal = open_ended(request)
            if refusal is None and model == ALIAS and request.body:
                refusal = ("answer a prompt that names no task (free generation, as ai_gen "
                           "asks); name one ('Summarize: ...') or use local-summarizer")
            if refusal is not None:
                raise UnsupportedTask(refusal)
            task = "classify" if model == CLASSIFIER else "summarize"
        return self._text_task(task, request, ctx)

    @staticmethod
    def _structured(schema: dict, ctx: TextContext) -> object:
        if not schema:  # JSON mode without a schema: a small, self-describing object
            return {"label": ctx.sentiment(), "summary": ctx.summary(DEFAULT_WORDS // 2)}
        return fill(schema, ctx)

    @staticmethod
    def _similarity(request: Request, schema: dict | None) -> str:
        pair = text_pair(request.prompt)
        if pair is None:
            raise RequestRefused("a similarity request needs two texts, sent as "
                                 "'Text 1:\\n<first>\\n\\nText 2:\\n<second>'")
        score = max(0.0, embedder.cosine(*pair))
        if schema is None:
            return f"{score:.4f}"
        if not schema:
            return json.dumps({"score": round(score, 4)})
        ctx = TextContext(f"{pair[0]}\n{pair[1]}")
        return json.dumps(fill(schema, ctx, similarity=score), ensure_ascii=False)

    @staticmethod
    def _text_task(task: str, request: Request, ctx: TextContext) -> str:
        if task == "mask":
            return _mask(request)
        if task == "extract":
            return _extract(request)
        if task == "sentiment":
            return ctx.sentiment()
        if task == "classify":
            return choose_label(request.labels, ctx) if request.labels else ctx.sentiment()
        return ctx.summary(request.max_words or DEFAULT_WORDS)


def _mask(request: Request) -> str:
    """Mask the kinds the labels name (all personal data without labels); refuse labels no
    pattern finds, since masking only the rest would leave that data in the text."""
    labels = listed_labels(request)
    kinds, unknown = patterns.kinds_to_mask(labels) if labels else (patterns.PERSONAL_KINDS, [])
    if unknown:
        raise UnsupportedTask(
            f"find {unknown} by pattern to mask it (they mask: {', '.join(patterns.PATTERNS)})")
    return patterns.mask(request.body, kinds)


def _extract(request: Request) -> str:
    """Plain-text extraction: the listed labels as a JSON object, or the one kind the
    instruction names, as every match joined by ", " ("" when there is none)."""
    labels = listed_labels(request)
    if labels:
        return json.dumps({label: patterns.find(kind, request.body) if kind else None
                           for label in labels for kind in [patterns.kind_of(label)]},
                          ensure_ascii=False)
    kind = patterns.kind_of(request.user_instruction or request.instruction)
    if kind is None:
        raise UnsupportedTask(
            "extract that: no pattern finds it (they find: " + ", ".join(patterns.PATTERNS)
            + "; or send labels in a JSON schema)")
    return ", ".join(patterns.find_all(kind, request.body))
