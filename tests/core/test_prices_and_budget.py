"""Prices per endpoint, the cost of each answered row in the ledger, and the budget in USD."""

from __future__ import annotations

import re

import pytest

from dagster_batchllm import Price
from dagster_batchllm.core.pricing import cost_at
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from tests.batch_api.batch_helpers import batch_settings

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
        prices={"other": Price(1.0, 1.0, batch_discount=1.0)})


def test_one_lookup_decides_a_models_price_on_an_endpoint():
    cheap, dear = Price(0.1, 0.2), Price(1.0, 2.0)
    settings = _settings(a={MODEL: cheap}, b=dear)
    assert settings.price_at(MODEL, "a") == cheap
    assert settings.price_at(MODEL, "b") == dear  # one Price for every model of b
    assert settings.price_at("other", "b") == dear
    # a names no price of "other": the resource-wide prices
    assert settings.price_at("other", "a") == Price(1.0, 1.0, batch_discount=1.0)
    # No endpoint named (an estimate, a bound): the dearest of those serving it.
    assert settings.price_at(MODEL) == dear
    assert settings.price_for(MODEL) == (1.0, 2.0)
    assert _settings(a=None).price_at(MODEL) is None


def test_an_endpoint_refuses_prices_of_models_it_does_not_serve():
    with pytest.raises(ValueError, match="does not serve"):
        EndpointSpec(name="a", base_url="http://127.0.0.1:9/v1", models=(MODEL,),
                     prices={"gpt-4o": Price(1.0, 1.0)})


def test_resource_wide_prices_of_a_model_no_endpoint_serves_are_refused_naming_both():
    """As an endpoint's own (above): a misspelt model would be left unpriced (cost None)."""
    endpoint = EndpointSpec(name="a", base_url="http://127.0.0.1:9/v1", models=(MODEL,),
                            embedding_models=("embedder",))
    with pytest.raises(ValueError, match=r"Resource-wide prices name \['gpt-4o'\], which no "
                       r"endpoint serves \(served: \['embedder', 'sim-model'\]\)"):
        InferenceSettings(endpoints=(endpoint,), prices={"gpt-4o": Price(1.0, 1.0)})
    settings = InferenceSettings(endpoints=(endpoint,), prices=Price(1.0, 1.0))  # every model
    assert settings.price_at("embedder") == Price(1.0, 1.0)
    with pytest.raises(ValueError, match=r"prices is a mapping model -> Price"):
        InferenceSettings(endpoints=(endpoint,), prices=[(MODEL, 1.0, 1.0)])  # the old tuples


@pytest.mark.parametrize("fields, says", [
    ({"output_per_mtok": -0.5}, r"output_per_mtok is USD per million tokens, a number >= 0"),
    ({"cached_input_per_mtok": float("inf")}, r"cached_input_per_mtok .*got inf"),
    ({"batch_input_per_mtok": "0.1"}, r"batch_input_per_mtok .*got '0\.1'"),
    ({"batch_discount": 1.5}, r"batch_discount is the share of the online price the batch API "
                              r"charges, from 0 to 1 \(0\.5: half price; 1: the online price\); "
                              r"got 1\.5"),
    ({"batch_discount": -0.5}, r"batch_discount .*got -0\.5"),
])
def test_a_price_is_checked_when_built_saying_what_each_field_takes(fields, says):
    with pytest.raises(ValueError, match=says):
        Price(**{"input_per_mtok": 1.0, "output_per_mtok": 2.0, **fields})
    assert Price(0.0, 0.0, batch_discount=0.0).cost(10, 10, batch=True) == 0.0  # bounds hold
    assert Price(1.0, 1.0, batch_discount=1).per_mtok(batch=True) == (1.0, 1.0, 1.0)


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
    from dagster_batchllm.core.delivery.batch_api.anthropic import chat_reply
    from dagster_batchllm.core.delivery.transport import completion_from_payload

    message = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 10, "cache_read_input_tokens": 300,
                         "cache_creation_input_tokens": 20, "output_tokens": 7}}
    completion = completion_from_payload(chat_reply(message), endpoint="e", latency_s=0.0)
    assert (completion.prompt_tokens, completion.cached_tokens,
            completion.completion_tokens) == (330, 300, 7)


