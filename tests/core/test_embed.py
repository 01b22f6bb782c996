"""``embed()`` against the simulated endpoint's ``/v1/embeddings``: vectors as the openai client
reads them, many inputs per request, each input keyed in the ledger, bad rows failing alone."""

from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint, openai_client

EMBED = "sim-embed"


@pytest.fixture(scope="module")
def sim():
    with SimulatedEndpoint(models=("chat-model",), embedding_models=(EMBED,),
                           embedding_dimensions=48, max_inputs_per_request=16) as endpoint:
        yield endpoint


@pytest.fixture
def fresh(sim):
    sim.reset_stats()
    sim.configure(latency_s=0.0, max_context_tokens=None, embedding_base64=True)
    return sim


def make_client(sim, tmp_path, **settings) -> InferenceClient:
    spec = EndpointSpec(name="sim", base_url=sim.base_url, models=("chat-model",),
                        embedding_models=(EMBED,), max_concurrency=8)
    return InferenceClient(InferenceSettings(
        endpoints=(spec,), store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        ledger_flush_interval_s=0.05, **settings))


def texts(n: int) -> list[str]:
    return [f"call {i} about a refund for order {i * 7}" for i in range(n)]


@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_vectors_are_the_ones_the_openai_client_reads(fresh, tmp_path, http_client):
    df = pd.DataFrame({"title": ["Refund", "Hours", "Refund"],
                       "body": ["lamp broke", "open on sunday?", "lamp broke"]})
    with make_client(fresh, tmp_path, http_client=http_client) as client:
        result = client.embed(df, input="{title}: {body}", model=EMBED)
    vectors = result.df["embedding"]
    assert result.df["embedding_error"].isna().all()
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (48,)
               for v in vectors)
    # Identical texts are sent once; the two distinct ones go in one request.
    assert result.stats.requests == 1 and result.stats.deduplicated == 1
    assert result.stats.prompt_tokens == fresh.stats()["embeddings"]["prompt_tokens"] > 0
    reference = openai_client(fresh).embeddings.create(
        model=EMBED, input=["Refund: lamp broke", "Hours: open on sunday?"])
    np.testing.assert_array_equal(vectors[0], np.array(reference.data[0].embedding, np.float32))
    np.testing.assert_array_equal(vectors[1], np.array(reference.data[1].embedding, np.float32))
    assert vectors[0] is vectors[2] or np.array_equal(vectors[0], vectors[2])
    vectors[1][0] = 0.5  # each row's array is its own and writable


def test_inputs_go_many_per_request_and_a_rerun_pays_only_for_new_texts(fresh, tmp_path):
    df = pd.DataFrame({"text": texts(100)})
    with make_client(fresh, tmp_path) as client:
        first = client.embed(df, input_column="text", model=EMBED, inputs_per_request=16)
        assert first.stats.succeeded == 100 and first.stats.requests == 7  # 6 x 16 + 4
        assert fresh.stats()["embeddings"]["inputs"] == 100
        dry = client.estimate(pd.DataFrame({"text": texts(120)}), input_column="text",
                              model=EMBED, inputs_per_request=16, task="embed")
        assert (dry.rows_answered_by_ledger, dry.requests_to_send) == (100, 2)
        fresh.reset_stats()
        again = client.embed(pd.DataFrame({"text": texts(120)}), input_column="text",
                             model=EMBED, inputs_per_request=16)
    assert again.stats.cached == 100 and again.stats.succeeded == 120
    assert fresh.stats()["embeddings"]["inputs"] == 20 and again.stats.requests == 2
    for old, new in zip(first.df["embedding"], again.df["embedding"][:100], strict=True):
        np.testing.assert_array_equal(old, new)


