"""Issue 17's engine items: a URL with nothing listening fails fast and says why, errors of the
sync ``infer()`` carry no asyncio noise, ``stats.endpoints`` counts one call, a 404 hints /v1."""

from __future__ import annotations

import logging
import socket
import time
import traceback

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import ErrorType, InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint
from tests.conftest import FAST_SETTINGS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_an_endpoint_with_nothing_listening_fails_the_rows_fast_and_says_why(tmp_path, caplog):
    # endpoint_unreachable_after_s=1 takes effect: the default (15 s) would fail the bound below
    url = f"http://127.0.0.1:{_free_port()}/v1"
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="nowhere", base_url=url, models=("m",), api_key="sk-SECRET",
                                max_concurrency=4),),
        store_url=f"sqlite:///{tmp_path / 'l.db'}",
        endpoint_unreachable_after_s=1.0,
        **{**FAST_SETTINGS, "max_attempts": 50, "retry_max_backoff_s": 0.5})
    df = pd.DataFrame({"t": [f"row {i}" for i in range(500)]})
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dagster_batchllm"), \
            InferenceClient(settings) as client:
        result = client.infer(df, prompt="{t}", model="m", output_column="out")
    took = time.monotonic() - started
    assert took < 10, f"took {took:.1f} s"
    assert result.stats.failed == 500
    assert set(result.error_types) <= {"endpoint_unreachable", "connection_error",
                                       "no_healthy_endpoint"}
    assert (result.error_types == ErrorType.ENDPOINT_UNREACHABLE.value).sum() >= 400
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    said = [m for m in warnings if url in m and "cannot be reached" in m]
    assert said and "refused" in said[0].lower(), warnings
    assert not any("sk-SECRET" in m for m in warnings)
    unreachable = result.df["out_error"][result.error_types == "endpoint_unreachable"]
    assert unreachable.str.contains("check base_url").all()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_with_default_settings_the_rows_fail_after_the_promised_15_s(tmp_path):
    """The README's promise as a user gets it: default retry, breaker and bound settings, 500
    rows at concurrency 16 against a port with nothing listening. Backoffs and the breaker's
    cool-downs (which grow up to 80 s) are cut at the bound."""
    url = f"http://127.0.0.1:{_free_port()}/v1"
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="nowhere", base_url=url, models=("m",),
                                max_concurrency=16),),
        store_url=f"sqlite:///{tmp_path / 'l.db'}")
    bound = settings.endpoint_unreachable_after_s
    assert bound == 15.0
    df = pd.DataFrame({"t": [f"row {i}" for i in range(500)]})
    started = time.monotonic()
    with InferenceClient(settings) as client:
        result = client.infer(df, prompt="{t}", model="m")
    took = time.monotonic() - started
    assert bound <= took < bound + 5, f"took {took:.1f} s"
    assert (result.error_types == ErrorType.ENDPOINT_UNREACHABLE.value).all()


@pytest.mark.slow
def test_a_slow_endpoint_is_waited_for_not_called_unreachable(tmp_path):
    with SimulatedEndpoint(latency_s=0.5) as sim:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="slow", base_url=sim.base_url, models=("sim-model",),
                                    max_concurrency=4),),
            store_url=None, endpoint_unreachable_after_s=0.2, **FAST_SETTINGS)
        with InferenceClient(settings) as client:
            result = client.infer(pd.DataFrame({"t": list("abcdefgh")}), prompt="{t}")
    assert result.stats.succeeded == 8 and result.stats.failed == 0


def test_errors_of_the_sync_infer_carry_no_asyncio_noise(tmp_path):
    with SimulatedEndpoint() as sim:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="e", base_url=sim.base_url, models=("sim-model",)),),
            store_url=None, **FAST_SETTINGS)
        with InferenceClient(settings) as client, pytest.raises(InferenceConfigError) as info:
            client.infer(pd.DataFrame({"t": ["a"]}), prompt="{missing_column}")
    text = "".join(traceback.format_exception(info.value))
    assert "no running event loop" not in text
    assert "During handling of the above exception" not in text
    assert info.value.__context__ is None


def test_stats_endpoints_count_one_call_not_the_clients_lifetime():
    with SimulatedEndpoint() as sim:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="e", base_url=sim.base_url, models=("sim-model",)),),
            store_url=None, **FAST_SETTINGS)
        with InferenceClient(settings) as client:
            first = client.infer(pd.DataFrame({"t": ["a", "b", "c"]}), prompt="{t}")
            second = client.infer(pd.DataFrame({"t": ["d", "e"]}), prompt="{t}")
    assert first.stats.endpoints["e"]["requests"] == 3
    assert second.stats.endpoints["e"]["requests"] == 2
    assert second.stats.endpoints["e"]["succeeded"] == 2


def test_a_404_says_the_base_url_usually_ends_in_v1():
    with SimulatedEndpoint() as sim:
        root = sim.base_url.removesuffix("/v1")
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="e", base_url=root, models=("sim-model",)),),
            store_url=None, **FAST_SETTINGS)
        with InferenceClient(settings) as client:
            result = client.infer(pd.DataFrame({"t": ["a"]}), prompt="{t}", output_column="o")
    error = result.df["o_error"].iloc[0]
    assert error.startswith("not_found:") and "/v1" in error and root in error, error