# -- the cost of each row, in the ledger ---------------------------------------------------------


def _frame(n, prefix="Classify item"):
    import pandas as pd

    return pd.DataFrame({"text": [f"{prefix} {i:05d}" for i in range(n)]})


def _ledger_sum(client, column, **where):
    import sqlalchemy as sa

    table = client.ledger.table
    query = sa.select(sa.func.sum(table.c[column]))
    for name, value in where.items():
        query = query.where(table.c[name] == value)
    with client.ledger.engine.connect() as conn:
        return conn.execute(query).scalar()


def test_each_answered_row_keeps_its_cost_and_the_call_reports_their_sum(sim, make_settings):
    import dataclasses

    from dagster_batchllm.core.client import InferenceClient

    price = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    settings = make_settings(sim)
    settings = settings.replace(endpoints=tuple(
        dataclasses.replace(e, prices={MODEL: price}) for e in settings.endpoints))
    with InferenceClient(settings) as client:
        result = client.infer(_frame(40), prompt="{text}", model=MODEL, output_column="out",
                              max_tokens=16, partition_key="p1")
        records = client.ledger.records(partition_key="p1")
        assert records["cost_usd"].notna().all()
        expected = [price.cost(p, c, k) for p, c, k in zip(
            records["prompt_tokens"], records["completion_tokens"], records["cached_tokens"],
            strict=True)]
        assert records["cost_usd"].tolist() == pytest.approx(expected)
        assert result.stats.cost_usd == pytest.approx(_ledger_sum(client, "cost_usd"))
        assert result.stats.cost_usd == pytest.approx(result.stats.estimated_cost_usd)
        # A rerun is answered from the ledger: it pays nothing.
        again = client.infer(_frame(40), prompt="{text}", model=MODEL, output_column="out",
                             max_tokens=16, partition_key="p1")
        assert again.stats.cost_usd == 0.0 and again.stats.cached == 40


def test_cached_prompt_tokens_cost_the_cached_price(make_settings):
    import dataclasses

    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.testing import SimulatedEndpoint

    price = Price(input_per_mtok=4.0, output_per_mtok=8.0, cached_input_per_mtok=1.0)
    shared = "You are a careful classifier of support tickets. " * 8  # many 16-token blocks
    with SimulatedEndpoint(models=(MODEL,), prefix_cache_tokens=100_000) as sim:
        settings = make_settings(sim, endpoint_kwargs={"max_concurrency": 1})
        settings = settings.replace(endpoints=tuple(
            dataclasses.replace(e, prices=price) for e in settings.endpoints))
        with InferenceClient(settings) as client:
            result = client.infer(_frame(20), prompt=shared + "{text}", model=MODEL,
                                  output_column="out", max_tokens=8)
            records = client.ledger.records()
    assert result.stats.cached_tokens > 0 and 0 < result.stats.cached_share < 1
    assert int(records["cached_tokens"].sum()) == result.stats.cached_tokens
    uncached_price = sum(price.cost(p, c) for p, c in zip(
        records["prompt_tokens"], records["completion_tokens"], strict=True))
    assert result.stats.cost_usd == pytest.approx(float(records["cost_usd"].sum()))
    assert result.stats.cost_usd == pytest.approx(
        uncached_price - result.stats.cached_tokens * 3.0 / 1e6)


