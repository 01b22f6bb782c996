"""The SQL-defined assets: one DuckDB query with ai_query over a partition, materialized."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from assets.sql_pipeline import (
    CLASSIFIED_TABLE,
    SOURCE_TABLE,
    SUMMARIES_TABLE,
    sql_assets,
)
from dagster_batchllm import BatchInferenceResource, Endpoint
from resources.warehouse import WarehouseResource

DAY = "2026-11-03"


def _llm(sim, tmp_path, **overrides) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="sim", base_url=sim.base_url, models=["sim-model"],
                            max_concurrency=16)],
        default_model="sim-model", store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        retry_initial_backoff_s=0.01, retry_max_backoff_s=0.05, progress_interval_s=60.0,
        **overrides,
    )


@pytest.fixture
def resources(sim, tmp_path):
    return {"llm": _llm(sim, tmp_path),
            "warehouse": WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}")}


def _materialize(resources):
    return dg.materialize(sql_assets, partition_key=DAY, resources=resources)


def _metadata(result, table):
    (event,) = [e for e in result.get_asset_materialization_events()
                if e.asset_key == dg.AssetKey(table)]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_asset_definitions():
    (pipeline,) = sql_assets
    assert {k.to_user_string() for k in pipeline.keys} == {SUMMARIES_TABLE, CLASSIFIED_TABLE}
    for key in pipeline.keys:
        spec = pipeline.specs_by_key[key]
        assert spec.group_name == "sql_pipeline" and spec.kinds == {"duckdb", "sql"}
    assert pipeline.partitions_def.get_partition_keys()[0] == "2026-11-01"
    assert dg.AssetKey(SOURCE_TABLE) in {d.asset_key for d in
                                         pipeline.specs_by_key[dg.AssetKey(SUMMARIES_TABLE)].deps}


@pytest.mark.slow
def test_sql_assets_materialize_and_rerun_from_the_ledger(sim, resources):
    result = _materialize(resources)
    assert result.success

    warehouse = resources["warehouse"]
    raw = warehouse.read_partition(SOURCE_TABLE, DAY)
    summaries = warehouse.read_partition(SUMMARIES_TABLE, DAY)
    classified = warehouse.read_partition(CLASSIFIED_TABLE, DAY)
    assert len(summaries) == len(classified) == len(raw) > 0
    texts = {}
    for row in raw.itertuples():
        text = row.transcript_raw_text
        cleaned = re.sub(r"[^a-zA-Z\s]", "", text).lower() if text is not None else None
        texts[row.call_id] = cleaned if cleaned is not None and cleaned.strip() else None
    sent = {t for t in texts.values() if t is not None}
    assert sim.stats()["requests"] == len(sent)
    for row in summaries.itertuples():
        cleaned = texts[row.call_id]
        assert row.summary_error is None
        if cleaned is None:
            assert row.summary_analysis is None
            continue
        echo = "[sim] Summarize this call transcript: " + " ".join(cleaned.split())
        # The simulator cuts replies at max_tokens (128 tokens = 512 characters).
        assert echo.startswith(row.summary_analysis)
        assert len(row.summary_analysis) == min(len(echo), 512)
    for row in classified.itertuples():
        summary = row.summary_analysis
        if summary is None:
            assert row.risk_level is None and row.action_required is None
            continue
        risk = ("High Risk" if "angry" in summary else
                "Medium Risk" if "upset" in summary else "Low Risk")
        action = ("Refund Request" if "refund" in summary else
                  "Complaint" if "complaint" in summary else "General Inquiry")
        assert (row.risk_level, row.action_required) == (risk, action)

    summary_meta = _metadata(result, SUMMARIES_TABLE)
    assert summary_meta["dagster/row_count"] == len(raw)
    assert summary_meta["dagster/table_name"] == f"main.{SUMMARIES_TABLE}"
    assert summary_meta["batchllm/requests"] == len(sent)
    classified_meta = _metadata(result, CLASSIFIED_TABLE)
    assert classified_meta["dagster/row_count"] == len(raw)
    assert classified_meta["dagster/table_name"] == f"main.{CLASSIFIED_TABLE}"

    again = _materialize(resources)
    assert again.success
    assert sim.stats()["requests"] == len(sent)
    rerun_meta = _metadata(again, SUMMARIES_TABLE)
    assert rerun_meta["batchllm/requests"] == 0
    assert rerun_meta["batchllm/rows_cached"] == len(sent)
    assert len(warehouse.read_partition(SUMMARIES_TABLE, DAY)) == len(raw)


@pytest.mark.slow
def test_sql_assets_share_answers_with_infer(sim, resources):
    """The query sends what ``infer`` sends for the Python variant, so the ledger serves it."""
    warehouse, llm = resources["warehouse"], resources["llm"]
    raw = warehouse.read_partition(SOURCE_TABLE, DAY)
    cleaned = raw.assign(transcript_text=raw["transcript_raw_text"].map(
        lambda t: re.sub(r"[^a-zA-Z\s]", "", t).lower() if t is not None else None))
    cleaned = cleaned[cleaned["transcript_text"].map(lambda t: bool(t and t.strip()))]
    llm.infer(cleaned, prompt="Summarize this call transcript: {transcript_text}",
              model="sim-model", output_column="summary", max_tokens=128, temperature=0.0)
    sent = sim.stats()["requests"]

    assert _materialize(resources).success
    assert sim.stats()["requests"] == sent


@pytest.mark.slow
def test_failed_rows_are_data_not_a_failed_partition(sim, resources, tmp_path):
    resources["llm"] = _llm(sim, tmp_path, max_attempts=1)
    sim.script(500)
    result = _materialize(resources)
    assert result.success
    summaries = resources["warehouse"].read_partition(SUMMARIES_TABLE, DAY)
    errors = summaries["summary_error"].dropna()
    assert len(errors) == 1 and errors.iloc[0].startswith("server_error: HTTP 500")
    assert _metadata(result, SUMMARIES_TABLE)["batchllm/rows_failed"] == 1


@pytest.mark.slow
def test_retry_sensor_finds_the_failed_rows_of_the_sql_defined_asset(sim, resources, tmp_path):
    """The AI functions record their rows under the summaries' asset key (not an empty scope),
    so the retry-partitions sensor built for that asset requests the partition again."""
    from dagster_batchllm.sensors import build_retry_partitions_sensor

    resources["llm"] = llm = _llm(sim, tmp_path, max_attempts=1)
    sim.script(400)  # one row fails for good
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    assert dg.materialize(sql_assets, partition_key=DAY, resources=resources,
                          instance=instance).success
    assert llm.ledger.partitions_needing_retry(scope=SUMMARIES_TABLE) == {
        DAY: {"failed": 1, "deferred": 0}}
    assert llm.ledger.partitions_needing_retry(scope="") == {}

    (pipeline,) = sql_assets
    spec = pipeline.specs_by_key[dg.AssetKey(SUMMARIES_TABLE)]
    sensor = build_retry_partitions_sensor(spec, resource=llm, base_delay_s=0)
    result = sensor(dg.build_sensor_context(instance=instance))
    assert [r.partition_key for r in result.run_requests] == [DAY]
    instance.dispose()


def test_several_assets_need_a_scope_for_their_ai_functions(sim, resources):
    """A multi-asset op that registers the AI functions without naming their asset is told to,
    before any request: otherwise its failed rows would be invisible to the retry sensor."""
    import duckdb

    from dagster_batchllm.sql import register_ai_functions

    @dg.multi_asset(specs=[dg.AssetSpec("first"), dg.AssetSpec("second")],
                    required_resource_keys={"llm"})
    def two_tables(context):
        with pytest.raises(Exception, match="pass scope= naming the one"):
            register_ai_functions(duckdb.connect(), context.resources.llm, context=context)
        yield dg.MaterializeResult(asset_key="first")
        yield dg.MaterializeResult(asset_key="second")

    assert dg.materialize([two_tables], resources={"llm": resources["llm"]}).success
    assert sim.stats(log=False)["requests"] == 0
