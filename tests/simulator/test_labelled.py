"""The labelled truth, its oracle and its proxy: agreement rate, determinism, logprobs."""

from __future__ import annotations

import json
import math

import openai

from dagster_batchllm.simulator.labelled import KeywordTruth, LabelledResponder
from dagster_batchllm.testing import SimulatedEndpoint

TRUTH = KeywordTruth({"refund": "refund", "broken": "complaint"}, default="question")
LABELS = {"type": "json_schema", "json_schema": {"name": "label", "schema": {
    "type": "object", "properties": {"label": {"type": "string",
                                               "enum": ["refund", "complaint", "question"]}}}}}
YES_NO = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "boolean"}}}}}


def _ask(responder, model, text, fmt, system="Does the customer ask for a refund?"):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return json.loads(responder.respond(model, messages, {"response_format": fmt}))


def test_the_proxy_agrees_with_the_truth_at_its_rate_and_the_oracle_always():
    responder = LabelledResponder(TRUTH, oracle_models=["big"], proxy_models=["small"],
                                  proxy_accuracy=0.8)
    texts = [f"ticket {i}: {['refund me', 'it is broken', 'hello'][i % 3]}" for i in range(3000)]
    truth = [TRUTH(t) for t in texts]
    assert [_ask(responder, "big", t, LABELS)["label"] for t in texts] == truth
    proxy = [_ask(responder, "small", t, LABELS)["label"] for t in texts]
    agreement = sum(p == t for p, t in zip(proxy, truth, strict=True)) / len(texts)
    assert 0.77 < agreement < 0.83
    assert proxy == [_ask(responder, "small", t, LABELS)["label"] for t in texts]  # rerun
    # yes/no: a label truth answers whether the instructions name its label
    assert [_ask(responder, "big", t, YES_NO)["answer"] for t in texts[:3]] == [True, False,
                                                                                 False]
    right = [responder.confidence("small", t) for t in texts if responder.proxy_is_right(t)]
    wrong = [responder.confidence("small", t) for t in texts if not responder.proxy_is_right(t)]
    assert sum(right) / len(right) > sum(wrong) / len(wrong) + 0.1
    assert min(right) < max(wrong)  # they overlap: confidence is a hint, not the truth


def test_logprobs_come_in_openais_format_when_asked():
    responder = LabelledResponder(TRUTH, oracle_models=["big"], proxy_models=["small"])
    with SimulatedEndpoint(models=None, responder=responder) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "I want a refund"}]
        reply = client.chat.completions.create(model="small", messages=messages,
                                               response_format=LABELS, logprobs=True,
                                               top_logprobs=2)
        tokens = reply.choices[0].logprobs.content
        assert "".join(t.token for t in tokens) == reply.choices[0].message.content
        label = next(t for t in tokens if t.token in ("refund", "complaint", "question"))
        confidence = responder.confidence("small", "I want a refund")
        assert math.isclose(math.exp(label.logprob), confidence)
        assert len(label.top_logprobs) == 2
        plain = client.chat.completions.create(model="small", messages=messages,
                                               response_format=LABELS)
        assert plain.choices[0].logprobs is None