def test_a_ledger_made_by_the_old_schema_gets_the_new_columns_on_open(tmp_path):
    import sqlalchemy as sa

    from dagster_batchllm.core.ledger.table import Ledger, new_record

    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:  # the ledger table as versions before issue 32 made it
        conn.exec_driver_sql(
            "CREATE TABLE batchllm_requests (request_key VARCHAR(64) NOT NULL, scope "
            "VARCHAR(255) NOT NULL, partition_key VARCHAR(255) NOT NULL, model VARCHAR(255) "
            "NOT NULL, status VARCHAR(16) NOT NULL, response TEXT, error TEXT, error_type "
            "VARCHAR(64), prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, "
            "attempts INTEGER NOT NULL, endpoint VARCHAR(255), latency_ms FLOAT, run_id "
            "VARCHAR(64), created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL, PRIMARY KEY "
            "(request_key, scope, partition_key))")
        conn.exec_driver_sql(
            "INSERT INTO batchllm_requests VALUES ('old', '', '', 'm', 'ok', 'x', NULL, NULL, "
            "10, 5, 1, 'ep0', 1.0, NULL, 0, 0)")
    engine.dispose()
    ledgers = [Ledger(f"sqlite:///{path}") for _ in range(2)]  # the second finds them there
    ledger = ledgers[0]
    records = [new_record(f"k{i:03d}", "", "p", "m", "ok", "y", None, None, 10, 5, 1, "ep0",
                          1.0, "r", 2, 0.25) for i in range(100)]  # the shared fast path
    ledger.upsert(records)
    ledger.upsert(records[:3])  # the per-record path
    # A journal of an older version: records without the new fields.
    ledger.upsert([{k: v for k, v in new_record("j", "", "p", "m", "ok", "z", None, None, 1,
                                                1, 1, "ep0", 1.0, "r").items()
                    if k not in ("cached_tokens", "cost_usd")}])
    held = ledger.records().set_index("request_key")
    assert held.loc["old", "cost_usd"] != held.loc["old", "cost_usd"]  # NULL: not known
    assert held.loc["k000", "cost_usd"] == 0.25 and held.loc["k099", "cached_tokens"] == 2
    assert held.loc["j", "cost_usd"] != held.loc["j", "cost_usd"]
    answers = ledger.answer_tokens(["old", "k000", "k001"])["m"]
    assert answers["cost_usd"] == pytest.approx(0.5)
    assert (answers["uncosted_prompt_tokens"], answers["uncosted_completion_tokens"]) == (10, 5)
    for each in ledgers:
        each.dispose()


@pytest.mark.postgres
def test_a_postgresql_ledger_of_the_old_schema_gets_the_new_columns(postgres_url):
    import uuid

    import sqlalchemy as sa

    from dagster_batchllm.core.ledger.table import Ledger, new_record

    table = f"old_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(postgres_url)
    try:
        Ledger(postgres_url, table).dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN cached_tokens")
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN cost_usd")
        ledgers = [Ledger(postgres_url, table) for _ in range(2)]
        ledgers[0].upsert([new_record("k", "", "p", "m", "ok", "y", None, None, 10, 5, 1,
                                      "ep0", 1.0, "r", 3, 0.125)])
        held = ledgers[1].records()
        assert held["cost_usd"].tolist() == [0.125] and held["cached_tokens"].tolist() == [3]
        for each in ledgers:
            each.dispose()
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()


# -- the budget in USD ----------------------------------------------------------------------------

BUDGET_PRICE = Price(input_per_mtok=1_000.0, output_per_mtok=3_000.0)  # cents a row


@pytest.fixture
def priced_client(make_settings):
    import dataclasses

    from dagster_batchllm.core.client import InferenceClient

    clients = []

    def build(sim, **overrides):
        settings = make_settings(sim, **overrides)
        client = InferenceClient(settings.replace(endpoints=tuple(
            dataclasses.replace(e, prices=BUDGET_PRICE) for e in settings.endpoints)))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def _long_rows(n):
    # Long prompts and short replies: a prompt's strict token bound (its bytes) is about four
    # times the dry run's estimate (and the server's count), so reservations are generous.
    return _frame(n, prefix="Classify this support ticket by urgency and topic, please: " * 3)


def _budgeted(client, df, budget, **kwargs):
    return client.infer(df, prompt="{text}", model=MODEL, output_column="out", max_tokens=8,
                        budget_usd=budget, **kwargs)


