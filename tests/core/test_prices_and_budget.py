"""Prices per endpoint, the cost of each answered row in the ledger, and the budget in USD."""

from __future__ import annotations

import pytest

from dagster_batchllm import Price
from dagster_batchllm.core.pricing import cost_at
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

MODEL = "sim-model"


# -- prices -----------------------------------------------------------------------------------


def test_a_price_charges_cached_prompt_tokens_at_the_cached_price_and_batch_lines_at_the_discount():
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    # 1000 prompt tokens of which 400 cached, 100 completion tokens
    online = (600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6
    assert price.cost(1000, 100, 400) == pytest.approx(online)
    assert price.cost(1000, 100, 400, batch=True) == pytest.approx(online * 0.5)
    # Without a cached price, cached tokens cost the input price.
    assert Price(2.0, 8.0).cost(1000, 100, 400) == pytest.approx((1000 * 2.0 + 800) / 1e6)
    # More cached tokens than prompt tokens (a server's miscount) never gives a negative cost.
    assert cost_at(price.per_token(), 10, 0, 50) == pytest.approx(10 * 0.5 / 1e6)
    with pytest.raises(ValueError, match="input_per_mtok"):
        Price(-1.0, 1.0)


def _settings(**endpoints) -> InferenceSettings:
    return InferenceSettings(endpoints=tuple(
        EndpointSpec(name=name, base_url="http://127.0.0.1:9/v1", models=(MODEL, "other"),
                     prices=prices) for name, prices in endpoints.items()),
        model_prices=(("other", 1.0, 1.0),))


def test_one_lookup_decides_a_models_price_on_an_endpoint():
    cheap, dear = Price(0.1, 0.2), Price(1.0, 2.0)
    settings = _settings(a={MODEL: cheap}, b=dear)
    assert settings.price_at(MODEL, "a") == cheap
    assert settings.price_at(MODEL, "b") == dear  # one Price for every model of b
    assert settings.price_at("other", "b") == dear
    # a names no price of "other": the resource-wide model_prices
    assert settings.price_at("other", "a") == Price(1.0, 1.0, batch_discount=1.0)
    # No endpoint named (an estimate, a bound): the dearest of those serving it.
    assert settings.price_at(MODEL) == dear
    assert settings.price_for(MODEL) == (1.0, 2.0)
    assert _settings(a=None).price_at(MODEL) is None


def test_an_endpoint_refuses_prices_of_models_it_does_not_serve():
    with pytest.raises(ValueError, match="does not serve"):
        EndpointSpec(name="a", base_url="http://127.0.0.1:9/v1", models=(MODEL,),
                     prices={"gpt-4o": Price(1.0, 1.0)})


# -- cached tokens in the replies ---------------------------------------------------------------


def _reply(usage):
    return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": usage}


def test_cached_tokens_are_read_from_openai_and_vllm_usage_and_are_0_where_absent():
    from dagster_batchllm.core.delivery.transport import completion_from_payload

    def cached(usage):
        return completion_from_payload(_reply(usage), endpoint="e", latency_s=0.0).cached_tokens

    base = {"prompt_tokens": 100, "completion_tokens": 5}
    assert cached({**base, "prompt_tokens_details": {"cached_tokens": 64}}) == 64
    assert cached(base) == 0
    assert cached({**base, "prompt_tokens_details": None}) == 0  # vLLM without a prefix cache
    assert cached({**base, "prompt_tokens_details": {"audio_tokens": 0}}) == 0
    assert cached(None) == 0


def test_anthropic_cache_reads_are_the_cached_tokens_of_a_batch_result():
    from dagster_batchllm.core.delivery.batch_api.anthropic_messages import chat_reply
    from dagster_batchllm.core.delivery.transport import completion_from_payload

    message = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 10, "cache_read_input_tokens": 300,
                         "cache_creation_input_tokens": 20, "output_tokens": 7}}
    completion = completion_from_payload(chat_reply(message), endpoint="e", latency_s=0.0)
    assert (completion.prompt_tokens, completion.cached_tokens,
            completion.completion_tokens) == (330, 300, 7)
