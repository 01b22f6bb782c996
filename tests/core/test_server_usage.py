"""A server's token counts are checked before anything trusts them (``core/usage.py``).

Usage that is negative, not a whole number, not a number at all or past the request's bound
(one token per UTF-8 byte of its prompt plus the template's, and ``max_tokens``: what the
budget reserves) is counted at that bound, flagged on the row (``usage_corrected``) and in
the stats, and logged once per call; a cost is never negative; the budget holds whatever the
server says; the ledger's columns take any figure. Against the real simulated server, which
reports the usage it is told to (``reported_usage``) while its own stats keep what it counted.
"""

from __future__ import annotations

import dataclasses
import logging

import pandas as pd
import pytest

from dagster_batchllm import Price
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.transport import completion_from_payload
from dagster_batchllm.core.ledger.schema import TOKEN_COLUMNS
from dagster_batchllm.core.pricing import cost_at
from dagster_batchllm.core.requests import Completion, RowRequest
from dagster_batchllm.core.usage import TOKEN_CEILING, hold_to_bound

MODEL = "sim-model"
MAX_TOKENS = 8
PRICE = Price(input_per_mtok=1_000.0, output_per_mtok=3_000.0)  # cents a row
# What broken servers were seen to report, and worse.
WRONG = {
    "huge": {"prompt_tokens": 10**15, "completion_tokens": 10**15},
    "negative": {"prompt_tokens": -10**6, "completion_tokens": -10**6},
    "fractional": {"prompt_tokens": 1.5, "completion_tokens": 2.5},
    "text": {"prompt_tokens": "abc", "completion_tokens": "abc"},
}


@pytest.fixture
def pg_table(postgres_url):
    """A ledger table name of PostgreSQL's of this test's own, dropped after it (with the
    claims table beside it)."""
    import uuid

    import sqlalchemy as sa

    table = f"usage_{uuid.uuid4().hex[:10]}"
    yield table
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        for name in (table, f"{table}_claims"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def _reply(usage):
    return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": usage}


def _read(usage) -> Completion:
    return completion_from_payload(_reply(usage), endpoint="e", latency_s=0.0)


# -- reading a reply's usage ---------------------------------------------------------------------


@pytest.mark.parametrize(("usage", "figures", "note"), [
    ({"prompt_tokens": 10, "completion_tokens": 5}, (10, 5, 0), None),
    ({"prompt_tokens": 10, "completion_tokens": 5,
      "prompt_tokens_details": {"cached_tokens": 4}}, (10, 5, 4), None),
    ({"prompt_tokens": 10}, (10, 0, 0), None),  # no completion count: none
    ({"prompt_tokens": 12.0, "completion_tokens": 3.0}, (12, 3, 0), None),  # whole numbers
    ({"prompt_tokens": 10**15, "completion_tokens": 5}, (TOKEN_CEILING, 5, 0),
     "prompt_tokens=1000000000000000, completion_tokens=5"),
    ({"prompt_tokens": 10, "completion_tokens": -10**6}, (10, TOKEN_CEILING, 0),
     "completion_tokens=-1000000"),
    ({"prompt_tokens": 1.5, "completion_tokens": 5}, (TOKEN_CEILING, 5, 0), "prompt_tokens=1.5"),
    ({"prompt_tokens": "abc", "completion_tokens": True}, (TOKEN_CEILING, TOKEN_CEILING, 0),
     "prompt_tokens=(str, not a number), completion_tokens=(bool, not a number)"),
    ({"prompt_tokens": float("nan"), "completion_tokens": 1}, (TOKEN_CEILING, 1, 0), "nan"),
    ({"prompt_tokens": 10, "completion_tokens": 5,
      "prompt_tokens_details": {"cached_tokens": -3}}, (10, 5, 0), "cached_tokens=-3"),
    ({"prompt_tokens": 10**400, "completion_tokens": 1}, (TOKEN_CEILING, 1, 0), "digits"),
])
def test_a_figure_that_is_no_token_count_reads_as_the_ceiling_and_is_flagged(usage, figures,
                                                                             note):
    completion = _read(usage)
    assert (completion.prompt_tokens, completion.completion_tokens,
            completion.cached_tokens) == figures
    assert completion.usage_reported
    if note is None:
        assert completion.usage_corrected is None
    else:
        assert note in completion.usage_corrected
        assert len(completion.usage_corrected) <= 200
    assert "abc" not in (completion.usage_corrected or "")  # a server's text is not kept


def test_no_usage_is_not_reported_and_not_a_correction():
    for usage in (None, {}, {"prompt_tokens": None}, "usage", []):
        completion = _read(usage)
        assert (completion.usage_reported, completion.usage_corrected) == (False, None)
        assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)