def test_a_plan_over_the_budget_is_refused_before_anything_is_sent(sim, priced_client):
    from dagster_batchllm.core.errors import InferenceConfigError

    client = priced_client(sim)
    df = _long_rows(30)
    plan = client.estimate(df, prompt="{text}", model=MODEL, output_column="out",
                           max_tokens=8).estimated_cost_usd
    with pytest.raises(InferenceConfigError) as refused:
        _budgeted(client, df, round(plan * 0.9, 6))
    message = str(refused.value)
    assert f"${plan * 0.9:.6f}" in message and f"${plan:.6f}" in message  # both figures
    assert "nothing was sent" in message
    assert sim.stats(log=False)["requests"] == 0
    assert client.ledger.status_counts()["ok"] == 0
    # Rows the ledger holds cost nothing: once half are answered, the same budget covers it.
    _budgeted(client, df.iloc[:15], plan)
    sent = sim.stats(log=False)["requests"]
    result = _budgeted(client, df, round(plan * 0.9, 6))
    assert result.stats.cached == 15 and sim.stats(log=False)["requests"] - sent == 15


def test_a_budget_without_a_price_is_refused_before_anything_is_sent(sim, make_client):
    from dagster_batchllm.core.errors import InferenceConfigError

    with pytest.raises(InferenceConfigError, match="needs a price for"):
        _budgeted(make_client(sim), _frame(3), 1.0)
    assert sim.stats(log=False)["requests"] == 0


@pytest.mark.slow
def test_the_run_stops_sending_before_what_it_paid_would_pass_the_budget(sim, priced_client):
    n = 60
    client = priced_client(sim)
    df = _long_rows(n)
    plan = client.estimate(df, prompt="{text}", model=MODEL, output_column="out",
                           max_tokens=8).estimated_cost_usd
    sim.configure(latency_s=0.005)
    first = _budgeted(client, df, plan, partition_key="p")  # the plan fits, just

    stats = first.stats
    assert 0 < stats.deferred < n // 2 and stats.failed == 0
    assert stats.succeeded + stats.deferred == n
    assert first.df.loc[first.df["out"].isna(), "out_error"].str.contains("budget").all()
    server = sim.stats(log=False)
    assert server["requests"] == server["ok"] == stats.succeeded  # deferred rows: not sent
    paid_at_server = BUDGET_PRICE.cost(server["prompt_tokens"], server["completion_tokens"])
    assert paid_at_server <= plan  # 0 rows paid past the budget
    assert stats.cost_usd == pytest.approx(paid_at_server)
    assert _ledger_sum(client, "cost_usd", partition_key="p") == pytest.approx(paid_at_server)
    counts = client.ledger.status_counts("p")
    assert (counts["ok"], counts["deferred"]) == (stats.succeeded, stats.deferred)

    # A rerun with more budget sends only the deferred rows.
    second = _budgeted(client, df, plan, partition_key="p")
    assert (second.stats.succeeded, second.stats.deferred) == (n, 0)
    assert second.stats.cached == stats.succeeded
    assert sim.stats(log=False)["requests"] == n and sim.stats(log=False)["duplicates"] == 0


def test_batch_lines_cost_the_batch_price_in_the_ledger_and_in_the_stats(tmp_path):
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.testing import SimulatedEndpoint

    price = Price(input_per_mtok=2.0, output_per_mtok=6.0, batch_discount=0.5)
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        settings = batch_settings(sim, f"sqlite:///{tmp_path / 'ledger.db'}",
                                  endpoint={"prices": price})
        with InferenceClient(settings) as client:
            result = client.infer(_frame(12), prompt="{text}", model=MODEL,
                                  output_column="out", mode="batch_api", wait=True)
            records = client.ledger.records()
            stats = result.stats
            assert stats.succeeded == 12 and stats.mode == "batch_api"
            assert records["cost_usd"].tolist() == pytest.approx([price.cost(
                p, c, batch=True) for p, c in zip(records["prompt_tokens"],
                                                  records["completion_tokens"], strict=True)])
            assert stats.cost_usd == pytest.approx(_ledger_sum(client, "cost_usd"))
            assert stats.cost_usd == pytest.approx(stats.online_cost_usd * 0.5)


