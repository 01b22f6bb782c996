"""``ClassicalResponder``: "traditional AI" models behind the OpenAI chat protocol.

The example pipeline's default endpoint cannot ship an instruction-tuned LLM, so it serves
these instead (through ``dagster_batchllm.simulator.SimulatedEndpoint``):

``local-summarizer``
    extractive summary of the input; honours "in at most N words" (default 40 words).
``local-classifier``
    with a JSON-schema ``response_format``: a JSON object filling the schema (enums chosen
    by lexicon + VADER); without one: the best of the labels the prompt lists, else a
    sentiment word.
``local``
    alias: structured output goes to the classifier, everything else to the summarizer.

Both models also honour an explicit AI-function style instruction: sentiment
(positive/negative/neutral/mixed), translate / fix grammar (the text is echoed: there is no
translation model), mask (emails, phone numbers, names after "my name is" -> "[MASKED]"),
classify, summarize.  Empty input gives ``""`` from the summarizer (nothing to summarize).

Deterministic (``temperature``/``seed`` are ignored), thread-safe (no per-request state is
shared; the VADER and YAKE objects are built once), and offline.
"""

from __future__ import annotations

import json

from dagster_batchllm.managed.classical.classifier import TextContext, choose_label
from dagster_batchllm.managed.classical.structured import fill
from dagster_batchllm.managed.classical.summarizer import DEFAULT_WORDS
from dagster_batchllm.managed.classical.tasks import Request, mask, parse, task_of

SUMMARIZER = "local-summarizer"
CLASSIFIER = "local-classifier"
ALIAS = "local"
LOCAL_MODELS: tuple[str, ...] = (SUMMARIZER, CLASSIFIER)


class UnknownModelError(ValueError):
    """The request named a model this responder does not serve."""


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
    """Responder (``models()`` / ``respond()``) for ``SimulatedEndpoint``."""

    def models(self) -> list[str]:
        return [*LOCAL_MODELS, ALIAS]

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        """The assistant message content for one chat completion request."""
        if model not in (*LOCAL_MODELS, ALIAS):
            raise UnknownModelError(f"model {model!r} is not served here; try {LOCAL_MODELS}")
        request = parse(messages)
        ctx = TextContext(request.body)
        schema = _schema_of((params or {}).get("response_format"))
        if schema is not None:
            return json.dumps(self._structured(schema, ctx), ensure_ascii=False)
        task = task_of(request.instruction)
        if task is None:
            task = "summarize" if model in (SUMMARIZER, ALIAS) else "classify"
        return self._text_task(task, request, ctx)

    @staticmethod
    def _structured(schema: dict, ctx: TextContext) -> object:
        if not schema:  # JSON mode without a schema: a small, self-describing object
            return {"label": ctx.sentiment(), "summary": ctx.summary(DEFAULT_WORDS // 2)}
        return fill(schema, ctx)

    @staticmethod
    def _text_task(task: str, request: Request, ctx: TextContext) -> str:
        if task == "mask":
            return mask(request.body)
        if task in ("translate", "fix_grammar"):
            return request.body
        if task == "sentiment":
            return ctx.sentiment()
        if task == "classify":
            return choose_label(request.labels, ctx) if request.labels else ctx.sentiment()
        return ctx.summary(request.max_words or DEFAULT_WORDS)