def test_the_ledger_keeps_each_vector_as_base64_float32(fresh, tmp_path):
    df = pd.DataFrame({"text": ["one text", "another text"]})
    with make_client(fresh, tmp_path) as client:
        result = client.embed(df, input_column="text", model=EMBED, dimensions=16)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT response, prompt_tokens FROM batchllm_requests "
                                      "WHERE status = 'ok'")).fetchall()
    engine.dispose()
    assert len(stored) == 2 and sum(tokens for _, tokens in stored) == result.stats.prompt_tokens
    decoded = sorted(np.frombuffer(base64.b64decode(r), dtype="<f4").tobytes() for r, _ in stored)
    assert decoded == sorted(v.tobytes() for v in result.df["embedding"])
    assert all(len(base64.b64decode(r)) == 16 * 4 for r, _ in stored)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in result.df["embedding"])


def test_bad_cells_and_an_over_long_input_fail_alone(fresh, tmp_path):
    fresh.configure(max_context_tokens=50)
    cells = texts(20)
    cells[3], cells[5], cells[7] = None, "   ", 12.5
    cells[11] = "word " * 100  # ~125 tokens: the server refuses the request naming input[i]
    df = pd.DataFrame({"text": cells})
    with make_client(fresh, tmp_path) as client:
        result = client.embed(df, input_column="text", model=EMBED, inputs_per_request=16)
    errors = result.df["embedding_error"]
    assert result.error_types[[3, 5, 7]].tolist() == ["invalid_input"] * 3
    assert "is null" in errors[3] and "is empty" in errors[5] and "not text" in errors[7]
    assert result.error_types[11] == "context_length_exceeded"
    assert "input[0]" in errors[11] and "maximum context length" in errors[11]
    assert result.df["embedding"][11] is None
    ok = [i for i in range(20) if i not in (3, 5, 7, 11)]
    assert errors[ok].isna().all() and result.stats.succeeded == len(ok)
    assert result.stats.failed == 4


def test_a_declared_context_fails_over_long_inputs_before_sending(fresh, tmp_path):
    spec = EndpointSpec(name="sim", base_url=fresh.base_url, embedding_models=(EMBED,),
                        max_context_tokens=20)
    df = pd.DataFrame({"text": ["short", "word " * 40]})
    with InferenceClient(InferenceSettings(endpoints=(spec,), store_url=None)) as client:
        result = client.embed(df, input_column="text")  # the only embedding model served
        capped = client.embed(df, input_column="text", max_input_tokens=1)
    assert result.error_types.tolist() == [None, "context_length_exceeded"]
    assert fresh.stats()["embeddings"]["inputs"] == 1
    assert capped.error_types.tolist() == ["context_length_exceeded"] * 2
    assert "max_input_tokens (1)" in capped.df["embedding_error"][0]


def test_a_server_refusing_base64_is_asked_for_floats(fresh, tmp_path):
    fresh.configure(embedding_base64=False)
    df = pd.DataFrame({"text": texts(10)})
    with make_client(fresh, tmp_path) as client:
        result = client.embed(df, input_column="text", model=EMBED)
    assert result.stats.succeeded == 10 and result.stats.requests == 2  # refused, then floats
    fresh.configure(embedding_base64=True)
    reference = openai_client(fresh).embeddings.create(model=EMBED, input=texts(10))
    for row, item in zip(result.df["embedding"], reference.data, strict=True):
        np.testing.assert_array_equal(row, np.array(item.embedding, np.float32))


def test_replies_with_wrong_vectors_fail_their_rows_with_the_reason(fresh, tmp_path):
    df = pd.DataFrame({"text": texts(4)})
    with make_client(fresh, tmp_path, max_attempts=1) as client:
        fresh.script("bad_structured")  # vectors of half the size asked for
        short = client.embed(df, input_column="text", model=EMBED, dimensions=32)
        fresh.script("empty", "empty", "empty")  # no vectors: split down to single inputs
        missing = client.embed(pd.DataFrame({"text": ["a b", "c d"]}), input_column="text",
                               model=EMBED)
    assert short.error_types.tolist() == ["malformed_response"] * 4
    assert "16 components where dimensions=32" in short.df["embedding_error"][0]
    assert missing.error_types.tolist() == ["malformed_response"] * 2
    assert "0 vectors for 1 inputs" in missing.df["embedding_error"][0]


