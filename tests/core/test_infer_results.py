"""What ``infer`` returns: rows in input order, output and error columns, stats, estimates.

Every test talks HTTP to a real simulated server; the openai path drives the real ``openai``
client (over httpx) against it.
"""

from __future__ import annotations

import jsonschema
import numpy as np
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, InferenceConfigError, Price
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.transport import openai_http_library
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.rendering import iter_row_requests
from dagster_batchllm.openai_server.protocol import tokens
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"


def shuffled_frame(n: int, seed: int = 7) -> pd.DataFrame:
    """Rows whose index is neither default nor sorted: string labels in a shuffled order."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    return pd.DataFrame(
        {"text": [f"item number {i}" for i in order], "group": [i % 3 for i in order]},
        index=pd.Index([f"r{i:04d}" for i in order], name="rid"),
    )


def sim_tokens(prompt: str, max_tokens: int) -> tuple[int, int]:
    """The simulator's usage for one plain echo request (see its docstrings)."""
    return tokens(prompt) + 4, min(tokens("[sim] " + prompt), max_tokens)


@pytest.fixture
def count_httpx_sends(monkeypatch):
    """Counts the requests the openai client's HTTP library (httpx or httpx2) really sends."""
    httpx = openai_http_library()
    calls = {"n": 0}
    original = httpx.AsyncClient.send

    async def send(self, request, *args, **kwargs):
        if request.url.path.endswith("/chat/completions"):
            calls["n"] += 1
        return await original(self, request, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", send)
    return calls


@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_results_keep_input_order_and_index_with_output_error_and_stats(
    sim, make_client, http_client, count_httpx_sends
):
    df = shuffled_frame(120)
    client = make_client(sim, http_client=http_client)

    result = client.infer(df, prompt="Echo {text}", model=MODEL, output_column="answer",
                          max_tokens=64)

    out = result.df
    assert out.index.equals(df.index) and out.index.name == "rid"
    assert list(out.columns) == ["text", "group", "answer", "answer_error"]
    assert out["text"].tolist() == df["text"].tolist()
    assert out["answer"].tolist() == [f"[sim] Echo {t}" for t in df["text"]]
    assert out["answer_error"].isna().all()
    assert (result.output_column, result.error_column) == ("answer", "answer_error")
    assert result.failed_rows.empty

    server = sim.stats(log=False)
    assert server["requests"] == server["ok"] == 120 and server["duplicates"] == 0
    if http_client == "openai":
        assert count_httpx_sends["n"] == 120  # the official client really sent them
    else:
        assert count_httpx_sends["n"] == 0

    stats = result.stats
    assert (stats.rows, stats.succeeded, stats.failed, stats.deferred, stats.cached) == (
        120, 120, 0, 0, 0)
    assert (stats.requests, stats.retries, stats.deduplicated) == (120, 0, 0)
    # Token counts are the server's usage, summed exactly.
    assert stats.prompt_tokens == server["prompt_tokens"] > 0
    assert stats.completion_tokens == server["completion_tokens"] > 0
    expected = [sim_tokens(f"Echo {t}", 64) for t in df["text"]]
    assert stats.prompt_tokens == sum(p for p, _ in expected)
    assert stats.completion_tokens == sum(c for _, c in expected)
    assert stats.tokens_by_model == {
        MODEL: {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens}
    }
    assert stats.elapsed_s > 0 and stats.rows_per_s > 0
    assert 0 < stats.latency_p50_s <= stats.latency_p95_s
    assert stats.endpoints["ep0"]["requests"] == stats.endpoints["ep0"]["succeeded"] == 120
    assert stats.endpoints["ep0"]["outstanding"] == 0
    assert stats.errors_by_type == {} and stats.estimated_cost_usd is None
    as_dict = stats.as_dict()
    assert as_dict["rows"] == 120 and as_dict["failure_rate"] == 0.0

    records = client.ledger.records()
    assert len(records) == 120 and set(records["status"]) == {"ok"}
    assert set(records["endpoint"]) == {"ep0"} and (records["attempts"] == 1).all()


@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_structured_output_is_parsed_into_validated_dicts(sim, make_client, http_client):
    schema = {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
            "words": {"type": "integer", "minimum": 0},
        },
        "required": ["sentiment", "words"],
        "additionalProperties": False,
    }
    df = pd.DataFrame({"review": ["a positive take", "quite negative overall", "meh, neutral"]},
                      index=[30, 10, 20])
    result = make_client(sim, http_client=http_client).infer(
        df, prompt="Rate: {review}", model=MODEL, output_column="rating",
        response_format=schema, max_tokens=64,
    )
    ratings = result.df["rating"].tolist()
    assert all(isinstance(r, dict) for r in ratings)
    for rating in ratings:
        jsonschema.validate(rating, schema)
    assert [r["sentiment"] for r in ratings] == ["positive", "negative", "neutral"]
    assert [r["words"] for r in ratings] == [4, 4, 3]
    assert result.df["rating_error"].isna().all()


