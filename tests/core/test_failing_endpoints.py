"""Issue 40: endpoints that answer but never usably fail the rows within a bound, and a server's
long Retry-After defers rows instead of holding them.

The breaker alone let one request through per 10 -> 20 -> 40 -> 80 s cool-down, so 200 rows
against a server answering 200 with a body that is not JSON took days. Now every endpoint of a
model answering nothing usable for ``endpoint_failing_after_s`` (60 s) fails the rows still
waiting with ``endpoint_failing``, naming the last failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.endpoint_state import FailingBound
from dagster_batchllm.core.delivery.pool import EndpointPool
from dagster_batchllm.core.errors import EndpointFailingError, NoHealthyEndpointError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.factories.error_kinds import kind_of
from dagster_batchllm.testing import SimulatedEndpoint
from tests.conftest import FAST_SETTINGS

MODEL = "sim-model"
# What the row's error says for each fault, directly or as the last failure it names.
NOT_JSON = "answered 200 with a body that is not JSON"
CUT_MID_BODY = "Response payload is not completed"


def _frame(n: int, prefix: str = "row") -> pd.DataFrame:
    return pd.DataFrame({"t": [f"{prefix} {i}" for i in range(n)]})


def _settings(*sims: SimulatedEndpoint, tmp_path, concurrency: int = 4,
              **overrides) -> InferenceSettings:
    """The defaults (retries, breaker, bounds) but for ``overrides``."""
    return InferenceSettings(
        endpoints=tuple(EndpointSpec(name=f"ep{i}", base_url=sim.base_url, models=(MODEL,),
                                     max_concurrency=concurrency)
                        for i, sim in enumerate(sims)),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", **overrides)


def _infer(client: InferenceClient, df: pd.DataFrame):
    return client.infer(df, prompt="{t}", model=MODEL, output_column="out")


def _pool(*names: str, clock, threshold: int = 5, cooldown_s: float = 10.0) -> EndpointPool:
    return EndpointPool(tuple(EndpointSpec(name=name, base_url="http://127.0.0.1:9/v1",
                                           models=(MODEL,), max_concurrency=4)
                              for name in names),
                        failure_threshold=threshold, cooldown_s=cooldown_s, clock=clock)


# -- the pool's bound, on a clock the test moves ----------------------------------------------

def test_the_bound_needs_every_endpoint_failing_and_a_usable_answer_clears_it():
    now = [100.0]
    pool = _pool("a", "b", clock=lambda: now[0])
    a, b = pool.endpoints
    bound = FailingBound(after_s=60.0, since=0.0)

    a.record_failure(reason="server_error: HTTP 500 from endpoint 'a': boom")
    assert pool.failing_deadline(MODEL, bound) == math.inf  # 'b' has not failed
    now[0] = 110.0
    b.record_failure(reason="malformed_response: not JSON")
    now[0] = 115.0
    a.record_failure(reason="server_error: HTTP 503 from endpoint 'a': later")
    # From the last of them to begin failing ('b', at 110), not from the latest failure.
    assert pool.failing_deadline(MODEL, bound) == 170.0
    now[0] = 169.9
    pool.check_failing(MODEL, bound)
    now[0] = 170.0
    with pytest.raises(EndpointFailingError) as raised:
        pool.check_failing(MODEL, bound)
    message = raised.value.as_cell()
    assert message.startswith("endpoint_failing: no endpoint serving 'sim-model' gave a usable "
                              "answer for 60 s (endpoint_failing_after_s)")
    assert "'a': server_error: HTTP 503 from endpoint 'a': later" in message
    assert "'b': malformed_response: not JSON" in message
    assert kind_of(raised.value.error_type).retryable  # the retry-partitions sensor reruns it

    # A call that began later gets the whole bound from its start.
    assert pool.failing_deadline(MODEL, FailingBound(60.0, since=150.0)) == 210.0
    b.record_success()
    assert pool.failing_deadline(MODEL, bound) == math.inf


def test_a_row_waiting_for_the_probes_slot_fails_at_the_bound_while_the_probe_is_still_out():
    pool = _pool("a", clock=time.monotonic, threshold=1, cooldown_s=0.0)

    async def scenario() -> None:
        first = await pool.acquire(MODEL, 10)
        pool.release(first, success=False, unhealthy=True, actual_tokens=None,
                     reason="connection_error: cut mid-body")
        probe = await pool.acquire(MODEL, 10)  # half-open: the one probe, never answered
        assert probe.probe
        bound = FailingBound(after_s=0.2, since=pool.now())
        with pytest.raises(EndpointFailingError, match="cut mid-body"):
            # Without the bound this waits as long as the probe is out: here, for ever.
            await asyncio.wait_for(pool.acquire(MODEL, 10, None, bound), timeout=10)

    asyncio.run(scenario())


def test_a_new_call_probes_an_endpoint_whose_cool_down_outlasts_its_bound_once():
    """A rerun on the same client (the server fixed meanwhile) asks the endpoint before its
    rows can fail as endpoint_failing, rather than wait out an 80 s cool-down untried."""
    now = [100.0]
    pool = _pool("a", clock=lambda: now[0], threshold=1, cooldown_s=80.0)
    [a] = pool.endpoints
    a.record_failure(reason="server_error: HTTP 500")
    assert a.open_until == 180.0
    now[0] = 150.0
    earlier_call = FailingBound(after_s=60.0, since=90.0)  # its deadline (160) < 180 too
    later_call = FailingBound(after_s=60.0, since=150.0)  # deadline 210 > 180: probes at 180
    shorter_bound = FailingBound(after_s=20.0, since=150.0)  # deadline 170 < 180

    async def scenario() -> None:
        with pytest.raises(NoHealthyEndpointError):
            await pool.acquire(MODEL, 10, None, later_call)
        with pytest.raises(NoHealthyEndpointError):
            await pool.acquire(MODEL, 10, None, earlier_call)  # heard from it since it began
        probe = await pool.acquire(MODEL, 10, None, shorter_bound)
        assert probe.probe
        pool.release(probe, success=False, unhealthy=True, actual_tokens=None,
                     reason="server_error: HTTP 500 again")
        assert a.open_until == 150.0 + 160.0  # the failed probe doubled the cool-down
        with pytest.raises(NoHealthyEndpointError):  # once per call
            await pool.acquire(MODEL, 10, None, shorter_bound)

    asyncio.run(scenario())


# -- whole calls against the simulated server -------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize(("fault", "reason"), [("malformed", NOT_JSON),
                                               ("drop_mid_body", CUT_MID_BODY)],
                         ids=["not-json", "cut-mid-body"])
def test_an_endpoint_that_never_answers_usably_fails_the_rows_at_the_bound_not_the_breakers_pace(
        tmp_path, fault, reason):
    """Default breaker (10 s cool-down, the first probe after it) and a 1 s bound: the rows
    fail at the bound, the breaker's probe never comes into it."""
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        sim.configure(**{f"{fault}_rate": 1.0})
        settings = _settings(sim, tmp_path=tmp_path, endpoint_failing_after_s=1.0)
        assert settings.breaker_cooldown_s == 10.0
        started = time.monotonic()
        with InferenceClient(settings) as client:
            result = _infer(client, _frame(100))
            took = time.monotonic() - started
            records = client.ledger.records()
        sent = sim.stats()["log"]

    assert result.stats.failed == 100
    assert set(result.error_types) <= {"malformed_response", "connection_error",
                                       "endpoint_failing"}
    assert (result.error_types == "endpoint_failing").sum() >= 80
    assert result.df["out_error"].str.contains(reason, regex=False).all()
    # Nothing was sent after the breaker tripped: its probe would have come 10 s later.
    assert took < settings.breaker_cooldown_s, f"took {took:.1f} s"
    assert sent[-1][0] - sent[0][0] < 1.0
    assert len(records) == 100 and set(records["status"]) == {"failed"}


