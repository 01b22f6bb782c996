"""Limits across executors: per-slot concurrency, a shared token budget, retries that pay once."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec
from dagster_batchllm.spark import SparkAI, register_ai_functions, split_for_slots
from dagster_batchllm.spark.budget import SharedTokenBudget
from dagster_batchllm.spark.worker import _wait_for_tokens
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark


def _texts(spark, n: int, partitions: int = 2, words: int = 6):
    pdf = pd.DataFrame({"id": range(n),
                        "text": [" ".join([f"word{i}"] * words) for i in range(n)]})
    spark.createDataFrame(pdf).repartition(partitions, "id").createOrReplaceTempView("texts")


def test_split_for_slots_divides_concurrency_and_rate_limits(make_settings, sim):
    settings = make_settings(sim, endpoint_kwargs={"requests_per_minute": 100,
                                                   "tokens_per_minute": 9_000})
    [endpoint] = split_for_slots(settings, 3).endpoints
    assert (endpoint.max_concurrency, endpoint.requests_per_minute,
            endpoint.tokens_per_minute) == (5, 33, 3_000)
    assert split_for_slots(settings, 1) is settings
    assert split_for_slots(settings, 64).endpoints[0].max_concurrency == 1  # never 0


@pytest.mark.parametrize("limits", ["split", "shared"])
def test_running_tasks_together_stay_within_an_endpoints_concurrency(spark, make_settings,
                                                                     limits):
    # "shared" shrinks a running task's share at its next heartbeat; the task that joins waits
    # 1.5 heartbeats, which covers that plus requests in flight only when they are short.
    with SimulatedEndpoint(models=("sim-model",), latency_s=0.05) as sim:
        settings = make_settings(sim, coordination_interval_s=0.5)
        settings = settings.replace(endpoints=(EndpointSpec(
            name="small", base_url=sim.base_url, models=("sim-model",), max_concurrency=4),))
        ai = register_ai_functions(spark, settings, limits=limits)  # local[2]: two task slots
        _texts(spark, 48)
        rows = spark.sql("SELECT ai_query('sim-model', text) AS s FROM texts").collect()
        stats = sim.stats(log=False)
    assert len(rows) == 48 and all(r.s.startswith("[sim] ") for r in rows)
    assert 2 <= stats["max_concurrent"] <= 4
    [endpoint] = ai.worker_settings.endpoints
    if limits == "split":  # a static half each, and no run coordination on top
        assert endpoint.max_concurrency == 2 and not ai.worker_settings.coordinate_runs
    else:  # the whole endpoint, shared at run time by the tasks that are running
        assert endpoint.max_concurrency == 4 and ai.worker_settings.coordinate_runs


def test_a_token_budget_is_shared_by_all_tasks_through_the_ledger(spark, make_settings):
    with SimulatedEndpoint(models=("sim-model",), latency_s=0.02) as sim:
        # ~40 rows at ~25 tokens each would need ~1,000: the budget pays for a part of them.
        ai = register_ai_functions(spark, make_settings(sim), token_budget=400,
                                   budget_wait_s=5.0)
        _texts(spark, 40)
        rows = spark.sql("""SELECT ai_query('sim-model', text, failOnError => false,
                                   modelParameters => named_struct('max_tokens', 8)) AS s
                            FROM texts""").collect()
        stats = sim.stats(log=False)
    budget = ai.budget_snapshot()
    answered = [r.s for r in rows if r.s.result is not None]
    deferred = [r.s for r in rows if (r.s.errorMessage or "").startswith("deferred:")]
    assert answered and deferred and len(answered) + len(deferred) == 40
    assert "token budget (400 tokens, shared by all its Spark tasks)" in deferred[0].errorMessage
    # Both tasks drew on one budget: together they spent what the server billed, within it.
    assert budget["spent"] == stats["prompt_tokens"] + stats["completion_tokens"]
    assert budget["spent"] <= 400 and budget["granted"] == 0
    assert stats["requests"] == len(answered)


def test_claims_take_a_fair_part_and_a_waiting_task_gets_what_others_give_back(tmp_path):
    budget = SharedTokenBudget.create(f"sqlite:///{tmp_path / 'budget.db'}", "batchllm_requests",
                                      total=1_000)
    try:
        # Two tasks share it: the first big claim takes half of what is left, not all of it.
        assert budget.claim(900, parts=2, at_least=50) == 500
        assert budget.claim(900, parts=2, at_least=50) == 250
        threading.Timer(0.2, budget.settle, args=(500, 100)).start()  # the first one finishes
        assert _wait_for_tokens(budget, deadline=time.monotonic() + 10)
        assert budget.snapshot() == {"total": 1_000, "granted": 250, "spent": 100,
                                     "remaining": 650}
        budget.settle(250, 0)
        assert not _wait_for_tokens(budget, deadline=time.monotonic() + 10)  # nobody holds any
    finally:
        budget.close()


def test_a_budget_needs_a_ledger_every_executor_reaches(spark, make_settings, sim):
    with pytest.raises(InferenceConfigError, match="every executor reaches"):
        SparkAI(spark, make_settings(sim, store_url="sqlite://")).ai_query_col(
            "sim-model", "text", token_budget=1_000)


def test_a_failed_task_rerun_sends_only_what_it_did_not_get(spark, make_settings):
    """failOnError fails the stage; the rerun (like a Spark task retry) pays for one row."""
    with SimulatedEndpoint(models=("sim-model",)) as sim:
        settings = make_settings(sim)  # a SQLite ledger file every worker process shares
        register_ai_functions(spark, settings)
        _texts(spark, 12, partitions=1)
        query = "SELECT id, ai_query('sim-model', text) AS s FROM texts"
        sim.script(400)
        with pytest.raises(Exception, match="ai_query failed for 1 of 12 rows"):
            spark.sql(query).collect()
        assert sim.stats(log=False)["requests"] == 12
        rows = spark.sql(query).collect()
        after_rerun = sim.stats(log=False)
        # A new registration (a new job) over the same rows and ledger sends nothing at all.
        register_ai_functions(spark, settings)
        again = spark.sql(query).collect()
        final = sim.stats(log=False)
    assert len(rows) == 12 and all(r.s.startswith("[sim] ") for r in rows)
    assert after_rerun["requests"] == 13
    assert sorted(again) == sorted(rows)
    assert final["requests"] == 13 and final["duplicates"] == 0