# -- routing by price ------------------------------------------------------------------------------


@pytest.mark.parametrize("cheap_slots", [64, 2])
def test_of_the_endpoints_with_room_the_cheaper_goes_first(make_settings, cheap_slots):
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(models=(MODEL,)) as dear, SimulatedEndpoint(models=(MODEL,)) as cheap:
        for sim in (dear, cheap):
            sim.configure(latency_s=0.02)
        settings = make_settings(dear, cheap)  # the dear one listed first
        settings = settings.replace(endpoints=(
            EndpointSpec(name="dear", base_url=dear.base_url, models=(MODEL,),
                         max_concurrency=16, prices=Price(5.0, 15.0)),
            EndpointSpec(name="cheap", base_url=cheap.base_url, models=(MODEL,),
                         max_concurrency=cheap_slots, prices=Price(0.5, 1.5))))
        with InferenceClient(settings) as client:
            result = client.infer(_frame(40), prompt="{text}", model=MODEL,
                                  output_column="out", max_tokens=8)
        assert result.stats.succeeded == 40
        sent = {name: sim.stats(log=False)["requests"]
                for name, sim in (("dear", dear), ("cheap", cheap))}
    if cheap_slots >= 40:  # room for every row: the dear endpoint gets none
        assert sent == {"dear": 0, "cheap": 40}
    else:  # full: the rest spill over to the dearer one
        assert sent["cheap"] >= 2 and sent["dear"] > 0 and sum(sent.values()) == 40


@pytest.mark.parametrize("wait", [True, False], ids=["collected_in_hand", "through_the_book"])
def test_batch_lines_served_from_the_prompt_cache_cost_the_cached_batch_price(tmp_path, wait):
    """Cached tokens of a batch line reach the ledger both ways a collect takes: the answers
    the call's own pass holds (wait=True), and those read back from the batch book by a later
    call (wait=False, then a collect)."""
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.testing import SimulatedEndpoint

    price = Price(input_per_mtok=4.0, output_per_mtok=8.0, cached_input_per_mtok=1.0)
    shared = "You are a careful classifier of support tickets. " * 8  # many 16-token blocks
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch",
                           prefix_cache_tokens=100_000) as sim:
        settings = batch_settings(sim, f"sqlite:///{tmp_path / 'ledger.db'}",
                                  endpoint={"prices": price})
        with InferenceClient(settings) as client:
            call = {"prompt": shared + "{text}", "model": MODEL, "output_column": "out",
                    "max_tokens": 8, "mode": "batch_api"}
            result = client.infer(_frame(12), wait=wait, **call)
            if not wait:
                assert result.stats.deferred == 12
                result = client.infer(_frame(12), wait=True, **call)  # collects, sends none
            records = client.ledger.records()
    assert result.stats.succeeded == 12
    cached = int(records["cached_tokens"].sum())
    assert cached > 0 and result.stats.cached_tokens == cached
    assert records["cost_usd"].tolist() == pytest.approx([price.cost(
        p, c, k, batch=True) for p, c, k in zip(records["prompt_tokens"],
                                                records["completion_tokens"],
                                                records["cached_tokens"], strict=True)])