def test_model_column_routes_rows_per_model_and_unknown_models_fail_per_row(make_client):
    with SimulatedEndpoint(models=("model-a",)) as sim_a, \
            SimulatedEndpoint(models=("model-b",)) as sim_b:
        df = pd.DataFrame({
            "text": [f"question {i}" for i in range(12)],
            "model_id": ["model-a", "model-b", "no-such-model"] * 4,
        }, index=range(100, 112))
        result = make_client(sim_a, sim_b).infer(
            df, prompt="{text}", model_column="model_id", output_column="out")

        out = result.df
        routed = out[out["model_id"] != "no-such-model"]
        assert routed["out_error"].isna().all()
        assert (routed["out"] == "[sim] " + routed["text"]).all()
        unknown = out[out["model_id"] == "no-such-model"]
        assert unknown["out"].isna().all()
        assert unknown["out_error"].str.startswith("unsupported_model:").all()
        assert unknown["out_error"].str.contains("no-such-model").all()
        # Each server saw exactly its own rows; nothing was sent for the unknown model.
        assert sim_a.stats(log=False)["ok"] == 4 and sim_a.stats(log=False)["requests"] == 4
        assert sim_b.stats(log=False)["ok"] == 4 and sim_b.stats(log=False)["requests"] == 4
        stats = result.stats
        assert (stats.succeeded, stats.failed) == (8, 4)
        assert stats.errors_by_type == {"unsupported_model": 4}
        assert set(stats.tokens_by_model) == {"model-a", "model-b"}
        assert stats.endpoints["ep0"]["succeeded"] == stats.endpoints["ep1"]["succeeded"] == 4


def test_unknown_fixed_model_raises_before_any_request(sim, make_client):
    df = pd.DataFrame({"text": ["hello"]})
    with pytest.raises(InferenceConfigError, match="no-such-model"):
        make_client(sim).infer(df, prompt="{text}", model="no-such-model")
    assert sim.stats(log=False)["requests"] == 0


class SystemEcho:
    """Answers with the system message it received, to see what the client rendered."""

    def models(self) -> list[str]:
        return [MODEL]

    def respond(self, model, messages, params) -> str:
        return " | ".join(f"{m['role']}={m['content']}" for m in messages)


def test_system_template_is_rendered_per_row_from_its_own_columns(make_client):
    df = pd.DataFrame({"persona": ["a pirate", "a poet"], "text": ["hi", "bye"],
                       "unused": [1, 2]})
    with SimulatedEndpoint(responder=SystemEcho()) as sim:
        result = make_client(sim).infer(df, prompt="Say {text}", system="You are {persona}.",
                                        model=MODEL, output_column="out")
    assert result.df["out"].tolist() == [
        "system=You are a pirate. | user=Say hi", "system=You are a poet. | user=Say bye"]


def test_identical_rows_are_sent_once_and_share_the_answer(sim, make_client):
    texts = [f"distinct {i % 5}" for i in range(40)]
    df = pd.DataFrame({"text": texts}, index=range(40, 0, -1))
    result = make_client(sim).infer(df, prompt="Echo {text}", model=MODEL, output_column="out")

    server = sim.stats(log=False)
    assert server["requests"] == server["ok"] == 5 and server["duplicates"] == 0
    assert result.df["out"].tolist() == [f"[sim] Echo {t}" for t in texts]
    assert result.df["out_error"].isna().all()
    stats = result.stats
    assert (stats.succeeded, stats.requests, stats.deduplicated) == (40, 5, 35)


def test_identical_rows_in_later_chunks_share_an_answer_not_yet_written(sim, make_client):
    # Small chunks and a slow ledger flush: a repeat of an answered row arrives while that
    # answer is still waiting to be written to the ledger.
    client = make_client(sim, chunk_rows=2, ledger_flush_interval_s=5.0, ledger_flush_rows=1000)
    texts = ["repeated" if i % 2 == 0 else f"new {i}" for i in range(40)]
    df = pd.DataFrame({"text": texts})

    result = client.infer(df, prompt="Echo {text}", model=MODEL, output_column="out")

    assert result.df["out"].tolist() == [f"[sim] Echo {t}" for t in texts]
    assert (result.stats.succeeded, result.stats.deduplicated) == (40, 19)
    assert sim.stats(log=False)["requests"] == 21


def test_a_second_call_is_answered_from_the_ledger_without_requests(sim, make_client):
    df = shuffled_frame(30)
    client = make_client(sim)
    first = client.infer(df, prompt="Echo {text}", model=MODEL, output_column="out")
    second = client.infer(df, prompt="Echo {text}", model=MODEL, output_column="out")

    assert sim.stats(log=False)["requests"] == 30
    assert second.df["out"].tolist() == first.df["out"].tolist()
    assert (second.stats.cached, second.stats.succeeded, second.stats.requests) == (30, 30, 0)
    # A changed generation parameter is a different request: it is sent again.
    client.infer(df.head(3), prompt="Echo {text}", model=MODEL, output_column="out",
                 temperature=0.5)
    assert sim.stats(log=False)["requests"] == 33