def _request(prompt_bound: int = 42, max_tokens: int = MAX_TOKENS) -> RowRequest:
    return RowRequest("k", MODEL, b"{}", prompt_bound + max_tokens, 10, max_tokens)


def test_a_reply_is_held_to_its_requests_bound_once_and_an_honest_one_is_left_alone():
    honest = _read({"prompt_tokens": 30, "completion_tokens": 8,
                    "prompt_tokens_details": {"cached_tokens": 20}})
    assert not hold_to_bound(honest, _request())
    assert (honest.prompt_tokens, honest.completion_tokens, honest.cached_tokens) == (30, 8, 20)

    huge = _read({"prompt_tokens": 10**15, "completion_tokens": -10**6,
                  "prompt_tokens_details": {"cached_tokens": 10**15}})
    assert hold_to_bound(huge, _request())
    assert (huge.prompt_tokens, huge.completion_tokens, huge.cached_tokens) == (42, 8, 0)
    note = huge.usage_corrected
    assert hold_to_bound(huge, _request())  # again: nothing more changes, still corrected
    assert (huge.prompt_tokens, huge.completion_tokens, huge.usage_corrected) == (42, 8, note)

    # Figures read well but past the bound (or negative, from a reader that let them by).
    past = Completion("ok", 43, 9, True, "stop", 0.0, cached_tokens=50)
    assert hold_to_bound(past, _request())
    assert (past.prompt_tokens, past.completion_tokens, past.cached_tokens) == (42, 8, 42)
    assert past.usage_corrected == "prompt_tokens=43, completion_tokens=9, cached_tokens=50"
    negative = Completion("ok", -5, -1, True, "stop", 0.0)
    assert hold_to_bound(negative, _request())
    assert (negative.prompt_tokens, negative.completion_tokens) == (42, 8)


def test_a_cost_is_never_negative():
    rates = PRICE.per_token()
    assert cost_at(rates, -10**6, -10**6) == 0.0
    assert cost_at(rates, 10, 0, -5) == pytest.approx(10 * rates[0])  # no negative cache
    assert cost_at(rates, 10, 0, 50) == pytest.approx(10 * rates[1])
    assert PRICE.cost(-10**6, 5) == 0.0


def test_anthropic_usage_that_is_no_count_reads_as_the_ceiling_without_a_crash():
    from dagster_batchllm.core.delivery.batch_api.anthropic import (
        chat_reply,
        message_answer,
    )

    message = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": "abc", "cache_read_input_tokens": -4,
                         "cache_creation_input_tokens": 10**15, "output_tokens": 1.5}}
    text, prompt, completion, _reason = message_answer(message)
    assert (text, prompt, completion) == ("hi", TOKEN_CEILING, TOKEN_CEILING)
    read = completion_from_payload(chat_reply(message), endpoint="e", latency_s=0.0)
    assert read.prompt_tokens == TOKEN_CEILING and read.cached_tokens == 0
    assert hold_to_bound(read, _request())
    assert (read.prompt_tokens, read.completion_tokens) == (42, MAX_TOKENS)