@pytest.mark.slow
def test_one_endpoint_failing_while_another_answers_fails_no_row(tmp_path):
    with SimulatedEndpoint(models=(MODEL,)) as broken, \
            SimulatedEndpoint(models=(MODEL,), latency_s=0.02) as steady:
        broken.configure(drop_mid_body_rate=1.0)
        settings = _settings(broken, steady, tmp_path=tmp_path, endpoint_failing_after_s=0.2,
                             **{**FAST_SETTINGS, "max_attempts": 20})
        with InferenceClient(settings) as client:
            result = _infer(client, _frame(150))
    # 'ep0' answered nothing usable for longer than the bound, but 'ep1' did.
    assert result.stats.endpoints["ep0"]["succeeded"] == 0
    assert result.stats.endpoints["ep0"]["failed"] >= 3
    assert result.stats.failed == 0 and result.stats.succeeded == 150


@pytest.mark.slow
def test_a_rerun_once_the_endpoint_is_fixed_answers_the_rows(tmp_path):
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        sim.configure(malformed_rate=1.0)
        settings = _settings(sim, tmp_path=tmp_path, endpoint_failing_after_s=0.5)
        df = _frame(30)
        with InferenceClient(settings) as client:
            failed = _infer(client, df)
            assert failed.stats.failed == 30
            sim.configure(malformed_rate=0.0)
            # Same client: the breaker is cooling down for 10 s more, longer than the bound;
            # the call probes it at once instead.
            again = _infer(client, df)
    assert again.stats.failed == 0 and again.stats.succeeded == 30