def test_retries_and_a_whole_request_failure_apply_to_the_group(fresh, tmp_path):
    df = pd.DataFrame({"text": texts(8)})
    with make_client(fresh, tmp_path, max_attempts=2, retry_initial_backoff_s=0.01) as client:
        fresh.script(500)
        retried = client.embed(df, input_column="text", model=EMBED)
        fresh.script(500, 500)
        failed = client.embed(pd.DataFrame({"text": ["x y z", "y z w"]}), input_column="text",
                              model=EMBED)
    assert retried.stats.succeeded == 8 and retried.stats.retries == 1
    assert retried.stats.requests == 2
    assert failed.error_types.tolist() == ["server_error"] * 2


def test_a_token_budget_defers_what_it_cannot_cover(fresh, tmp_path):
    df = pd.DataFrame({"text": texts(30)})
    with make_client(fresh, tmp_path) as client:
        result = client.embed(df, input_column="text", model=EMBED, token_budget=100)
        later = client.embed(df, input_column="text", model=EMBED)
    assert 0 < result.stats.succeeded < 30 and result.stats.deferred == 30 - result.stats.succeeded
    assert set(result.error_types.dropna()) == {"deferred"}
    assert later.stats.cached == result.stats.succeeded and later.stats.succeeded == 30


def test_mistakes_in_the_call_raise_before_sending(fresh, tmp_path):
    df = pd.DataFrame({"text": ["a"]})
    with make_client(fresh, tmp_path) as client:
        with pytest.raises(InferenceConfigError, match="served on /chat/completions"):
            client.embed(df, input_column="text", model="chat-model")
        with pytest.raises(InferenceConfigError, match="embedding model 'nope'"):
            client.embed(df, input_column="text", model="nope")
        with pytest.raises(InferenceConfigError, match=r"Column\(s\) \['body'\]"):
            client.embed(df, input="{body}", model=EMBED)
        with pytest.raises(InferenceConfigError, match="exactly one of input="):
            client.embed(df, input="{text}", input_column="text", model=EMBED)
        with pytest.raises(InferenceConfigError, match="inputs_per_request must be a positive"):
            client.embed(df, input_column="text", model=EMBED, inputs_per_request=0)
        with pytest.raises(InferenceConfigError, match="unknown argument"):
            client.embed(df, input_column="text", model=EMBED, prompt="x")
    assert fresh.stats()["embeddings"]["requests"] == 0


def test_replies_are_read_in_index_order_and_odd_ones_are_refused():
    import json as json_module

    from dagster_batchllm.core.errors import MalformedResponseError
    from dagster_batchllm.core.tasks.embed.call import EmbedCall
    from dagster_batchllm.core.tasks.embed.task import EmbedTask

    def reply(data):
        return json_module.dumps({"data": data, "usage": {"prompt_tokens": 6}}).encode()

    def vector(x):
        return base64.b64encode(np.full(3, x, dtype="<f4").tobytes()).decode()

    parse = EmbedTask.parse_reply
    shuffled = parse(reply([{"index": i, "embedding": vector(i)} for i in (2, 0, 1)]),
                     endpoint="e", latency_s=0.0)
    assert shuffled.payload == [vector(0), vector(1), vector(2)] and shuffled.prompt_tokens == 6
    unindexed = parse(reply([{"embedding": vector(i)} for i in (5, 6)]), endpoint="e",
                      latency_s=0.0)
    assert unindexed.payload == [vector(5), vector(6)]
    for bad in ([{"index": 0, "embedding": vector(0)}, {"index": 0, "embedding": vector(1)}],
                [{"index": "0", "embedding": vector(0)}], "not a list"):
        with pytest.raises(MalformedResponseError, match="indexes|data"):
            parse(reply(bad), endpoint="e", latency_s=0.0)

    task = EmbedTask(EmbedCall(input_column="t", model="m"))
    [item] = task.requests(iter([("hello there",)]))
    floats = parse(reply([{"index": 0, "embedding": [0.5, -0.25, 1.0]}]), endpoint="e",
                   latency_s=0.0)
    [part] = task.split_reply(floats, [item])
    np.testing.assert_array_equal(task.value(part.content), np.array([0.5, -0.25, 1.0], "f4"))
    assert part.prompt_tokens == 6
    for broken in (["x", 1], "abc", None):
        [failed] = task.split_reply(parse(reply([{"index": 0, "embedding": broken}]),
                                          endpoint="e", latency_s=0.0), [item])
        assert failed.error_type.value == "malformed_response"
    with pytest.raises(MalformedResponseError, match="NaN"):
        task.value(base64.b64encode(np.array([np.nan], "<f4").tobytes()).decode())