def test_in_batch_mode_budget_usd_is_charged_at_submission_and_never_passed(tmp_path):
    """A line in a provider's file cannot be taken back: each is charged its most possible
    cost at the batch price when it is submitted, and the lines past the budget are deferred
    (the batch API has no mid-run stop, so a forecast alone could be passed)."""
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.pricing import Price as _Price
    from dagster_batchllm.testing import SimulatedEndpoint

    price = _Price(input_per_mtok=1_000.0, output_per_mtok=3_000.0, batch_discount=0.5)
    rows = _long_rows(30)
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        settings = batch_settings(sim, f"sqlite:///{tmp_path / 'ledger.db'}",
                                  endpoint={"prices": price})
        with InferenceClient(settings) as client:
            plan = client.plan(rows, prompt="{text}", model=MODEL, output_column="out",
                               max_tokens=8, mode="batch_api")
            budget = plan.cost_usd * 1.2  # the plan fits; the lines' bounds do not all fit
            result = client.infer(rows, prompt="{text}", model=MODEL, output_column="out",
                                  max_tokens=8, mode="batch_api", budget_usd=budget)
            paid = _ledger_sum(client, "cost_usd")
    assert 0 < result.stats.succeeded < 30 and result.stats.deferred == 30 - result.stats.succeeded
    assert set(result.error_types.dropna()) == {"deferred"}
    assert paid <= budget and result.stats.cost_usd == pytest.approx(paid)
    lines = sim.stats(log=False)["batches"]["lines_answered"]
    assert lines == result.stats.succeeded  # nothing past the budget reached the provider


# -- the budget a call needs: plan().budget_needed_usd ---------------------------------------------


def _ask(**more):
    return dict(prompt="{text}", model=MODEL, output_column="out", max_tokens=8, **more)


def test_online_a_budget_of_the_plans_budget_needed_sends_every_row(sim, priced_client,
                                                                    tmp_path):
    """Each request reserves its most possible cost until its reply settles it, so the run
    needs the planned cost and one reservation more; the plan says so, and a deferral names
    the figure."""
    rows = _long_rows(30)
    client = priced_client(sim)
    plan = client.plan(rows, **_ask())
    needed = plan.budget_needed_usd
    assert plan.cost_usd < needed < 2 * plan.cost_usd
    assert f"budget_usd that sends every row: ${needed:.6f}" in plan.summary()
    assert plan.as_dict()["budget_needed_usd"] == needed

    result = client.infer(rows, **_ask(budget_usd=needed))
    assert (result.stats.succeeded, result.stats.deferred) == (30, 0)

    fresh = priced_client(sim, store_url=f"sqlite:///{tmp_path / 'fresh.db'}")
    less = fresh.infer(rows, **_ask(budget_usd=plan.cost_usd))
    assert 0 < less.stats.deferred < 30  # the plan's cost fits; the last reservations do not
    deferred = less.df.loc[less.df["out"].isna(), "out_error"]
    assert deferred.str.contains(re.escape(
        f"(a budget of at least ${needed:.6f} sends every row; see plan())")).all()


@pytest.mark.slow  # two batch runs: about 1.5 s
def test_in_batch_mode_a_budget_of_the_plans_budget_needed_sends_every_row(tmp_path):
    """Each line is charged its most possible cost when submitted (several times the planned
    cost here: a token per byte of the prompt, max_tokens for every reply): the plan shows
    that sum, and a budget a little under it defers the last line, naming it."""
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.testing import SimulatedEndpoint

    rows = _long_rows(30)
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        for name, under in (("enough", False), ("less", True)):
            settings = batch_settings(sim, f"sqlite:///{tmp_path / name}.db",
                                      endpoint={"prices": BUDGET_PRICE})
            with InferenceClient(settings) as client:
                plan = client.plan(rows, **_ask(mode="batch_api"))
                needed = plan.budget_needed_usd
                assert needed > 2 * plan.cost_usd  # what the reader was not shown
                assert "each batch line is charged its most possible cost" in plan.summary()
                # less: half a line's bound short (the 30 lines' bounds are about equal)
                budget = needed - needed / 60 if under else needed
                result = client.infer(rows, **_ask(mode="batch_api", budget_usd=budget))
            if not under:
                assert (result.stats.succeeded, result.stats.deferred) == (30, 0)
                continue
            assert (result.stats.succeeded, result.stats.deferred) == (29, 1)
            [message] = result.df["out_error"].dropna()
            assert message.endswith(
                f"(a budget of at least ${needed:.6f} sends every row; see plan())")