def test_batch_result_lines_with_usage_past_the_ceiling_go_to_the_per_line_reader():
    import json

    from dagster_batchllm.core.delivery.batch_api.lines import chat_answer_block

    def line(key, usage):
        return json.dumps({"custom_id": key, "response": {"status_code": 200, "body": {
            "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": usage}}}).encode()

    lines = [line("a", {"prompt_tokens": 10, "completion_tokens": 2}),
             line("b", {"prompt_tokens": 10**15, "completion_tokens": 2}),
             line("c", {"prompt_tokens": 10, "completion_tokens": -1}),
             line("d", {"prompt_tokens": 10, "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": -1}})]
    answers, others = chat_answer_block(lines)
    assert answers.keys == ["a"] and others == [1, 2, 3]
    # A figure past 64 bits: Arrow cannot read the block, and every line is read on its own.
    answers, others = chat_answer_block([*lines, line("e", {"prompt_tokens": 10**20})])
    assert answers is None and others == [0, 1, 2, 3, 4]


# -- through a run, against the simulated server ---------------------------------------------------


def _frame(n: int, prefix: str = "Classify item") -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{prefix} {i:05d}" for i in range(n)]})


def _prompt_bound(text: str) -> int:
    """The strict prompt bound of a one-message request: a token per UTF-8 byte, 8 for the
    message and 8 for the request (core/run/prompts.py)."""
    return len(text.encode("utf-8")) + 16


def _priced_client(make_settings, sim, **overrides) -> InferenceClient:
    settings = make_settings(sim, **overrides)
    return InferenceClient(settings.replace(endpoints=tuple(
        dataclasses.replace(e, prices=PRICE) for e in settings.endpoints)))


def _infer(client, df, **kwargs):
    return client.infer(df, prompt="{text}", model=MODEL, output_column="out",
                        max_tokens=MAX_TOKENS, **kwargs)


def _check_corrected_run(client, sim, df, caplog, reported) -> None:
    """A run against a server reporting ``reported`` usage in every reply: every row answered,
    counted at its bound and flagged, costs >= 0 everywhere, one warning, and a rerun sends
    nothing."""
    n = len(df)
    with caplog.at_level(logging.WARNING, logger="dagster_batchllm"):
        result = _infer(client, df, partition_key="p")
    stats = result.stats
    assert (stats.succeeded, stats.failed, stats.usage_corrected) == (n, 0, n)
    bounds = [_prompt_bound(text) for text in df["text"]]
    assert stats.prompt_tokens == sum(bounds) and stats.completion_tokens == n * MAX_TOKENS
    assert stats.cost_usd == pytest.approx(sum(PRICE.cost(b, MAX_TOKENS) for b in bounds))
    assert f"{n} with the server's usage corrected" in stats.summary()

    records = client.ledger.records("p").set_index("request_key")
    assert sorted(records["prompt_tokens"]) == sorted(bounds)
    assert (records["completion_tokens"] == MAX_TOKENS).all()
    assert (records["cost_usd"] >= 0).all() and records["usage_corrected"].notna().all()
    said = str(next(iter(reported.values())))
    if isinstance(next(iter(reported.values())), str):
        said = "(str, not a number)"
    assert said in records["usage_corrected"].iloc[0]

    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "reported usage" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per call, not once per reply
    assert "endpoint 'ep0'" in warnings[0] and said in warnings[0]

    sent = sim.stats(log=False)["requests"]
    again = _infer(client, df, partition_key="p")
    assert again.stats.cached == n and sim.stats(log=False)["requests"] == sent


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_usage_no_server_could_count_is_counted_at_the_bound_flagged_and_logged_once(
        sim, make_settings, caplog, kind):
    sim.configure(reported_usage=WRONG[kind])
    with _priced_client(make_settings, sim) as client:
        _check_corrected_run(client, sim, _frame(20), caplog, WRONG[kind])


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["huge", "negative"])
def test_on_postgresql_absurd_usage_is_kept_and_the_rerun_sends_nothing(
        sim, make_settings, caplog, postgres_url, pg_table, kind):
    sim.configure(reported_usage=WRONG[kind])
    with _priced_client(make_settings, sim, store_url=postgres_url,
                        ledger_table=pg_table) as client:
        _check_corrected_run(client, sim, _frame(20), caplog, WRONG[kind])
    # A fresh client (another process's view) finds every answer there too.
    sent = sim.stats(log=False)["requests"]
    with _priced_client(make_settings, sim, store_url=postgres_url,
                        ledger_table=pg_table) as client:
        assert _infer(client, _frame(20), partition_key="p").stats.cached == 20
    assert sim.stats(log=False)["requests"] == sent