def test_a_server_taking_fewer_inputs_per_request_makes_later_requests_smaller(tmp_path):
    with SimulatedEndpoint(embedding_models=(EMBED,), embedding_dimensions=8,
                           max_inputs_per_request=8) as small:
        spec = EndpointSpec(name="small", base_url=small.base_url, embedding_models=(EMBED,),
                            max_concurrency=1)
        with InferenceClient(InferenceSettings(endpoints=(spec,), store_url=None)) as client:
            result = client.embed(pd.DataFrame({"text": texts(200)}), input_column="text",
                                  inputs_per_request=64)
        stats = small.stats()["embeddings"]
    assert result.stats.succeeded == 200
    # The two groups of 64 gathered before the first refusal are split down to 8 (1 + 2 + 4
    # refusals each); the later ones are gathered 8 at a time. Halving every group would have
    # been refused 7 times per 64 inputs: 21 times.
    assert stats["by_status"]["400"] <= 14 and stats["ok"] == 25


def test_a_model_column_naming_an_embedding_model_fails_those_rows_in_infer(fresh, tmp_path):
    df = pd.DataFrame({"m": ["chat-model", EMBED], "text": ["hi", "hi"]})
    with make_client(fresh, tmp_path) as client:
        result = client.infer(df, prompt="Say {text}", model_column="m", max_tokens=8)
    assert result.error_types.tolist() == [None, "unsupported_model"]
    assert "not served on /chat/completions" in result.df["output_error"][1]


def test_only_strict_base64_replies_are_marked_safe_for_the_journal():
    from dagster_batchllm.core.ledger.journal import JsonSafeText
    from dagster_batchllm.core.requests import Completion
    from dagster_batchllm.core.tasks.embed.call import EmbedCall
    from dagster_batchllm.core.tasks.embed.task import EmbedTask

    task = EmbedTask(EmbedCall(input_column="text", model="m"))
    items = list(task.requests(iter([("a",), ("b",)])))
    vectors = [np.array([1.0, 2.0, 3.0], "<f4"), np.array([4.0, 5.0, 6.0], "<f4")]
    texts = [base64.b64encode(v.tobytes()).decode() for v in vectors]

    def split(payload):
        reply = Completion(content="", prompt_tokens=2, completion_tokens=0,
                           usage_reported=True, finish_reason=None, latency_s=0.0,
                           payload=payload)
        return task.split_reply(reply, items)

    parts = split(texts)
    assert all(type(p.content) is JsonSafeText for p in parts)
    assert [task.reply_value(p, i).tolist() for p, i in zip(parts, items, strict=True)] == \
        [v.tolist() for v in vectors]
    # A character outside the base64 alphabet: nothing of that reply is marked safe (the
    # journal escapes it as any text), and the good vector still decodes on its own.
    parts = split([texts[0][:4] + '"' + texts[0][5:], texts[1]])
    assert [type(p.content) for p in parts] == [str, str]
    assert task.reply_value(parts[1], items[1]).tolist() == vectors[1].tolist()
