"""plan(): what a call would send and cost, forecast from the ledger's past usage."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from dagster_batchllm import Plan, Price
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.run.plan import MIN_CALIBRATION_RECORDS

MODEL = "sim-model"
PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)


def _priced(settings, **endpoint_changes):
    return settings.replace(endpoints=tuple(
        dataclasses.replace(e, prices=PRICE, **endpoint_changes) for e in settings.endpoints))


def _rows(start, n, words=6):
    # Texts of different lengths (the simulator's replies echo them, so they vary too).
    return pd.DataFrame({"text": [f"ticket {i:05d}: " + "the printer jams again " * (1 + i % words)
                                  for i in range(start, start + n)]})


CALL = dict(prompt="Classify this ticket: {text}", model=MODEL, output_column="label",
            max_tokens=64, scope="tickets")


def test_a_plan_sends_nothing_and_leaves_out_ledger_hits_and_duplicates(sim, make_settings):
    with InferenceClient(_priced(make_settings(sim))) as client:
        empty = client.plan(_rows(0, 10), **CALL, partition_key="a")
        assert isinstance(empty, Plan) and empty.rows_to_send == 10
        assert empty.basis.startswith(f"{MODEL}: bound: 4 characters per token")
        assert empty.expected_output_tokens == 10 * 64 and empty.cached_share == 0
        # The bound is estimate()'s figures.
        bound = client.estimate(_rows(0, 10), **CALL, partition_key="a")
        assert empty.input_tokens == bound.estimated_prompt_tokens
        assert empty.cost_usd == pytest.approx(bound.estimated_cost_usd, abs=1e-6)
        assert sim.stats(log=False)["requests"] == 0

        client.infer(_rows(0, 4), **CALL, partition_key="a")
        sent = sim.stats(log=False)["requests"]
        df = pd.concat([_rows(0, 10), _rows(0, 3)], ignore_index=True)  # 3 repeated rows
        df.loc[len(df)] = [None]  # an invalid row
        plan = client.plan(df, **CALL, partition_key="a", mode="online", run_id="ignored")
        assert (plan.rows, plan.rows_to_send, plan.rows_answered_by_ledger,
                plan.rows_deduplicated, plan.invalid_rows) == (14, 6, 4, 3, 1)
        assert plan.requests_to_send == 6 and sim.stats(log=False)["requests"] == sent
        assert "online" in plan.summary() and "6 to send" in plan.summary()


def test_after_a_run_the_plan_is_calibrated_and_close_to_what_the_next_one_pays(
        sim, make_settings):
    with InferenceClient(_priced(make_settings(sim))) as client:
        client.infer(_rows(0, 120), **CALL, partition_key="day1")
        plan = client.plan(_rows(1000, 120), **CALL, partition_key="day2")
        assert plan.basis.startswith(f"{MODEL}: calibrated from 120 past records of scope "
                                     "'tickets'")
        assert plan.by_model[MODEL]["calibrated"]
        paid = client.infer(_rows(1000, 120), **CALL, partition_key="day2").stats
    assert plan.input_tokens == pytest.approx(paid.prompt_tokens, rel=0.05)
    assert plan.expected_output_tokens == pytest.approx(paid.completion_tokens, rel=0.2)
    assert plan.cost_usd == pytest.approx(paid.cost_usd, rel=0.2)
    # The bound (max_tokens for every reply) would have been well above it.
    assert plan.expected_output_tokens < 120 * 64 * 0.8


def test_too_few_past_records_keep_the_bound(sim, make_settings):
    with InferenceClient(_priced(make_settings(sim))) as client:
        client.infer(_rows(0, MIN_CALIBRATION_RECORDS - 1), **CALL, partition_key="day1")
        plan = client.plan(_rows(1000, 10), **CALL, partition_key="day2")
    assert plan.basis.startswith(f"{MODEL}: bound") and "19 past records" in plan.basis


def test_a_call_without_a_scope_is_calibrated_by_the_model_and_says_so(sim, make_settings):
    unscoped = {k: v for k, v in CALL.items() if k != "scope"}
    with InferenceClient(_priced(make_settings(sim))) as client:
        client.infer(_rows(0, 30), **CALL)
        plan = client.plan(_rows(1000, 10), **unscoped)
    assert "past records of model 'sim-model' (no scope)" in plan.basis


def test_cost_by_delivery_has_the_batch_price_where_a_batch_endpoint_serves_the_model(
        sim, make_settings):
    with InferenceClient(_priced(make_settings(sim))) as client:
        assert set(client.plan(_rows(0, 5), **CALL).cost_by_delivery) == {"online"}
    with InferenceClient(_priced(make_settings(sim), batch_api=True)) as client:
        online = client.plan(_rows(0, 5), **CALL)
        batch = client.plan(_rows(0, 5), **CALL, mode="batch_api")
    assert online.cost_by_delivery["batch_api"] == pytest.approx(
        online.cost_by_delivery["online"] * PRICE.batch_discount)
    assert (online.delivery, online.cost_usd) == ("online", online.cost_by_delivery["online"])
    assert batch.cost_usd == batch.cost_by_delivery["batch_api"]


def test_the_cached_share_comes_from_past_records(make_settings):
    from dagster_batchllm.testing import SimulatedEndpoint

    shared = "You are a careful classifier of support tickets. " * 8
    call = {**CALL, "prompt": shared + "{text}"}
    with SimulatedEndpoint(models=(MODEL,), prefix_cache_tokens=100_000) as sim:
        settings = _priced(make_settings(sim, endpoint_kwargs={"max_concurrency": 1}))
        with InferenceClient(settings) as client:
            first = client.infer(_rows(0, 40), **call, partition_key="day1").stats
            plan = client.plan(_rows(1000, 40), **call, partition_key="day2")
    assert plan.cached_share == pytest.approx(first.cached_share, rel=1e-6)
    assert 0 < plan.cached_share < 1
    uncached = PRICE.cost(plan.input_tokens, plan.expected_output_tokens)
    assert plan.cost_usd < uncached  # the cached tokens at the cached price


def test_budget_usd_checks_the_plan(sim, make_settings):
    from dagster_batchllm.core.errors import InferenceConfigError

    with InferenceClient(_priced(make_settings(sim))) as client:
        client.infer(_rows(0, 60), **CALL, partition_key="day1")
        plan = client.plan(_rows(1000, 60), **CALL, partition_key="day2")
        with pytest.raises(InferenceConfigError, match="planned to cost") as refused:
            client.infer(_rows(1000, 60), **CALL, partition_key="day2",
                         budget_usd=plan.cost_usd * 0.5)
        assert "calibrated from 60 past records" in str(refused.value)
        # A budget the forecast fits is not refused (the bound, max_tokens a reply, is not).
        bound = client.estimate(_rows(1000, 60), **CALL).estimated_cost_usd
        assert plan.cost_usd * 1.3 < bound
        result = client.infer(_rows(1000, 60), **CALL, partition_key="day2",
                              budget_usd=plan.cost_usd * 1.3)
    assert result.stats.succeeded + result.stats.deferred == 60


def test_the_resource_plans_with_the_same_arguments(sim, make_llm_resource):
    llm = make_llm_resource(sim)
    plan = llm.plan(_rows(0, 5), **CALL)
    assert plan.rows_to_send == 5 and plan.cost_usd is None  # no price set: not priced
    assert "not priced" in plan.summary() and sim.stats(log=False)["requests"] == 0


def test_records_written_without_an_estimate_do_not_calibrate(sim, make_settings):
    with InferenceClient(_priced(make_settings(sim))) as client:
        client.infer(_rows(0, 40), **CALL, partition_key="day1")
        table = client.ledger.table
        with client.ledger.engine.begin() as conn:  # as a ledger of an earlier version holds them
            conn.execute(table.update().values(estimated_prompt_tokens=None))
        plan = client.plan(_rows(1000, 10), **CALL, partition_key="day2")
    assert plan.basis.startswith(f"{MODEL}: bound") and "0 past records" in plan.basis


def test_embeddings_are_planned_too(embed_sim, make_settings):
    settings = make_settings(embed_sim, endpoint_kwargs={"embedding_models": ("sim-embed",)})
    settings = settings.replace(endpoints=tuple(
        dataclasses.replace(e, prices={"sim-embed": Price(0.1, 0.0)})
        for e in settings.endpoints))
    df = pd.DataFrame({"text": [f"document {i} " * (1 + i % 5) for i in range(50)]})
    call = dict(task="embed", input_column="text", model="sim-embed", scope="docs")
    with InferenceClient(settings) as client:
        before = client.plan(df.iloc[:25], **call)
        assert before.expected_output_tokens == 0 and before.cost_usd > 0
        client.embed(df.iloc[:25], input_column="text", model="sim-embed", scope="docs")
        after = client.plan(df.iloc[25:], **call)
        paid = client.embed(df.iloc[25:], input_column="text", model="sim-embed",
                            scope="docs").stats
    assert after.by_model["sim-embed"]["calibrated"]
    assert after.cost_usd == pytest.approx(paid.cost_usd, rel=0.2)


def test_online_the_plan_prices_at_the_cheapest_endpoint_serving_the_model(tmp_path):
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    cheap, dear = Price(0.5, 1.5), Price(5.0, 15.0)
    settings = InferenceSettings(endpoints=tuple(
        EndpointSpec(name=name, base_url="http://127.0.0.1:9/v1", models=(MODEL,), prices=price)
        for name, price in (("dear", dear), ("cheap", cheap))),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    with InferenceClient(settings) as client:
        plan = client.plan(_rows(0, 10), **CALL)
    assert plan.cost_usd == pytest.approx(cheap.cost(plan.input_tokens,
                                                     plan.expected_output_tokens))


# -- prompt tokens the server counts (tokenize_route: vLLM's /tokenize) -----------------------

def _counting(settings, **changes):
    return _priced(settings, tokenize_route=True, **changes)


def test_an_endpoint_that_counts_tokens_gives_the_plan_the_prompt_tokens_it_will_bill(
        sim, make_settings):
    with InferenceClient(_counting(make_settings(sim))) as client:
        plan = client.plan(_rows(0, 40), **CALL, partition_key="a")
        assert sim.stats(log=False)["requests"] == 0  # counting runs no model
        assert plan.by_model[MODEL]["server_counted"] == 40
        assert plan.basis.startswith(
            f"{MODEL}: prompt tokens counted by ep0's /tokenize, all 40 requests (calibrated: ")
        assert plan.by_model[MODEL]["calibrated_input_tokens"] > 0
        paid = client.infer(_rows(0, 40), **CALL, partition_key="a").stats
    assert plan.input_tokens == paid.prompt_tokens  # exact, before any run calibrated it


def test_the_plan_takes_the_servers_count_over_its_own_estimate(sim, make_settings):
    sim.configure(reported_usage={"prompt_tokens": 7})  # a tokenizer far from 4 characters
    with InferenceClient(_counting(make_settings(sim))) as client:
        plan = client.plan(_rows(0, 30), **CALL)
    assert plan.input_tokens == 30 * 7
    assert plan.by_model[MODEL]["calibrated_input_tokens"] > 30 * 7 * 3
    assert plan.cost_usd == pytest.approx(PRICE.cost(30 * 7, plan.expected_output_tokens))


def test_past_256_requests_an_even_spread_is_counted_and_the_rest_scaled_by_it(
        sim, make_settings):
    with InferenceClient(_counting(make_settings(sim))) as client:
        plan = client.plan(_rows(0, 600), **CALL, partition_key="a")
        paid = client.infer(_rows(0, 600), **CALL, partition_key="a").stats
    assert plan.by_model[MODEL]["server_counted"] == 200  # every 3rd of 600
    assert "for 200 of 600 requests" in plan.basis
    assert plan.input_tokens == pytest.approx(paid.prompt_tokens, rel=0.02)


@pytest.mark.parametrize("said", [-1, 2**40, "12", 1.5])
def test_a_count_that_is_no_count_keeps_the_calibrated_figure_and_says_why(
        sim, make_settings, said):
    sim.configure(reported_usage={"prompt_tokens": said})
    with InferenceClient(_counting(make_settings(sim))) as client:
        plan = client.plan(_rows(0, 10), **CALL)
        estimate = client.estimate(_rows(0, 10), **CALL).estimated_prompt_tokens
    assert plan.input_tokens == estimate and plan.by_model[MODEL]["server_counted"] == 0
    assert "prompt tokens not counted by ep0's /tokenize" in plan.basis
    assert "not a count the plan can use" in plan.basis


def test_a_server_without_the_route_keeps_the_calibrated_figure(sim, make_settings):
    settings = _counting(make_settings(sim))
    elsewhere = sim.base_url.replace("/v1", "/elsewhere/v1")  # /elsewhere/tokenize: 404
    settings = settings.replace(endpoints=tuple(
        dataclasses.replace(e, base_url=elsewhere) for e in settings.endpoints))
    with InferenceClient(settings) as client:
        plan = client.plan(_rows(0, 10), **CALL)
    assert "not counted by ep0's /tokenize" in plan.basis and "answered 404" in plan.basis


def test_a_key_the_server_echoes_in_its_refusal_is_kept_out_of_the_plan(tmp_path):
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
    from dagster_batchllm.testing import SimulatedEndpoint

    key = "sk-plan-0123456789abcdef0123"
    with SimulatedEndpoint(models=(MODEL,), api_key=key) as sim:
        sim.configure(echo_credentials=True)
        settings = InferenceSettings(endpoints=(EndpointSpec(
            name="ep0", base_url=sim.base_url, models=("unserved-model",), api_key=key,
            tokenize_route=True),), store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
        with InferenceClient(settings) as client:
            plan = client.plan(_rows(0, 3), **{**CALL, "model": "unserved-model"})
    assert "answered 404" in plan.basis and "request headers" in plan.basis
    assert key not in plan.summary() and key[8:20] not in plan.summary()


def test_the_budget_check_counts_as_the_plan_does(sim, make_settings):
    sim.configure(reported_usage={"prompt_tokens": 7})
    with InferenceClient(_counting(make_settings(sim))) as client:
        plan = client.plan(_rows(0, 100), **CALL)
        # a check by the calibrated figure (4 characters a token) would refuse this budget
        calibrated = plan.by_model[MODEL]["calibrated_input_tokens"]
        assert PRICE.cost(calibrated, plan.expected_output_tokens) > plan.budget_needed_usd
        result = client.infer(_rows(0, 100), **CALL, budget_usd=plan.budget_needed_usd)
    assert result.stats.succeeded == 100


@pytest.mark.parametrize("base_url, url", [
    ("http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/tokenize"),
    ("http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000/tokenize"),
    ("https://gpu.example/serving/v1", "https://gpu.example/serving/tokenize"),
    ("http://10.0.0.5:8000", "http://10.0.0.5:8000/tokenize"),
])
def test_the_route_is_at_the_servers_root_beside_v1_as_vllm_serves_it(base_url, url):
    from dagster_batchllm.core.delivery.tokenize import tokenize_url

    assert tokenize_url(base_url) == url
