"""Token budgets, rate limits and concurrency caps, measured where they matter: at the server."""

from __future__ import annotations

import dataclasses
import threading

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.openai_server.protocol import tokens
from dagster_batchllm.testing import SimulatedEndpoint, run_on_threads

MODEL = "sim-model"


def frame(n: int, prefix: str = "Classify item") -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{prefix} {i:05d}" for i in range(n)]},
                        index=pd.Index(range(n))[::-1])


def endpoints_with(settings, **changes):
    """The settings with every endpoint changed (conftest's endpoints all get 16 slots)."""
    return settings.replace(
        endpoints=tuple(dataclasses.replace(e, **changes) for e in settings.endpoints))


@pytest.fixture
def client_with(make_settings):
    """An InferenceClient over the sims whose endpoints carry ``endpoint`` changes."""
    clients = []

    def build(*sims, endpoint=None, **overrides) -> InferenceClient:
        client = InferenceClient(endpoints_with(make_settings(*sims, **overrides),
                                                **(endpoint or {})))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def infer(client, df, **kwargs):
    kwargs.setdefault("max_tokens", 16)
    return client.infer(df, prompt="{text}", model=MODEL, output_column="out", **kwargs)


def test_token_budget_for_half_the_rows_defers_the_rest_and_a_second_call_completes_them(
    sim, make_client
):
    n, max_tokens = 80, 16
    df = frame(n)
    text = df["text"].iloc[0]
    per_row = (tokens(text) + 4) + min(tokens("[sim] " + text), max_tokens)  # server usage
    budget = per_row * n // 2
    sim.configure(latency_s=0.002)
    client = make_client(sim)

    first = infer(client, df, token_budget=budget, max_tokens=max_tokens)

    server = sim.stats(log=False)
    spent = server["prompt_tokens"] + server["completion_tokens"]
    assert spent <= budget  # the budget is never overrun, whatever the concurrency
    assert first.stats.prompt_tokens + first.stats.completion_tokens == spent
    stats = first.stats
    assert stats.succeeded + stats.deferred == n and stats.failed == 0
    assert 0.3 * n <= stats.succeeded <= 0.55 * n  # about half
    deferred = first.df[first.df["out"].isna()]
    assert len(deferred) == stats.deferred
    assert deferred["out_error"].str.startswith("deferred:").all()
    assert first.df.loc[first.df["out"].notna(), "out_error"].isna().all()
    counts = client.ledger.status_counts()
    assert (counts["ok"], counts["deferred"]) == (stats.succeeded, stats.deferred)

    second = infer(client, df, max_tokens=max_tokens)

    assert (second.stats.succeeded, second.stats.deferred, second.stats.failed) == (n, 0, 0)
    assert second.stats.cached == stats.succeeded
    assert second.stats.requests == stats.deferred
    assert second.df["out"].tolist() == ["[sim] " + t for t in df["text"]]
    assert second.df["out_error"].isna().all()
    server = sim.stats(log=False)
    assert server["ok"] == n and server["duplicates"] == 0  # no prompt answered twice
    assert client.ledger.status_counts() == {"ok": n, "failed": 0, "deferred": 0,
                                             "superseded": 0}


def test_a_budget_smaller_than_one_request_defers_everything_and_sends_nothing(
    sim, make_client
):
    result = infer(make_client(sim), frame(5), token_budget=10)
    assert result.stats.deferred == 5 and sim.stats(log=False)["requests"] == 0
    assert result.df["out_error"].str.startswith("deferred:").all()


def test_resource_wide_default_budget_applies_when_the_call_gives_none(sim, make_client):
    client = make_client(sim, token_budget=10)
    result = infer(client, frame(4))
    assert result.stats.deferred == 4 and sim.stats(log=False)["requests"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "what"), [("requests_per_minute", "requests"),
                                             ("tokens_per_minute", "tokens")])
def test_rate_limits_are_never_exceeded_at_the_server_at_high_concurrency(
    client_with, limit, what
):
    window = 0.5
    # Per window: 40 requests, or the tokens of about 40 requests.
    per_window = 40 if what == "requests" else 40 * 20
    per_minute = int(per_window * 60 / window)
    with SimulatedEndpoint(latency_s=0.005) as sim:
        client = client_with(sim, endpoint={
            limit: per_minute, "rate_limit_window_s": window, "max_concurrency": 64})
        df = frame(100)

        result = infer(client, df, max_tokens=8)

        assert result.stats.succeeded == 100
        peak = sim.max_in_window(window, what)
        assert 0 < peak <= per_window
        # The limit throttled the run (it spans more than one window) but did not starve it.
        log = sim.stats()["log"]
        assert log[-1][0] - log[0][0] >= window


def test_max_concurrency_caps_what_the_server_sees_in_flight(client_with):
    with SimulatedEndpoint(latency_s=0.02) as a, SimulatedEndpoint(latency_s=0.02) as b:
        client = client_with(a, b, endpoint={"max_concurrency": 5})
        result = infer(client, frame(120))
        assert result.stats.succeeded == 120
        for sim in (a, b):
            server = sim.stats(log=False)
            assert server["max_concurrent"] == 5  # used fully, never above
            assert server["requests"] > 20


@pytest.mark.slow
def test_two_runs_at_once_sharing_one_ledger_respect_the_endpoints_max_concurrency(
    make_settings
):
    cap = 8
    with SimulatedEndpoint(latency_s=0.02) as sim:
        settings = endpoints_with(make_settings(sim, coordination_interval_s=0.2),
                                  max_concurrency=cap)
        barrier = threading.Barrier(2)

        def run(name: str):
            with InferenceClient(settings) as client:
                barrier.wait()
                return infer(client, frame(160, prefix=f"run {name} item"), partition_key=name)

        results = run_on_threads(run, ("p1", "p2"), timeout_s=60)
        assert all(results[name].stats.succeeded == 160 for name in ("p1", "p2"))
        server = sim.stats(log=False)
        assert server["ok"] == 320 and server["duplicates"] == 0
        # Together the two runs stayed within the endpoint's cap ...
        assert server["max_concurrent"] <= cap
        # ... while both were sending at the same time (their ledger writes interleave).
        ledger = InferenceClient(settings).ledger
        records = ledger.records()
        spans = {p: (g["created_at"].min(), g["created_at"].max())
                 for p, g in records.groupby("partition_key")}
        assert spans["p1"][0] < spans["p2"][1] and spans["p2"][0] < spans["p1"][1]
        ledger.dispose()