def test_only_the_wrong_replies_are_corrected_the_honest_ones_kept_as_counted(
        sim, make_settings):
    sim.configure(reported_usage={"prompt_tokens": -1}, reported_usage_rate=0.5, seed=3)
    df = _frame(60)
    with _priced_client(make_settings, sim) as client:
        stats = _infer(client, df).stats
        records = client.ledger.records()
    corrected = records["usage_corrected"].notna()
    assert 0 < corrected.sum() < 60 and stats.usage_corrected == corrected.sum()
    bounds = dict(zip([_prompt_bound(t) for t in df["text"]], df["text"], strict=True))
    assert records.loc[corrected, "prompt_tokens"].isin(bounds).all()
    # The honest replies keep the simulator's count (4 characters a token, 4 a message).
    honest = records.loc[~corrected, "prompt_tokens"]
    assert (honest < min(bounds)).all()
    assert stats.cost_usd >= 0 and (records["cost_usd"] >= 0).all()


def _honest_cost(sim) -> float:
    """What the server's own count of what it served would bill."""
    server = sim.stats(log=False)
    return PRICE.cost(server["prompt_tokens"], server["completion_tokens"])


@pytest.mark.parametrize("kind", ["negative", "huge"])
def test_the_budget_in_usd_holds_whatever_the_server_reports(sim, make_settings, kind):
    n = 60
    df = _frame(n, prefix="Classify this support ticket by urgency and topic, please:")
    # A budget for about half the rows at their bound: the rest must be deferred.
    budget = round(sum(PRICE.cost(_prompt_bound(t), MAX_TOKENS) for t in df["text"]) / 2, 6)
    sim.configure(reported_usage=WRONG[kind], latency_s=0.005)
    with _priced_client(make_settings, sim) as client:
        first = _infer(client, df, budget_usd=budget, partition_key="p")
        stats = first.stats
        assert stats.succeeded + stats.deferred == n and 0 < stats.deferred < n
        assert stats.failed == 0 and stats.usage_corrected == stats.succeeded
        # What the server honestly served, and what the run counted: both within the budget.
        assert _honest_cost(sim) <= budget
        assert 0 <= stats.cost_usd <= budget
        records = client.ledger.records("p")
        assert (records["cost_usd"].dropna() >= 0).all()

        # The rerun sends only what was deferred (nothing twice), within the same budget.
        sent = sim.stats(log=False)["requests"]
        second = _infer(client, df, budget_usd=budget, partition_key="p")
        server = sim.stats(log=False)
        assert second.stats.cached == stats.succeeded and server["duplicates"] == 0
        answered = second.stats.succeeded - second.stats.cached
        assert 0 < server["requests"] - sent == answered <= stats.deferred
        assert 0 <= second.stats.cost_usd <= budget


def test_a_plan_is_not_calibrated_by_corrected_records(sim, make_settings):
    """A past partition answered with negative completion counts made the next partition's
    plan nearly free, so any budget passed it and the run paid 4x its budget."""
    from dagster_batchllm.core.errors import InferenceConfigError

    sim.configure(reported_usage={"completion_tokens": -10**6})
    with _priced_client(make_settings, sim) as client:
        assert _infer(client, _frame(40, "past"), partition_key="past").stats.succeeded == 40
        new = _frame(40, "new")
        honest = client.estimate(new, prompt="{text}", model=MODEL, output_column="out",
                                 max_tokens=MAX_TOKENS).estimated_cost_usd
        plan = client.plan(new, prompt="{text}", model=MODEL, output_column="out",
                           max_tokens=MAX_TOKENS)
        assert plan.cost_usd == pytest.approx(honest) and "calibrated" not in plan.basis
        sent = sim.stats(log=False)["requests"]
        with pytest.raises(InferenceConfigError, match="nothing was sent"):
            _infer(client, new, budget_usd=round(honest / 4, 6), partition_key="new")
        assert sim.stats(log=False)["requests"] == sent


