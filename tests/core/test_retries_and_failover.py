"""Retries (429 with Retry-After, 5xx, dropped connections), final errors, failover, breakers."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest

from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"


def frame(n: int, prefix: str = "row") -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{prefix} {i}" for i in range(n)]}, index=range(n, 0, -1))


def infer(client, df, **kwargs):
    return client.infer(df, prompt="Echo {text}", model=MODEL, output_column="out", **kwargs)


def assert_all_answered(result, df):
    assert result.df["out_error"].isna().all(), result.df["out_error"].dropna().tolist()
    assert result.df["out"].tolist() == [f"[sim] Echo {t}" for t in df["text"]]
    assert result.df.index.equals(df.index)


def test_429_with_retry_after_then_500_and_drop_are_retried_to_success(sim, make_client):
    sim.configure(retry_after_s=0.15)
    sim.script(429, 500, "drop", 503, 200)
    client = make_client(sim, breaker_failure_threshold=10)  # retries alone, no breaker
    df = frame(1)

    result = infer(client, df)

    assert_all_answered(result, df)
    server = sim.stats()
    assert server["requests"] == 5 and server["ok"] == 1
    assert server["by_status"] == {"429": 1, "500": 1, "503": 1, "200": 1}
    assert server["dropped"] == 1
    # The client waited what the 429's Retry-After asked for (0.15 s) before its next try.
    arrivals = [entry[0] for entry in server["log"]]
    assert arrivals[1] - arrivals[0] >= 0.14
    assert (result.stats.requests, result.stats.retries, result.stats.succeeded) == (5, 4, 1)
    record = client.ledger.records().iloc[0]
    assert (record["status"], record["attempts"], record["endpoint"]) == ("ok", 5, "ep0")
    assert record["response"] == "[sim] Echo row 0"


def test_faults_spread_over_many_rows_are_all_retried_and_counted_in_the_ledger(
    sim, make_client
):
    faults = [429] * 4 + [500] * 3 + ["drop"] * 3 + [502, 408, 409]
    sim.configure(retry_after_s=0.01, latency_s=0.002)
    sim.script(*faults)
    client = make_client(sim, breaker_failure_threshold=50)
    df = frame(60)

    result = infer(client, df)

    assert_all_answered(result, df)
    server = sim.stats(log=False)
    assert server["requests"] == 60 + len(faults) and server["ok"] == 60
    assert server["duplicates"] == 0
    assert result.stats.retries == len(faults)
    records = client.ledger.records()
    assert len(records) == 60 and set(records["status"]) == {"ok"}
    assert records["attempts"].sum() == 60 + len(faults)
    assert records["attempts"].max() >= 2


def test_a_lone_endpoint_whose_breaker_trips_is_probed_after_the_cooldown_and_the_row_succeeds(
    sim, make_client
):
    sim.script(500, 500, 500)  # trips the breaker (threshold 3), then answers again
    client = make_client(sim, breaker_failure_threshold=3, breaker_cooldown_s=0.1,
                         max_retry_after_s=1.0)
    df = frame(1)

    result = infer(client, df)

    assert_all_answered(result, df)
    server = sim.stats()
    assert server["by_status"] == {"500": 3, "200": 1} and server["requests"] == 4
    arrivals = [entry[0] for entry in server["log"]]
    assert arrivals[3] - arrivals[2] >= 0.09  # the probe went out after the cool-down
    assert not client.pool.endpoints[0].tripped


def test_failures_in_flight_when_the_breaker_trips_leave_its_cool_down_as_it_is():
    """Only the tripping failure and failed probes set the cool-down: 16 requests refused at
    once once stretched a 10 s cool-down to 80 s, and a URL with nothing listening failed its
    rows after 80 s instead of the promised 15 (issue 31)."""
    import asyncio

    from dagster_batchllm.core.delivery.pool import EndpointPool
    from dagster_batchllm.core.settings import EndpointSpec

    now = [100.0]
    pool = EndpointPool((EndpointSpec(name="a", base_url="http://127.0.0.1:9/v1",
                                      models=(MODEL,), max_concurrency=16),),
                        failure_threshold=5, cooldown_s=10.0, clock=lambda: now[0])
    [state] = pool.endpoints

    async def fail(leases: int) -> None:
        taken = [await pool.acquire(MODEL, 10) for _ in range(leases)]
        for lease in taken:
            pool.release(lease, success=False, unhealthy=True, actual_tokens=None)

    asyncio.run(fail(16))
    assert state.tripped and state.open_until == 110.0  # not 100 + 8 x 10
    now[0] = 110.0
    asyncio.run(fail(1))  # the probe after the cool-down fails: the cool-down doubles
    assert state.open_until == 130.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "bad_request"), (401, "authentication_error"), (403, "authentication_error"),
     (404, "not_found"), (422, "bad_request")],
)
def test_errors_retrying_cannot_fix_fail_the_row_at_once(sim, make_client, status, error_type):
    sim.script(status)
    client = make_client(sim)
    df = frame(1)

    result = infer(client, df)

    assert sim.stats(log=False)["requests"] == 1  # not retried
    error = result.df["out_error"].iloc[0]
    assert error.startswith(f"{error_type}: HTTP {status} from endpoint 'ep0'")
    assert result.df["out"].isna().all()
    assert (result.stats.failed, result.stats.retries) == (1, 0)
    assert result.stats.errors_by_type == {error_type: 1}
    record = client.ledger.records().iloc[0]
    assert (record["status"], record["error_type"], record["attempts"]) == ("failed", error_type, 1)
    # A 4xx says the request is wrong, not the endpoint: the breaker stays closed.
    assert client.pool.endpoints[0].consecutive_failures == 0


@pytest.mark.parametrize(
    ("fault", "error_type", "message"),
    [(500, "server_error", "HTTP 500"), ("drop", "connection_error", "connection to endpoint"),
     (429, "rate_limited", "HTTP 429")],
)
def test_exhausted_attempts_fail_the_row_with_the_last_reason(
    sim, make_client, fault, error_type, message
):
    sim.configure(retry_after_s=0.01)
    sim.script(*[fault] * 3)
    client = make_client(sim, max_attempts=3, breaker_failure_threshold=10)
    df = frame(1)

    result = infer(client, df)

    assert sim.stats(log=False)["requests"] == 3
    error = result.df["out_error"].iloc[0]
    assert error.startswith(f"{error_type}: ") and message in error
    assert (result.stats.failed, result.stats.requests, result.stats.retries) == (1, 3, 2)
    record = client.ledger.records().iloc[0]
    assert (record["status"], record["attempts"], record["error_type"]) == (
        "failed", 3, error_type)
    assert record["error"] == error
    # A later call sends the failed row again (only ok answers are reused) and it succeeds.
    again = infer(client, df)
    assert_all_answered(again, df)
    assert client.ledger.records().iloc[0]["status"] == "ok"


@pytest.mark.slow
def test_timeout_is_retried_then_reported(sim, make_client):
    sim.script("stall", "stall")
    client = make_client(sim, request_timeout_s=0.3, max_attempts=2)
    df = frame(1)
    result = infer(client, df)
    assert result.df["out_error"].iloc[0].startswith("timeout: ")
    assert sim.stats(log=False)["stalled"] == 2


def stop_after(sim: SimulatedEndpoint, answered: int) -> threading.Thread:
    """Kill ``sim`` from another thread once it has answered ``answered`` requests."""

    def watch() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sim.stats(log=False)["ok"] < answered:
            time.sleep(0.005)
        sim.stop()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_endpoint_stopped_mid_run_fails_over_and_no_row_is_lost(make_client):
    with SimulatedEndpoint(latency_s=0.01) as doomed, SimulatedEndpoint(latency_s=0.01) as other:
        client = make_client(doomed, other, breaker_failure_threshold=3,
                             breaker_cooldown_s=0.2)
        df = frame(400)
        killer = stop_after(doomed, 60)

        result = infer(client, df)
        killer.join(5)

        assert not doomed.running
        assert_all_answered(result, df)
        stats = result.stats
        assert (stats.succeeded, stats.failed) == (400, 0)
        dead = doomed.stats(log=False)
        alive = other.stats(log=False)
        assert dead["ok"] >= 60 and alive["ok"] > 0
        # Every row was answered by one server or the other; only a reply the dying server
        # counted but never delivered (at most its 16 in-flight requests) is answered twice.
        assert 400 <= dead["ok"] + alive["ok"] <= 400 + 16
        assert dead["duplicates"] == alive["duplicates"] == 0
        assert stats.endpoints["ep0"]["failed"] > 0 and stats.retries > 0
        assert stats.endpoints["ep1"]["succeeded"] == alive["ok"]
        records = client.ledger.records()
        assert len(records) == 400 and set(records["status"]) == {"ok"}
        assert set(records["endpoint"]) == {"ep0", "ep1"}


@pytest.mark.slow
def test_breaker_cools_a_dead_endpoint_and_probes_it_again_after_restart(make_client):
    with SimulatedEndpoint(latency_s=0.005) as flaky, SimulatedEndpoint(latency_s=0.005) as steady:
        client = make_client(flaky, steady, breaker_failure_threshold=3,
                             breaker_cooldown_s=0.1)
        flaky.stop()

        first = infer(client, frame(150, "first"))

        assert first.stats.failed == 0 and first.stats.succeeded == 150
        snap = first.stats.endpoints["ep0"]
        assert snap["succeeded"] == 0 and snap["failed"] >= 3
        # Cooled down: the dead endpoint took a handful of connection attempts, not 150 rows.
        assert snap["requests"] < 40
        assert first.stats.endpoints["ep1"]["succeeded"] == 150
        state = client.pool.endpoints[0]
        assert state.tripped

        flaky.restart()
        deadline = time.monotonic() + 5
        while client.pool.endpoints[0].is_open(time.monotonic()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        flaky.reset_stats()

        second = infer(client, frame(150, "second"))

        assert second.stats.failed == 0
        # A probe succeeded, the breaker closed and the endpoint took its share again.
        assert flaky.stats(log=False)["ok"] > 1
        assert second.stats.endpoints["ep0"]["succeeded"] == (
            snap["succeeded"] + flaky.stats(log=False)["ok"])
        assert not client.pool.endpoints[0].tripped