def _expected_prompt_tokens(df, template, max_tokens, settings):
    spec = InferenceCall(prompt=template, model=MODEL, max_tokens=max_tokens).bind(
        list(df.columns), settings)
    requests = list(iter_row_requests(df.itertuples(index=False, name=None), spec,
                                      default_max_tokens=settings.default_max_tokens))
    return {r.key: r.typical_prompt_tokens for r in requests}


def test_estimate_sends_nothing_and_counts_ledger_hits_duplicates_invalid_and_cost(
    sim, make_client
):
    client = make_client(sim, prices={MODEL: Price(input_per_mtok=2.0, output_per_mtok=6.0)})
    template = "Summarize: {text}"
    answered = pd.DataFrame({"text": [f"row {i}" for i in range(10)]})
    client.infer(answered, prompt=template, model=MODEL, max_tokens=20)
    assert sim.stats(log=False)["requests"] == 10

    # 10 answered rows, 15 new distinct rows, 5 repeats of new rows, 2 invalid rows.
    new = [f"fresh row {i}" for i in range(15)]
    df = pd.DataFrame({"text": [*answered["text"], *new, *new[:5], None, "   "]})
    estimate = client.estimate(df, prompt=template, model=MODEL, max_tokens=20)

    assert sim.stats(log=False)["requests"] == 10  # a dry run sends nothing
    assert estimate.rows == 32
    assert estimate.rows_answered_by_ledger == 10
    assert estimate.requests_to_send == 15
    assert estimate.rows_deduplicated == 5
    assert estimate.invalid_rows == 2
    typical = _expected_prompt_tokens(pd.DataFrame({"text": new}), template, 20, client.settings)
    assert estimate.estimated_prompt_tokens == sum(typical.values())
    assert estimate.max_completion_tokens == 15 * 20
    assert estimate.tokens_by_model == {MODEL: {
        "prompt_tokens": estimate.estimated_prompt_tokens, "completion_tokens": 300}}
    expected_cost = (estimate.estimated_prompt_tokens * 2.0 + 300 * 6.0) / 1e6
    assert estimate.estimated_cost_usd == pytest.approx(expected_cost, abs=1e-6)
    assert estimate.as_dict()["requests_to_send"] == 15

    # The dry run is right: infer sends exactly what it said.
    result = client.infer(df, prompt=template, model=MODEL, max_tokens=20)
    assert sim.stats(log=False)["requests"] == 10 + 15
    assert (result.stats.cached, result.stats.requests, result.stats.failed) == (10, 15, 2)


def test_estimate_of_a_config_mistake_raises_like_infer(sim, make_client):
    with pytest.raises(InferenceConfigError, match="missing_col"):
        make_client(sim).estimate(pd.DataFrame({"text": ["x"]}), prompt="{missing_col}",
                                  model=MODEL)
    assert sim.stats(log=False)["requests"] == 0


def test_model_prices_turn_the_servers_usage_into_a_cost(sim, make_client):
    client = make_client(sim, prices={MODEL: Price(input_per_mtok=3.0, output_per_mtok=15.0)})
    result = client.infer(shuffled_frame(25), prompt="Echo {text}", model=MODEL)
    server = sim.stats(log=False)
    expected = (server["prompt_tokens"] * 3.0 + server["completion_tokens"] * 15.0) / 1e6
    assert result.stats.estimated_cost_usd == pytest.approx(expected, abs=1e-6)
    assert result.stats.estimated_cost_usd > 0


def test_resource_infers_outside_dagster_and_exposes_client_and_ledger(sim, tmp_path):
    llm = BatchInferenceResource(
        endpoints=[Endpoint(name="gpu-a", base_url=sim.base_url, models=[MODEL],
                            max_concurrency=8)],
        store_url=f"sqlite:///{tmp_path / 'resource.db'}",
        prices={MODEL: {"input_per_mtok": 1.0, "output_per_mtok": 1.0}},
    )
    df = shuffled_frame(15)
    estimate = llm.estimate(df, prompt="Echo {text}", model=MODEL, output_column="summary")
    assert estimate.requests_to_send == 15 and sim.stats(log=False)["requests"] == 0
    result = llm.infer(df, prompt="Echo {text}", model=MODEL, output_column="summary",
                       partition_key="2024-01-01")
    assert isinstance(llm.client, InferenceClient)
    assert result.df["summary"].tolist() == [f"[sim] Echo {t}" for t in df["text"]]
    assert result.stats.estimated_cost_usd > 0
    records = llm.ledger.records(partition_key="2024-01-01")
    assert len(records) == 15 and set(records["endpoint"]) == {"gpu-a"}
    llm.client.close()


def test_existing_output_column_is_refused_before_any_request(sim, make_client):
    df = pd.DataFrame({"text": ["a"], "out": ["already here"]})
    with pytest.raises(InferenceConfigError, match="already has a column 'out'"):
        make_client(sim).infer(df, prompt="{text}", model=MODEL, output_column="out")
    assert sim.stats(log=False)["requests"] == 0
