"""An endpoint's API key is sent to the server and shown nowhere else.

The simulated server requires the key, so every answered row proves it was sent; then logs
(DEBUG, every library), Dagster's event log and captured output, stats, errors, the ledger, reprs
and exceptions are searched for it.
"""

from __future__ import annotations

import logging
import traceback
import uuid

import dagster as dg
import pandas as pd
import pydantic
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
KEY = f"sk-test-{uuid.uuid4().hex}"
WRONG_KEY = f"sk-wrong-{uuid.uuid4().hex}"


def assert_no_key(*texts: object, keys=(KEY, WRONG_KEY)) -> None:
    for text in texts:
        text = str(text)
        for key in keys:
            assert key not in text
            assert key[8:24] not in text  # not even a recognisable piece of it


@pytest.fixture
def locked_sim():
    with SimulatedEndpoint(api_key=KEY, latency_s=0.002) as sim:
        yield sim


def everything_logged(caplog) -> str:
    parts = [caplog.text]
    for record in caplog.records:
        parts.append(record.getMessage())
        parts.append(repr(record.args))
        parts.append(repr(record.__dict__))
    return "\n".join(parts)


@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_api_key_is_sent_but_never_in_logs_stats_errors_or_ledger(
    locked_sim, make_client, caplog, http_client
):
    caplog.set_level(logging.DEBUG)  # the root logger: openai, httpx, aiohttp, sqlalchemy too
    locked_sim.script(429, 500, "drop")
    with SimulatedEndpoint() as dead:
        dead.stop()  # a second endpoint that refuses connections: failover and its errors
        client = make_client(locked_sim, dead, http_client=http_client,
                             endpoint_kwargs={"api_key": KEY}, progress_interval_s=0.01)
        df = pd.DataFrame({"text": [f"row {i}" for i in range(30)] + [None]})
        result = client.infer(df, prompt="Echo {text}", model=MODEL, output_column="out",
                              max_tokens=16)

    assert result.stats.succeeded == 30  # the server requires the key: it was sent
    assert locked_sim.stats(log=False)["by_status"].get("401") is None
    assert result.stats.failed == 1
    records = client.ledger.records()
    assert len(records) == 30
    assert_no_key(
        everything_logged(caplog),
        result.stats.as_dict(), result.stats.summary(),
        result.df.to_csv(), records.to_csv(), records.to_dict("records"),
        repr(client.settings), repr(client.settings.endpoints), str(client.settings),
        client.pool.snapshot(),
    )


@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_a_rejected_key_is_a_row_error_that_shows_neither_key(
    locked_sim, make_client, caplog, http_client
):
    caplog.set_level(logging.DEBUG)
    client = make_client(locked_sim, http_client=http_client,
                         endpoint_kwargs={"api_key": WRONG_KEY})
    df = pd.DataFrame({"text": ["a", "b"]})

    result = client.infer(df, prompt="{text}", model=MODEL, output_column="out")

    errors = result.df["out_error"].tolist()
    assert all(e.startswith("authentication_error: HTTP 401") for e in errors)
    assert locked_sim.stats(log=False)["requests"] == 2  # 401 is final, not retried
    assert_no_key(errors, everything_logged(caplog), result.stats.as_dict(),
                  client.ledger.records().to_csv())


def test_repr_of_endpoint_settings_and_resource_hides_the_key(tmp_path):
    spec = EndpointSpec(name="gpu-a", base_url="http://127.0.0.1:9/v1", models=(MODEL,),
                        api_key=KEY)
    endpoint = Endpoint(name="gpu-a", base_url="http://127.0.0.1:9/v1", models=[MODEL],
                        api_key=KEY)
    resource = BatchInferenceResource(endpoints=[endpoint],
                                      store_url=f"sqlite:///{tmp_path / 'l.db'}")
    settings = resource.to_settings()
    assert settings.endpoints[0].api_key == KEY  # it is there, just never shown
    assert_no_key(repr(spec), str(spec), repr(endpoint), str(endpoint), repr(resource),
                  str(resource), repr(settings), str(settings), f"{settings!r}",
                  repr(resource.client.settings))
    resource.client.close()


def test_exceptions_never_show_the_key(locked_sim, make_client, tmp_path):
    client = make_client(locked_sim, endpoint_kwargs={"api_key": KEY})
    df = pd.DataFrame({"text": ["a"]})
    raised = []
    for call in (
        lambda: client.infer(df, prompt="{missing}", model=MODEL),
        lambda: client.infer(df, prompt="{text}", model="unknown-model"),
        lambda: client.estimate(df, prompt="{text}", model=MODEL, bogus_param=1),
        lambda: EndpointSpec(name="x", base_url="ftp://nope", models=(MODEL,), api_key=KEY),
        lambda: Endpoint(name="x", base_url="http://h/v1", models=[MODEL], api_key=KEY,
                         max_concurrency="many"),
        lambda: BatchInferenceResource(
            endpoints=[Endpoint(name="x", base_url="http://h/v1", models=[MODEL],
                                api_key=KEY)],
            store_url="not a url at all", ledger_table="t").client.ledger,
    ):
        with pytest.raises((InferenceConfigError, ValueError, pydantic.ValidationError)) as info:
            call()
        raised.append(info.value)
    assert_no_key(*(("".join(traceback.format_exception(e)), repr(e)) for e in raised))
    assert locked_sim.stats(log=False)["requests"] == 0


@dg.asset
def secret_summaries(context, llm: BatchInferenceResource) -> dg.MaterializeResult:
    df = pd.DataFrame({"text": [f"call {i}" for i in range(12)]})
    result = llm.infer(df, context=context, prompt="Summarize {text}", model=MODEL,
                       output_column="summary")
    context.log.info(f"resource: {llm!r}; settings: {llm.to_settings()!r}")
    context.log.info(f"stats: {result.stats.as_dict()}")
    context.log.debug(result.df.to_string())
    assert result.stats.succeeded == 12
    return dg.MaterializeResult(metadata={
        "stats": dg.MetadataValue.json(result.stats.as_dict()),
        "preview": dg.MetadataValue.text(result.df.to_csv()),
    })


def test_api_key_from_envvar_never_reaches_dagster_logs_metadata_or_run_storage(
    locked_sim, tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("BATCHLLM_TEST_SIM_KEY", KEY)
    llm = BatchInferenceResource(
        endpoints=[Endpoint(name="gpu-a", base_url=locked_sim.base_url, models=[MODEL],
                            max_concurrency=4, api_key=dg.EnvVar("BATCHLLM_TEST_SIM_KEY"))],
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        progress_interval_s=0.01,
    )
    instance = dg.DagsterInstance.ephemeral()

    result = dg.materialize([secret_summaries], resources={"llm": llm}, instance=instance)

    assert result.success
    assert locked_sim.stats(log=False)["ok"] == 12  # the key from the environment was sent
    events = instance.all_logs(result.run_id)
    assert any("batchllm:" in (e.user_message or "") for e in events)
    run = instance.get_run_by_id(result.run_id)
    materializations = result.asset_materializations_for_node("secret_summaries")
    captured = capfd.readouterr()
    assert_no_key(
        *(repr(e) for e in events), *(e.user_message for e in events),
        repr(run), run.run_config, materializations, captured.out, captured.err,
    )
