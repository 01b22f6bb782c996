"""``/v1/embeddings`` on the simulated endpoint, driven by the real openai client."""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from dagster_batchllm.openai_server.protocol import tokens
from dagster_batchllm.testing import SimulatedEndpoint, openai_client, post_json

EMBED = "sim-embed"


client_for = openai_client


def raw_embed(sim: SimulatedEndpoint, body: dict) -> tuple[int, dict]:
    status, reply = post_json(sim, "embeddings", body)
    return status, json.loads(reply)


def norm(vector) -> float:
    return math.sqrt(sum(x * x for x in vector))


@pytest.fixture(scope="module")
def sim():
    with SimulatedEndpoint(embedding_models=(EMBED,), embedding_dimensions=64,
                           max_inputs_per_request=8) as endpoint:
        yield endpoint


@pytest.fixture
def fresh(sim):
    sim.reset_stats()
    sim.configure(latency_s=0.0, embedding_latency_s=None, max_context_tokens=None,
                  embedding_base64=True, error_rate_500=0.0)
    return sim


def test_vectors_are_deterministic_normalised_and_in_input_order(fresh):
    client = client_for(fresh)
    texts = ["alpha", "beta", "alpha", "a longer sentence of text"]
    reply = client.embeddings.create(model=EMBED, input=texts)  # the client asks for base64
    assert reply.model == EMBED and [d.index for d in reply.data] == [0, 1, 2, 3]
    vectors = [d.embedding for d in reply.data]
    assert all(len(v) == 64 and abs(norm(v) - 1.0) < 1e-6 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(tokens, texts))
    # Floats, sent as JSON numbers, are the same float32 values the base64 bytes held.
    floats = client.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    assert [d.embedding for d in floats.data] == vectors
    single = client.embeddings.create(model=EMBED, input="beta", encoding_format="float")
    assert single.data[0].embedding == vectors[1]
    stats = fresh.stats()
    assert stats["requests"] == 0 and stats["log"] == []  # chat counters untouched
    embeddings = stats["embeddings"]
    assert (embeddings["requests"], embeddings["ok"], embeddings["inputs"]) == (3, 3, 9)
    assert embeddings["prompt_tokens"] == 2 * sum(map(tokens, texts)) + tokens("beta")
    assert [row[1:] for row in embeddings["log"]][0] == [200, sum(map(tokens, texts)), 4]


def test_base64_is_little_endian_float32(fresh):
    status, body = raw_embed(fresh, {"model": EMBED, "input": ["x", "y"],
                                     "encoding_format": "base64"})
    assert status == 200
    _, floats = raw_embed(fresh, {"model": EMBED, "input": ["x", "y"]})  # float by default
    for packed, plain in zip(body["data"], floats["data"], strict=True):
        raw = base64.b64decode(packed["embedding"])
        assert len(raw) == 4 * 64
        assert list(struct.unpack("<64f", raw)) == plain["embedding"]


def test_dimensions_truncate_and_renormalise(fresh):
    client = client_for(fresh)
    full = client.embeddings.create(model=EMBED, input="text").data[0].embedding
    short = client.embeddings.create(model=EMBED, input="text", dimensions=16).data[0].embedding
    head_norm = norm(full[:16])
    assert len(short) == 16 and abs(norm(short) - 1.0) < 1e-6
    assert all(abs(s - f / head_norm) < 1e-6 for s, f in zip(short, full[:16], strict=True))
    for bad in (65, 0):
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model=EMBED, input="text", dimensions=bad)
        assert info.value.body["param"] == "dimensions"


def test_model_checks_and_listing(fresh):
    client = client_for(fresh)
    assert [m.id for m in client.models.list().data] == ["sim-model", EMBED]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="sim-model", input="x")
    assert "does not support embeddings" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")
    with pytest.raises(openai.BadRequestError) as info:  # and the other way round
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "x"}])
    assert "embedding model" in info.value.message
    assert fresh.stats()["embeddings"]["by_status"] == {"400": 1, "404": 1}


def test_input_validation(fresh):
    client = client_for(fresh)
    with pytest.raises(openai.BadRequestError) as info:  # the client accepts token ids; we don't
        client.embeddings.create(model=EMBED, input=[[1, 2, 3]])
    assert "token-id arrays are not supported" in info.value.message
    assert raw_embed(fresh, {"model": EMBED, "input": [1, 2, 3]})[0] == 400
    assert raw_embed(fresh, {"model": EMBED, "input": []})[0] == 400
    status, body = raw_embed(fresh, {"model": EMBED, "input": ["ok", ""]})
    assert status == 400 and "input[1] is empty" in body["error"]["message"]
    assert raw_embed(fresh, {"model": EMBED, "input": ["ok", 3]})[0] == 400
    assert raw_embed(fresh, {"model": EMBED, "input": "x", "encoding_format": "hex"})[0] == 400
    # max_inputs_per_request=8: eight are fine, nine are a 400
    assert len(client.embeddings.create(model=EMBED, input=["t"] * 8).data) == 8
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input=["t"] * 9)
    assert "at most 8 per request" in info.value.message


