"""An asset whose server echoes the API key in its 401, 400 and 429 bodies: the key reaches
none of what Dagster keeps.

The asset is built with ``build_inference_asset`` and materialized in a real
``DagsterInstance`` on disk (SQLite run and event storage, the filesystem IO manager), its
key read from the environment at run time as a deployment does. Then every byte under the
test's directory (the instance's storage, the stored asset output, the ledger), the run's
event log records (metadata, ``batchllm/failed_rows``, the checks' descriptions), the captured
output and the logs at DEBUG are searched for the key.
"""

from __future__ import annotations

import logging
import uuid

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint, build_inference_asset
from dagster_batchllm.core.redaction import MASK
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
KEY = f"sk-test-{uuid.uuid4().hex}"
pytestmark = pytest.mark.timeout(90)


@dg.asset
def tickets() -> pd.DataFrame:
    return pd.DataFrame({"text": ["refund please", "where is my order", "cancel it"]})


summaries = build_inference_asset(
    name="summaries", source=tickets, prompt="Summarize: {text}", output_column="summary",
    model=MODEL, max_tokens=16, warn_failed_rate=0.05, error_failed_rate=0.5)


@pytest.mark.slow
def test_an_echoed_key_reaches_no_event_metadata_check_output_or_file(tmp_path, monkeypatch,
                                                                       capfd, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("BATCHLLM_REDACTION_TEST_KEY", KEY)
    with SimulatedEndpoint(models=(MODEL,), api_key=KEY) as sim:
        sim.configure(echo_credentials=True)
        # Three rows at once: one gets a 401, one a 400, one a 429 on every attempt (the
        # retry loop's six, default settings).
        sim.script(401, 400, *[429] * 6)
        llm = BatchInferenceResource(
            endpoints=[Endpoint(name="gpu-a", base_url=sim.base_url, models=[MODEL],
                                api_key=dg.EnvVar("BATCHLLM_REDACTION_TEST_KEY"))],
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", max_retry_after_s=0.05,
            retry_initial_backoff_s=0.01, retry_max_backoff_s=0.05)
        (tmp_path / "dagster_home").mkdir()
        with dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster_home")) as instance:
            result = dg.materialize([tickets, summaries], instance=instance,
                                    resources={"llm": llm}, raise_on_error=False)
            events = instance.all_logs(result.run_id)
            run = instance.get_run_by_id(result.run_id)
            stored = instance.storage_directory()
        assert sim.stats(log=False)["by_status"] == {"401": 1, "400": 1, "429": 6}

    assert result.success  # failing checks report; they do not fail the run
    [materialization] = result.asset_materializations_for_node("summaries")
    failed = materialization.metadata["batchllm/failed_rows"].records
    assert sorted(r.data["error_type"] for r in failed) == [
        "authentication_error", "bad_request", "rate_limited"]
    assert all(MASK in str(r.data) for r in failed)  # each one's echo, masked
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    rate = evaluations["failed_row_rate"]
    assert rate.passed is False and rate.severity == dg.AssetCheckSeverity.ERROR
    errors = [str(e.user_message) + repr(e.dagster_event) for e in events]
    assert any(f"Authorization: Bearer {MASK}" in text for text in errors)  # it was echoed
    captured = capfd.readouterr()
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.is_relative_to(stored) for path in files)  # the stored asset output
    haystacks = [
        *errors, repr(run), repr(materialization.metadata), repr(rate),
        captured.out, captured.err, caplog.text,
        *(repr(r.__dict__) for r in caplog.records),
        *(path.read_bytes() for path in files),
    ]
    for haystack in haystacks:
        data = haystack if isinstance(haystack, bytes) else haystack.encode()
        assert KEY.encode() not in data
        assert KEY[8:24].encode() not in data