# -- Retry-After --------------------------------------------------------------------------

def test_a_retry_after_longer_than_the_bound_defers_the_rows_and_a_later_call_sends_them(
        tmp_path):
    """40 rows at concurrency 4, each answered 429 with Retry-After: 120 s (more than the 60 s
    bound): deferred at once instead of ten waves of waiting."""
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        sim.configure(retry_after_s=120.0)
        sim.script(*[429] * 40)
        settings = _settings(sim, tmp_path=tmp_path)
        assert settings.endpoint_failing_after_s == 60.0
        df = _frame(40)
        started = time.monotonic()
        with InferenceClient(settings) as client:
            deferred = _infer(client, df)
            took = time.monotonic() - started
            records = client.ledger.records()
            again = _infer(client, df)
        requests = sim.stats(log=False)["requests"]

    assert deferred.stats.deferred == 40
    assert (deferred.error_types == "deferred").all()
    first = deferred.df["out_error"].iloc[0]
    assert first.startswith("deferred: endpoint 'ep0' asked to wait 120 s before a retry")
    assert "rate_limited: HTTP 429" in first
    assert set(records["status"]) == {"deferred"}
    assert took < 60, f"took {took:.1f} s"  # not one Retry-After was waited out
    assert again.stats.succeeded == 40 and requests == 80


@pytest.mark.slow
def test_a_row_waiting_out_a_short_retry_after_leaves_its_slot_to_other_rows(tmp_path):
    """Concurrency 1: while the first row waits the 429's 0.5 s, the next row is sent on the
    slot it left and answered before the first row's retry."""
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        sim.configure(retry_after_s=0.5)
        sim.script(429)
        settings = _settings(sim, tmp_path=tmp_path, concurrency=1)
        with InferenceClient(settings) as client:
            result = _infer(client, _frame(2))
        log = sim.stats()["log"]

    assert result.stats.succeeded == 2
    assert [entry[1] for entry in log] == [429, 200, 200]
    assert log[1][0] - log[0][0] < 0.4  # the second row did not wait for the first's retry
    assert log[2][0] - log[0][0] >= 0.45


# -- the default bound, on the real clock (the "done when") ---------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_with_default_settings_200_rows_against_a_failing_endpoint_return_within_90_s(tmp_path):
    """200 rows against an endpoint answering 200 with a body that is not JSON, and 200 against
    one closing the connection mid-body, at once (one wait of the 60 s bound for both): each
    call returns within 90 s, every row an error naming the reason."""
    with SimulatedEndpoint(models=(MODEL,)) as not_json, \
            SimulatedEndpoint(models=(MODEL,)) as cut:
        not_json.configure(malformed_rate=1.0)
        cut.configure(drop_mid_body_rate=1.0)

        def run(sim: SimulatedEndpoint, name: str):
            settings = InferenceSettings(
                endpoints=(EndpointSpec(name=name, base_url=sim.base_url, models=(MODEL,)),),
                store_url=f"sqlite:///{tmp_path / f'{name}.db'}")
            assert settings.endpoint_failing_after_s == 60.0
            started = time.monotonic()
            with InferenceClient(settings) as client:
                result = _infer(client, _frame(200, name))
            return result, time.monotonic() - started

        with ThreadPoolExecutor(2) as threads:
            calls = {reason: threads.submit(run, sim, name) for sim, name, reason in
                     ((not_json, "not-json", NOT_JSON), (cut, "cut", CUT_MID_BODY))}
            outcomes = {reason: call.result() for reason, call in calls.items()}

    for reason, (result, took) in outcomes.items():
        print(f"{reason!r}: {took:.1f} s, {result.stats.errors_by_type}")
        assert took < 90, f"{reason}: took {took:.1f} s"
        assert result.stats.failed == 200
        assert result.df["out_error"].str.contains(reason, regex=False).all()
        assert (result.error_types == "endpoint_failing").sum() >= 150
