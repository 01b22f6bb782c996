"""The simulated OpenAI-compatible endpoint, driven by the real openai client."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from dagster_batchllm.testing import (
    EchoResponder,
    Responder,
    SimulatedEndpoint,
    max_in_window,
    openai_client,
    post_json,
)

MODEL = "sim-model"


def ask(client: openai.OpenAI, text: str = "hello", **kwargs):
    messages = [{"role": "user", "content": text}]
    return client.chat.completions.create(model=kwargs.pop("model", MODEL), messages=messages,
                                          **kwargs)


client_for = openai_client


def raw_post(sim: SimulatedEndpoint, body: dict) -> tuple[int, bytes]:
    return post_json(sim, "chat/completions", body)


@pytest.fixture
def fresh(sim):
    sim.reset_stats()
    sim.configure(latency_s=0.0, error_rate_429=0.0, error_rate_500=0.0, drop_rate=0.0,
                  malformed_rate=0.0, max_context_tokens=None)
    return sim


def test_chat_completion_with_usage(fresh):
    reply = ask(client_for(fresh), "  hello \n world  ")
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert reply.choices[0].message.content == "[sim] hello world"
    assert reply.choices[0].finish_reason == "stop"
    # prompt: ceil(18 / 4) + 4 = 9; completion: ceil(len("[sim] hello world") / 4) = 5
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (9, 5)
    assert reply.usage.total_tokens == 14
    stats = fresh.stats()
    assert (stats["requests"], stats["ok"], stats["prompt_tokens"], stats["completion_tokens"]) == (
        1, 1, 9, 5)
    assert stats["log"][0][1:] == [200, 9, 5]


def test_content_parts_max_tokens_and_completions(fresh):
    client = client_for(fresh)
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    messages = [{"role": "user", "content": parts}]
    reply = client.chat.completions.create(model=MODEL, messages=messages)
    assert reply.choices[0].message.content == "[sim] one two"
    cut = ask(client, "word " * 50, max_tokens=3)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
    assert len(cut.choices[0].message.content) == 12
    legacy = client.completions.create(model=MODEL, prompt="abcdefgh", max_tokens=2)
    assert legacy.choices[0].text == "[sim] ab" and legacy.choices[0].finish_reason == "length"
    assert (legacy.usage.prompt_tokens, legacy.usage.completion_tokens) == (2, 2)


def test_models_and_unknown_model(fresh):
    client = client_for(fresh)
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as info:
        ask(client, model="gpt-nope")
    assert "does not exist" in info.value.message
    assert raw_post(fresh, {"model": MODEL, "messages": [], "stream": True})[0] == 400


SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "summary": {"type": "string", "maxLength": 20},
        "words": {"type": "integer"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["sentiment", "summary", "words", "flag", "tags", "note"],
    "additionalProperties": False,
    "$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string"}},
                      "required": ["name"]}},
}


def test_structured_output_conforms_and_picks_enum_from_prompt(fresh):
    client = client_for(fresh)
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    reply = ask(client, "A NEGATIVE review of four words", response_format=fmt, max_tokens=1)
    doc = json.loads(reply.choices[0].message.content)  # not cut despite max_tokens=1
    jsonschema.validate(doc, SCHEMA)
    assert doc["sentiment"] == "negative" and doc["words"] == 6 and doc["flag"] is True
    # No enum value in the prompt: a stable hash pick, the same every time.
    picks = {json.loads(ask(client, "meh", response_format=fmt).choices[0].message.content)[
        "sentiment"] for _ in range(3)}
    assert len(picks) == 1
    obj = ask(client, "free form", response_format={"type": "json_object"})
    assert json.loads(obj.choices[0].message.content) == {"text": "free form"}


def test_script_429_500_then_success(fresh):
    client = client_for(fresh)
    fresh.configure(retry_after_s=2.5)
    fresh.script(429, 500, 200)
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    assert info.value.response.headers["retry-after"] == "2.5"
    assert info.value.body["type"] == "RateLimitError"
    with pytest.raises(openai.InternalServerError):
        ask(client)
    assert ask(client).choices[0].message.content == "[sim] hello"
    assert fresh.stats()["by_status"] == {"429": 1, "500": 1, "200": 1}


def test_drop_malformed_and_other_broken_answers(fresh):
    client = client_for(fresh)
    fresh.script("drop")
    with pytest.raises(openai.APIConnectionError):
        ask(client)
    fresh.script("malformed")
    with pytest.raises(ValueError):  # the body is cut mid-JSON
        ask(client)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    fresh.script("no_choices", "empty", "bad_structured")
    assert "choices" not in json.loads(raw_post(fresh, body)[1])
    assert json.loads(raw_post(fresh, body)[1])["choices"][0]["message"]["content"] == ""
    bad = json.loads(raw_post(fresh, body)[1])["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(bad)
    stats = fresh.stats()
    assert stats["dropped"] == 1 and stats["ok"] == 0 and stats["by_status"] == {"200": 4}
    assert [row[1] for row in stats["log"]] == ["drop", "malformed", "no_choices", "empty",
                                                 "bad_structured"]


def test_context_length_exceeded(fresh):
    fresh.configure(max_context_tokens=50)
    with pytest.raises(openai.BadRequestError) as info:
        ask(client_for(fresh), "x" * 100, max_tokens=40)  # 29 + 40 > 50
    assert info.value.code == "context_length_exceeded"
    assert "maximum context length is 50 tokens" in info.value.message
    assert ask(client_for(fresh), "short", max_tokens=10).usage.prompt_tokens == 6


def test_api_key_required():
    with SimulatedEndpoint(api_key="s3cret") as sim:
        with pytest.raises(openai.AuthenticationError) as info:
            ask(client_for(sim, api_key="wrong"))
        assert "s3cret" not in json.dumps(info.value.body)
        assert ask(client_for(sim, api_key="s3cret")).choices[0].message.content
        assert sim.stats()["by_status"] == {"401": 1, "200": 1}


def test_stop_refuses_connections_and_restart_keeps_port_and_stats():
    sim = SimulatedEndpoint().start()
    try:
        port, client = sim.port, client_for(sim)
        ask(client, "first")
        sim.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1)
        with pytest.raises(openai.APIConnectionError):
            ask(client)
        sim.script(500)  # applied to the next server
        sim.restart()
        assert sim.port == port
        with pytest.raises(openai.InternalServerError):
            ask(client, "first")
        ask(client, "first")  # answered 200 before the restart: a duplicate
        stats = sim.stats()
        assert stats["ok"] == 2 and stats["duplicates"] == 1
    finally:
        sim.stop()


def test_duplicates_and_max_in_window(fresh):
    client = client_for(fresh)
    for text in ("a", "b", "a", "a"):
        ask(client, text)
    ask(client, "a", temperature=0.5)  # different params: a different request
    stats = fresh.stats()
    assert stats["ok"] == 5 and stats["duplicates"] == 2
    assert fresh.max_in_window(60) == 5
    assert fresh.max_in_window(60, "tokens") == stats["prompt_tokens"] + stats["completion_tokens"]
    log = [[0.0, 200, 1, 1], [0.5, 429, 0, 0], [1.0, 200, 2, 2], [2.2, 200, 5, 0]]
    assert max_in_window(log, 1.0) == 2  # windows are half-open: 0.0 and 1.0 never together
    assert max_in_window(log, 1.0, "tokens") == 5 and max_in_window(log, 2.5, "tokens") == 11


def test_server_side_max_concurrency():
    with SimulatedEndpoint(max_concurrency=4, latency_s=0.05) as sim:
        client = client_for(sim)
        started = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(lambda i: ask(client, f"q{i}"), range(20)))
        assert len(replies) == 20
        assert time.monotonic() - started >= 0.2  # 5 waves of 4
        stats = sim.stats()
        assert stats["max_concurrent"] <= 4 and stats["ok"] == 20 and stats["in_flight"] == 0


@pytest.mark.slow
def test_stall_times_out_and_stop_is_quick():
    sim = SimulatedEndpoint().start()
    sim.script("stall", "stall")
    with pytest.raises(openai.APITimeoutError):
        ask(client_for(sim, timeout=0.5))
    with ThreadPoolExecutor(1) as pool:  # a second stall is still hanging when we stop
        pending = pool.submit(ask, client_for(sim, timeout=5))
        time.sleep(0.2)
        started = time.monotonic()
        sim.stop()
        assert time.monotonic() - started < 2
        with pytest.raises(openai.APIConnectionError):
            pending.result()
    assert sim.stats()["stalled"] == 2


def test_random_faults_are_seeded(fresh):
    client = client_for(fresh)

    def run() -> list:
        fresh.reset_stats()
        fresh.configure(error_rate_500=0.5, seed=7)
        for _ in range(12):
            try:
                ask(client)
            except openai.InternalServerError:
                pass
        return [row[1] for row in fresh.stats()["log"]]

    first = run()
    assert first == run() and {200, 500} <= set(first)


def test_server_side_rate_limit():
    with SimulatedEndpoint(requests_per_minute=300, rate_limit_window_s=1.0) as sim:  # 5 per s
        client = client_for(sim)
        codes = []
        for _ in range(7):
            try:
                ask(client)
                codes.append(200)
            except openai.RateLimitError as exc:
                codes.append(429)
                assert 0 < float(exc.response.headers["retry-after"]) <= 1.0
        assert codes == [200] * 5 + [429] * 2
        assert sim.max_in_window(1.0) == 7  # the log counts every arrival, rejected or not


class Shouty:
    def models(self) -> list[str]:
        return ["loud"]

    def respond(self, model, messages, params) -> str:
        return messages[-1]["content"].upper()


def test_custom_responder_serves_its_models():
    assert isinstance(Shouty(), Responder) and isinstance(EchoResponder(), Responder)
    with SimulatedEndpoint(models=None, responder=Shouty()) as sim:
        assert ask(client_for(sim), "hey", model="loud").choices[0].message.content == "HEY"


@pytest.mark.slow
def test_process_mode_with_admin_routes():
    sim = SimulatedEndpoint(process=True, models=("a", "b"), latency_s=0.01)
    with sim:
        client = client_for(sim)
        assert sorted(m.id for m in client.models.list().data) == ["a", "b"]
        sim.script(429, 200)
        with pytest.raises(openai.RateLimitError):
            ask(client, model="a")
        assert ask(client, model="b").choices[0].message.content == "[sim] hello"
        port = sim.port
        sim.restart()
        assert sim.port == port
        ask(client, model="b")
        stats = sim.stats()
        assert stats["by_status"] == {"429": 1, "200": 2} and stats["duplicates"] == 1
    assert sim._proc is None
    with pytest.raises(openai.APIConnectionError):
        ask(client, model="a")


@pytest.mark.slow
def test_abandoned_request_is_not_counted_as_answered():
    with SimulatedEndpoint(latency_s=0.3) as sim:
        with pytest.raises(openai.APITimeoutError):
            ask(client_for(sim, timeout=0.1))
        time.sleep(0.35)
        ask(client_for(sim))  # the same request again: not a duplicate
        stats = sim.stats()
        assert stats["ok"] == 1 and stats["duplicates"] == 0
        assert [row[1] for row in stats["log"]] == ["abandoned", 200]


def test_server_side_token_rate_limit():
    # 600 tokens per minute over a 1 s window = 10 tokens; each request costs (1 + 4) + 3 = 8.
    with SimulatedEndpoint(tokens_per_minute=600, rate_limit_window_s=1.0) as sim:
        client = client_for(sim)
        ask(client, "abcd")
        with pytest.raises(openai.RateLimitError):
            ask(client, "abcd")
        assert sim.max_in_window(1.0, "tokens") == 8
