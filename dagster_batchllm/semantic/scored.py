"""Chat replies with their logprobs kept: how sure the proxy of a cascade was of each answer.

:class:`ScoredCall` is an :class:`InferenceCall` whose requests ask ``logprobs=true`` (and
``top_logprobs``); its task, :class:`ScoredChatTask`, keeps each reply's tokens and their
logprobs in the ledger with the reply (as JSON ``{"content": ..., "logprobs": [[token,
logprob], ...] | null}``), so a rerun served by the ledger has the same confidence as the run
that paid. The row's value is a :class:`ScoredReply`: the parsed reply and those tokens.

:func:`answer_confidence` reads the probability of one answer out of them: the product of the
probabilities of the tokens that spell the answer's value in the reply (``true``, or the label
inside its quotes). An endpoint that gives no logprobs, or tokens that do not spell the reply,
give None: the cascade treats that row as uncertain and asks the oracle.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, NamedTuple

from ..core import (
    ChatTask,
    Completion,
    InferenceCall,
    StructuredOutputError,
    json_reply,
    register_task,
)

TOP_LOGPROBS = 2  # the answer and its best alternative: all a confidence needs


class ScoredReply(NamedTuple):
    value: Any  # the reply parsed as the call's ChatTask would (text, or checked JSON)
    tokens: list | None  # [[token, logprob], ...], None where the endpoint gave none
    content: str  # the reply's text, which the tokens spell


@dataclasses.dataclass(frozen=True)
class ScoredCall(InferenceCall):
    """An :class:`InferenceCall` whose replies keep their logprobs (see the module)."""

    job = "chat_scored"

    @classmethod
    def scoring(cls, call: InferenceCall, **fields: Any) -> ScoredCall:
        """``call`` as a ScoredCall asking for logprobs, with ``fields`` changed."""
        copied = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
        return cls.of(cls(**copied), logprobs=True, top_logprobs=TOP_LOGPROBS, **fields)


@register_task(ScoredCall)
class ScoredChatTask(ChatTask):
    """ChatTask that keeps each reply's token logprobs with its content in the ledger."""

    def parse_reply(self, raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
        return self.read_line(json_reply(raw, endpoint), endpoint=endpoint, latency_s=latency_s)

    def read_line(self, payload: Any, *, endpoint: str, latency_s: float) -> Completion:
        completion = super().read_line(payload, endpoint=endpoint, latency_s=latency_s)
        tokens = _token_logprobs(payload["choices"][0].get("logprobs"))
        envelope = json.dumps({"content": completion.content, "logprobs": tokens},
                              ensure_ascii=False, separators=(",", ":"))
        return dataclasses.replace(completion, content=envelope)

    def value(self, content: str) -> ScoredReply:
        envelope = json.loads(content)
        return ScoredReply(self._parser.parse(envelope["content"]), envelope["logprobs"],
                           envelope["content"])

    def reply_value(self, completion: Completion, request: Any) -> ScoredReply:
        try:
            return self.value(completion.content)
        except StructuredOutputError:
            return super().reply_value(dataclasses.replace(
                completion, content=json.loads(completion.content)["content"]), request)


def _token_logprobs(logprobs: Any) -> list | None:
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    tokens = []
    for entry in content:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str) or not (
                isinstance(entry.get("logprob"), int | float)):
            return None  # a shape we cannot read: no confidence rather than a wrong one
        tokens.append([entry["token"], float(entry["logprob"])])
    return tokens


def answer_confidence(reply: ScoredReply, answer: Any) -> float | None:
    """The probability the model gave ``answer`` (a bool or a label it replied), or None."""
    # vLLM lists the stop token it sampled (Gemma's "<eos>") after the reply's own text: the
    # tokens spell the reply and may go on past it, never differ from it.
    if not reply.tokens or not "".join(t for t, _ in reply.tokens).startswith(reply.content):
        return None
    literal = json.dumps(answer, ensure_ascii=False)
    start = reply.content.rfind(literal)  # the value comes after its key
    if start < 0:
        return None
    if isinstance(answer, str):  # the label's characters, not its quotes
        start, end = start + 1, start + len(literal) - 1
    else:
        end = start + len(literal)
    total, at = 0.0, 0
    for token, logprob in reply.tokens:
        token_start, at = at, at + len(token)
        if token_start < end and at > start:
            total += logprob
    return math.exp(total)