def test_embedding_usage_that_is_no_count_is_corrected_per_row(embed_sim, make_client):
    embed_sim.configure(reported_usage={"prompt_tokens": -10**6})
    try:
        client = make_client(embed_sim, endpoint_kwargs={"embedding_models": ("sim-embed",)})
        df = pd.DataFrame({"text": [f"an input {i}" for i in range(10)]})
        result = client.embed(df, input_column="text", model="sim-embed", output_column="vec")
        assert result.stats.succeeded == 10 and result.stats.usage_corrected == 10
        records = client.ledger.records()
        assert (records["prompt_tokens"] >= 0).all() and records["usage_corrected"].notna().all()
        assert result.stats.prompt_tokens >= 0
    finally:
        embed_sim.configure(reported_usage=None)


# -- batch APIs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_batch_lines_with_absurd_usage_are_answered_at_their_bound(tmp_path, protocol):
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        sim.configure(reported_usage={"prompt_tokens": 10**15, "completion_tokens": "abc"})
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="batch", base_url=sim.base_url, models=(MODEL,),
                                    api_key="sk-batch", batch_api=True, batch_protocol=protocol,
                                    prices=PRICE),),
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_poll_initial_s=0.02,
            batch_poll_max_s=0.2, ledger_flush_interval_s=0.05, progress_interval_s=60.0)
        df = _frame(12)
        with InferenceClient(settings) as client:
            result = _infer(client, df, mode="batch_api", wait=True)
            stats = result.stats
            assert (stats.succeeded, stats.usage_corrected) == (12, 12)
            records = client.ledger.records()
            assert sorted(records["prompt_tokens"]) == sorted(
                _prompt_bound(t) for t in df["text"])
            assert (records["completion_tokens"] == MAX_TOKENS).all()
            assert (records["cost_usd"] >= 0).all() and stats.cost_usd >= 0
            batches = len(sim.batches())
            again = _infer(client, df, mode="batch_api", wait=True)
            assert again.stats.cached == 12 and len(sim.batches()) == batches


# -- the ledger's columns --------------------------------------------------------------------------


def _absurd_record() -> dict:
    """A record as an older version's journal may hold it (written before figures were held
    to their bound)."""
    from dagster_batchllm.core.ledger.table import new_record

    return new_record("k", "", "", MODEL, "ok", "y", None, None, 10**15, 10**15, 1, "ep0",
                      1.0, "r", 10**15, 1.0, 10**15)


def test_a_sqlite_ledger_keeps_any_64_bit_count(tmp_path):
    from dagster_batchllm.core.ledger.table import Ledger

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.upsert([_absurd_record()])
    held = ledger.records()
    assert held[["prompt_tokens", "cached_tokens"]].values.tolist() == [[10**15, 10**15]]
    ledger.dispose()


@pytest.mark.postgres
def test_a_postgresql_ledger_with_32_bit_token_columns_is_widened_on_open(postgres_url,
                                                                           pg_table):
    import sqlalchemy as sa

    from dagster_batchllm.core.ledger.table import Ledger

    Ledger(postgres_url, pg_table).dispose()
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:  # the columns as versions before made them
        conn.exec_driver_sql(f"ALTER TABLE {pg_table} " + ", ".join(
            f"ALTER COLUMN {name} TYPE INTEGER" for name in TOKEN_COLUMNS))
        conn.exec_driver_sql(
            f"INSERT INTO {pg_table} (request_key, scope, partition_key, model, status, "
            "prompt_tokens, completion_tokens, attempts, created_at, updated_at) VALUES "
            "('old', '', '', 'm', 'ok', 10, 5, 1, 0, 0)")
    ledgers = [Ledger(postgres_url, pg_table) for _ in range(2)]  # the second finds it done
    kinds = {c["name"]: c["type"] for c in sa.inspect(engine).get_columns(pg_table)}
    engine.dispose()
    assert all(isinstance(kinds[name], sa.BigInteger) for name in TOKEN_COLUMNS), kinds
    # What crashed a run before (NumericValueOutOfRange), as an old journal may hold it.
    ledgers[0].upsert([_absurd_record()])
    held = ledgers[1].records().set_index("request_key")
    assert held.loc["k", "prompt_tokens"] == 10**15 and held.loc["old", "prompt_tokens"] == 10
    for each in ledgers:
        each.dispose()
