"""A labelled truth, an oracle model that answers it and a proxy model that mostly does.

Cascades (``dagster_batchllm.semantic``) send every row to a small *proxy* model, read how sure
it is from the reply's logprobs, and pay a large *oracle* model only for the rows it is unsure
of. To test that here, :class:`LabelledResponder` serves both over the simulator:

* the **truth** is a function of the row's text (the last user message): a :class:`KeywordTruth`
  (the first keyword the text contains gives its value, else the default) or any callable
  ``text -> bool | str``. Its value is a label (``"refund"``) or a boolean (for yes/no
  predicates).
* the **oracle** models reproduce the truth exactly;
* the **proxy** models agree with it for a share ``proxy_accuracy`` of the texts (0.85: 85%),
  decided by a hash of (seed, text), so every rerun and every process agrees. A wrong answer is
  the other boolean, or another label of the request's enum (picked by hash).

How a request is answered: a JSON-schema request gets an object with every property filled;
a boolean property gets the answer to the yes/no question, an enum property (a label) gets the
label. The yes/no answer is the truth itself when the truth is a boolean; when it is a label,
it is whether the request's instructions (its system message, where ai_filter puts the
predicate) name that label. A label truth that is not among the enum's labels picks one by
hash, as does a boolean truth asked for a label. Any other request (plain text, other schemas)
is answered as :class:`~.responders.EchoResponder` answers it, so the same models serve
ai_query and the other functions too.

**Logprobs.** When a chat request asks ``logprobs=true``, the proxy's reply carries OpenAI's
``choices[0].logprobs.content``: one entry per token of the reply (tokens are runs of letters
or digits, or single other characters), each with its ``logprob`` and ``top_logprobs`` (as
many as ``top_logprobs`` asks, at most 2 here: the answer and its alternative). The tokens of
the answer's value carry the model's confidence; the JSON around it has logprob -0.0001. The
confidence correlates with being right: a right answer's is drawn (by hash) uniformly from
[0.55, 1.0) skewed high (``0.55 + 0.45 * sqrt(u)``), a wrong one's from [0.5, 0.8), so high
confidence is mostly right and low confidence mixed, and the two overlap. The oracle reports
confidence 1 (logprob 0) on its answer tokens. A responder without logprobs (EchoResponder)
replies ``"logprobs": null``, as an endpoint that does not give them.

**Proxy profiles.** That is the default profile, ``"skewed"`` (right on ``proxy_accuracy`` of
the texts). ``profile=`` picks another, each with its own accuracy (see
:data:`PROXY_PROFILES`): ``"good"`` (85% right and calibrated: a confidence ``c``, drawn with
mean 0.85, is right with probability ``c``), ``"weak"`` (75% right, and a fifth of the wrong
answers, 5% of the rows, confidently wrong: confidence in [0.9, 1.0)) and ``"useless"`` (50%
right, its confidence uniform on [0.5, 1.0) whether right or not).

Example::

    from dagster_batchllm.simulator.labelled import KeywordTruth, LabelledResponder
    from dagster_batchllm.testing import SimulatedEndpoint

    truth = KeywordTruth({"refund": "refund", "broken": "complaint"}, default="question")
    responder = LabelledResponder(truth, oracle_models=["llama-70b"], proxy_models=["llama-8b"])
    with SimulatedEndpoint(models=None, responder=responder) as sim: ...
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..openai_server.responder import prompt_text
from .responders import EchoResponder, stable_hash

Truth = Callable[[str], "bool | str"]
_TOKEN = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]", re.DOTALL)
_CERTAIN = -0.0001  # the logprob of tokens a model is sure of (the JSON around the answer)
_SCALE = float(2 ** 64)


class KeywordTruth:
    """The value of a text: that of the first keyword (in the mapping's order) the text
    contains, case-insensitively; ``default`` when it contains none.

    >>> KeywordTruth({"refund": True}, default=False)("I want a REFUND")
    True
    """

    def __init__(self, keywords: Mapping[str, bool | str], default: bool | str):
        self.keywords = [(k.lower(), v) for k, v in keywords.items()]
        self.default = default

    def __call__(self, text: str) -> bool | str:
        lowered = text.lower()
        return next((v for k, v in self.keywords if k in lowered), self.default)


# profile -> its share of right answers (None: ``proxy_accuracy``); see the module
PROXY_PROFILES: dict[str, float | None] = {"skewed": None, "good": 0.85, "weak": 0.75,
                                           "useless": 0.5}
# the good profile's confidence 0.5 + 0.5 u^a has mean 0.5 + 0.5 / (1 + a): 0.85 at a = 3/7
_CALIBRATED_POWER = 1 / 0.7 - 1
_CONFIDENTLY_WRONG = 0.2  # the weak profile: the share of its wrong answers made at >= 0.9


class LabelledResponder:
    """Serves ``oracle_models`` (always the truth) and ``proxy_models`` (the truth for a share
    ``proxy_accuracy`` of the texts, with logprobs that say how sure it is). See the module."""

    def __init__(self, truth: Truth, *, oracle_models: Sequence[str] = ("llama-70b",),
                 proxy_models: Sequence[str] = ("llama-8b",),
                 proxy_accuracy: float | None = None, seed: int = 0, profile: str = "skewed"):
        if profile not in PROXY_PROFILES:
            raise ValueError(f"profile must be one of {sorted(PROXY_PROFILES)}, got {profile!r}")
        if proxy_accuracy is not None and PROXY_PROFILES[profile] is not None:
            raise ValueError(f"the {profile!r} profile is right on {PROXY_PROFILES[profile]} of "
                             "the texts; proxy_accuracy= sets only the 'skewed' profile's")
        proxy_accuracy = PROXY_PROFILES[profile] or (
            0.85 if proxy_accuracy is None else proxy_accuracy)
        if not 0.0 <= proxy_accuracy <= 1.0:
            raise ValueError(f"proxy_accuracy must be within [0, 1], got {proxy_accuracy}")
        overlap = set(oracle_models) & set(proxy_models)
        if overlap:
            raise ValueError(f"a model is either an oracle or a proxy, not both: {overlap}")
        self.truth = truth
        self.oracle_models, self.proxy_models = list(oracle_models), list(proxy_models)
        self.proxy_accuracy = proxy_accuracy
        self.profile = profile
        self.seed = seed
        self._echo = EchoResponder(self.models())

    def models(self) -> list[str]:
        return [*self.oracle_models, *self.proxy_models]

    # -- the answer --------------------------------------------------------------------------
    def _draw(self, what: str, text: str) -> float:
        """A number in [0, 1) fixed by (seed, what, text): the same in every process."""
        return stable_hash(f"{self.seed}\x00{what}\x00{text}") / _SCALE

    def _calibrated(self, text: str) -> float:
        return 0.5 + 0.5 * self._draw("confidence", text) ** _CALIBRATED_POWER

    def proxy_is_right(self, text: str) -> bool:
        """Whether the proxy models agree with the truth on this row text."""
        if self.profile == "good":  # right with the probability it states
            return self._draw("right", text) < self._calibrated(text)
        return self._draw("right", text) < self.proxy_accuracy

    def confidence(self, model: str, text: str) -> float:
        """The model's probability for its own answer on this row text."""
        if model not in self.proxy_models:
            return 1.0
        u = self._draw("confidence", text)
        if self.profile == "good":
            return self._calibrated(text)
        if self.profile == "useless":
            return 0.5 + 0.5 * u
        if self.proxy_is_right(text):
            return 0.55 + 0.45 * math.sqrt(u)
        if self.profile == "weak" and self._draw("confidently", text) < _CONFIDENTLY_WRONG:
            return 0.9 + 0.1 * u
        return 0.5 + 0.3 * u

    def _yes_no(self, truth: bool | str, messages: list[dict]) -> bool:
        if isinstance(truth, bool):
            return truth
        system = " ".join(str(m.get("content") or "") for m in messages
                          if m.get("role") == "system")
        return str(truth).lower() in system.lower()

    def _label(self, truth: bool | str, labels: list, text: str) -> Any:
        if truth in labels and not isinstance(truth, bool):
            return truth
        return labels[stable_hash(text) % len(labels)]

    def _answer(self, model: str, schema: Mapping[str, Any], messages: list[dict],
                text: str) -> dict[str, Any] | None:
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(properties, Mapping) or not properties:
            return None
        truth = self.truth(text)
        wrong = model in self.proxy_models and not self.proxy_is_right(text)
        answer: dict[str, Any] = {}
        for name, sub in properties.items():
            sub = sub if isinstance(sub, Mapping) else {}
            if sub.get("type") == "boolean":
                answer[name] = self._yes_no(truth, messages) != wrong
            elif isinstance(sub.get("enum"), list) and sub["enum"]:
                labels = list(sub["enum"])
                label = self._label(truth, labels, text)
                if wrong and len(labels) > 1:
                    others = [v for v in labels if v != label]
                    label = others[stable_hash("wrong" + text) % len(others)]
                answer[name] = label
            else:
                return None  # not a predicate or a label: answered as EchoResponder would
        return answer

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        fmt = params.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {}
            answer = self._answer(model, schema, messages, prompt_text(messages))
            if answer is not None:
                return json.dumps(answer, ensure_ascii=False)
        return self._echo.respond(model, messages, params)

    # -- logprobs ----------------------------------------------------------------------------
    def logprobs(self, model: str, messages: list[dict], params: dict, text: str
                 ) -> list[dict[str, Any]]:
        """OpenAI's ``logprobs.content`` for the reply ``text``: the tokens of each answer
        value (a JSON true/false or a label string) carry the model's confidence."""
        row = prompt_text(messages)
        confidence = self.confidence(model, row)
        spans = _value_spans(text)
        wanted = params.get("top_logprobs") or 0
        wanted = min(int(wanted), 2) if isinstance(wanted, int) else 0
        out, at = [], 0
        for token in _TOKEN.findall(text):
            start, at = at, at + len(token)
            inside = any(a <= start < b for a, b in spans)
            logprob = math.log(confidence) if inside and confidence < 1.0 else (
                0.0 if inside else _CERTAIN)
            entry: dict[str, Any] = {"token": token, "logprob": logprob,
                                     "bytes": list(token.encode("utf-8"))}
            top = [{"token": token, "logprob": logprob, "bytes": entry["bytes"]}]
            if inside and confidence < 1.0:
                other = {"true": "false", "false": "true"}.get(token, "other")
                top.append({"token": other, "logprob": math.log(1.0 - confidence),
                            "bytes": list(other.encode("utf-8"))})
            entry["top_logprobs"] = top[:wanted]
            out.append(entry)
        return out


def _value_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the answer values in a JSON reply: booleans and string values."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return []
    if not isinstance(parsed, dict):
        return []
    spans, at = [], 0
    for key, value in parsed.items():
        at = max(at, text.find(json.dumps(key, ensure_ascii=False), at))
        if isinstance(value, bool | str):
            literal = json.dumps(value, ensure_ascii=False)
            found = text.find(literal, at + len(json.dumps(key, ensure_ascii=False)))
            if found >= 0:
                inner = found + 1 if isinstance(value, str) else found
                spans.append((inner, inner + len(literal) - (2 if isinstance(value, str) else 0)))
                at = found + len(literal)
    return spans