def test_over_long_input_is_named_so_the_client_can_split(fresh):
    fresh.configure(max_context_tokens=10)
    client = client_for(fresh)
    texts = ["short", "also short", "x" * 41, "fine"]  # 41 characters = 11 tokens
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input=texts)
    assert info.value.code == "context_length_exceeded"
    assert "input[2] has 11 tokens" in info.value.message
    # The client splits off the named row; the rest go through, the row alone fails again.
    rest = client.embeddings.create(model=EMBED, input=texts[:2] + texts[3:])
    assert len(rest.data) == 3
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input=texts[2])
    assert "input[0]" in info.value.message
    fresh.configure(embedding_max_context_tokens=20)  # its own limit wins over the chat one
    assert len(client.embeddings.create(model=EMBED, input=texts).data) == 4


def test_base64_refused_so_the_float_fallback_can_be_tested(fresh):
    fresh.configure(embedding_base64=False)
    client = client_for(fresh)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input="x")  # the client's default is base64
    assert "encoding_format base64 not supported" in info.value.message
    reply = client.embeddings.create(model=EMBED, input="x", encoding_format="float")
    assert len(reply.data[0].embedding) == 64


def test_faults_fail_the_whole_request(fresh):
    client = client_for(fresh)
    fresh.script(500, "drop", 429)
    with pytest.raises(openai.InternalServerError):
        client.embeddings.create(model=EMBED, input=["a", "b", "c"])
    with pytest.raises(openai.APIConnectionError):
        client.embeddings.create(model=EMBED, input=["a"])
    with pytest.raises(openai.RateLimitError) as info:
        client.embeddings.create(model=EMBED, input=["a"])
    assert info.value.response.headers["retry-after"] == "1"
    body = {"model": EMBED, "input": ["a", "b"], "dimensions": 8}
    fresh.script("no_choices", "empty", "bad_structured", "malformed")
    assert "data" not in raw_embed(fresh, body)[1]
    assert raw_embed(fresh, body)[1]["data"] == []
    assert [len(d["embedding"]) for d in raw_embed(fresh, body)[1]["data"]] == [4, 4]
    with pytest.raises(ValueError):
        raw_embed(fresh, body)
    stats = fresh.stats()["embeddings"]
    assert stats["by_status"] == {"500": 1, "429": 1, "200": 4}
    assert stats["dropped"] == 1 and stats["ok"] == 0 and stats["inputs"] == 4
    assert [row[1] for row in stats["log"]] == [500, "drop", 429, "no_choices", "empty",
                                                "bad_structured", "malformed"]


@pytest.mark.slow
def test_latency_is_per_request_whatever_its_size():
    # The latency is large beside what a loaded 2-core host adds to a request, so the upper
    # bounds below (each well under what the alternative would take) hold under load too.
    latency = 0.5
    with SimulatedEndpoint(embedding_models=(EMBED,), max_inputs_per_request=128) as sim:
        sim.configure(embedding_latency_s=latency, latency_s=0.0)
        client = client_for(sim)
        timings = {}
        for size in (1, 128):
            started = time.monotonic()
            client.embeddings.create(model=EMBED, input=[f"row {i}" for i in range(size)])
            timings[size] = time.monotonic() - started
        assert timings[1] >= latency and timings[128] >= latency
        assert timings[128] < latency * 4  # not 128 times the latency
        started = time.monotonic()  # and requests overlap: eight at once take one latency
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: client.embeddings.create(model=EMBED, input=[f"r{i}"] * 128),
                          range(8)))
        assert time.monotonic() - started < latency * 6  # one after another: 8 latencies
        assert sim.stats()["max_concurrent"] >= 2
        # Chat keeps its own latency (none).
        started = time.monotonic()
        client.chat.completions.create(model="sim-model", messages=[{"role": "user",
                                                                     "content": "x"}])
        assert time.monotonic() - started < latency


def test_auth_and_rate_limit_cover_embeddings():
    with SimulatedEndpoint(embedding_models=(EMBED,), api_key="k", tokens_per_minute=600,
                           rate_limit_window_s=1.0) as sim:
        with pytest.raises(openai.AuthenticationError):
            client_for(sim, api_key="wrong").embeddings.create(model=EMBED, input="x")
        client = client_for(sim, api_key="k")
        client.embeddings.create(model=EMBED, input="x" * 32)  # 8 tokens of the 10 per window
        with pytest.raises(openai.RateLimitError):
            client.embeddings.create(model=EMBED, input="x" * 12)
        assert sim.stats()["embeddings"]["by_status"] == {"401": 1, "200": 1, "429": 1}


@pytest.mark.slow
def test_process_mode_serves_the_same_vectors():
    options = dict(embedding_models=("e1", "e2"), embedding_dimensions=16,
                   max_inputs_per_request=2, embedding_base64=False)
    with SimulatedEndpoint(**options) as threaded:
        expected = client_for(threaded).embeddings.create(
            model="e1", input=["same text"], encoding_format="float").data[0].embedding
    sim = SimulatedEndpoint(process=True, **options)
    with sim:
        client = client_for(sim)
        with pytest.raises(openai.BadRequestError):  # embedding_base64=False travelled
            client.embeddings.create(model="e2", input="same text")
        with pytest.raises(openai.BadRequestError):  # so did max_inputs_per_request
            client.embeddings.create(model="e2", input=["a", "b", "c"], encoding_format="float")
        reply = client.embeddings.create(model="e2", input=["same text"], encoding_format="float")
        assert reply.data[0].embedding == expected  # model name does not seed the vector
        sim.restart()
        client.embeddings.create(model="e2", input=["same text"], encoding_format="float")
        stats = sim.stats()["embeddings"]
        assert stats["ok"] == 2 and stats["duplicates"] == 1 and stats["by_status"] == {
            "400": 2, "200": 2}
