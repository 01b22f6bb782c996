"""The example pipeline (cleaned -> summaries -> classified) materialized in process against a
simulated endpoint: one partition, and a three-day backfill both ways."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.pipeline import CLASSIFICATION_SCHEMA, pipeline_assets
from resources.warehouse import WarehouseIOManager, WarehouseResource

DAY = "2026-11-05"
DAYS = ["2026-11-02", "2026-11-03", "2026-11-04"]
INFERRED = ("transcript_summaries", "classified_transcripts")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def example_resources(sim, make_llm_resource, tmp_path):
    """The example's resources on temp files, inference on the simulated endpoint."""

    def build(name: str = "run") -> dict[str, object]:
        warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / name}_warehouse.db")
        return {
            "llm": make_llm_resource(sim, store_url=f"sqlite:///{tmp_path / name}_ledger.db"),
            "warehouse": warehouse,
            "io_manager": WarehouseIOManager(warehouse=warehouse),
        }

    return build


def _materializations(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, dict]:
    return {m.partition: m.metadata for m in result.asset_materializations_for_node(asset)}


def _ledger_pairs(resources: dict, scope: str) -> set[tuple[str, str]]:
    records = resources["llm"].ledger.records(scope=scope)
    assert set(records["status"]) == {"ok"}
    return set(zip(records["request_key"], records["partition_key"], strict=True))


@pytest.mark.slow
def test_one_partition_materializes_all_three_assets(example_resources, sim):
    resources = example_resources()
    result = dg.materialize(pipeline_assets, partition_key=DAY, resources=resources)
    assert result.success

    warehouse: WarehouseResource = resources["warehouse"]
    source = warehouse.read_partition("call_center_transcripts", DAY)
    for table in ("cleaned_transcripts", *INFERRED):
        stored = warehouse.read_partition(table, DAY)
        assert list(stored["call_id"]) == list(source["call_id"]), table

    metadata = _materializations(result, "transcript_summaries")[DAY]
    assert metadata["dagster/row_count"].value == len(source)
    schema = metadata["dagster/column_schema"].value
    assert {"summary", "summary_error", "call_id"} <= {c.name for c in schema.columns}
    assert metadata["batchllm/sim-model/completion_tokens"].value > 0
    assert metadata["batchllm/sim-model/prompt_tokens"].value > 0
    assert "| call_id" in metadata["preview"].value
    assert metadata["dagster/table_name"].value == "main.transcript_summaries"
    summaries = warehouse.read_partition("transcript_summaries", DAY)
    answered = summaries["summary_error"].isna()
    assert answered.sum() >= len(source) - 3  # only null/blank transcripts fail, as data
    assert summaries.loc[answered, "summary"].str.startswith("[sim] Summarize").all()

    classified = warehouse.read_partition("classified_transcripts", DAY)
    ok = classified["classification_error"].isna() & classified["summary_error"].isna()
    enums = CLASSIFICATION_SCHEMA["properties"]
    assert set(classified.loc[ok, "risk_level"]) <= set(enums["risk_level"]["enum"])
    assert set(classified.loc[ok, "action_required"]) <= set(enums["action_required"]["enum"])
    assert {"rule_risk_level", "rule_action_required"} <= set(classified.columns)

    ledger = resources["llm"].ledger
    for scope in INFERRED:
        records = ledger.records(scope=scope)
        assert set(records["partition_key"]) == {DAY}
        assert set(records["run_id"]) == {result.run_id}
    # Every request the server answered is in the ledger, none twice.
    assert sim.stats(log=False)["ok"] == sum(len(ledger.records(scope=s)) for s in INFERRED)


@pytest.mark.slow
def test_backfill_one_run_per_partition_and_single_run_record_the_same(example_resources):
    per_partition = example_resources("per_partition")
    for day in DAYS:  # what a multi-run backfill launches: one run per partition
        result = dg.materialize(pipeline_assets, partition_key=day, resources=per_partition)
        assert result.success
        assert result.dagster_run.tags["dagster/partition"] == day

    single = example_resources("single_run")
    result = dg.materialize(
        pipeline_assets, resources=single,
        tags={"dagster/asset_partition_range_start": DAYS[0],
              "dagster/asset_partition_range_end": DAYS[-1]},
    )
    assert result.success
    for asset in ("cleaned_transcripts", *INFERRED):
        assert sorted(_materializations(result, asset)) == DAYS, asset

    for scope in INFERRED:
        # The single run recorded each row under its own day, exactly as the three runs did.
        pairs = _ledger_pairs(single, scope)
        assert pairs == _ledger_pairs(per_partition, scope)
        assert {partition for _, partition in pairs} == set(DAYS)
        records = single["llm"].ledger.records(scope=scope)
        assert set(records["run_id"]) == {result.run_id}

    for day in DAYS:
        for table in INFERRED:
            one_run = single["warehouse"].read_partition(table, day)
            own_run = per_partition["warehouse"].read_partition(table, day)
            assert list(one_run["call_id"]) == list(own_run["call_id"])
            assert set(one_run["call_date"]) == {day}
    summaries = single["llm"].ledger
    for day in DAYS:
        assert summaries.status_counts(day, "transcript_summaries")["ok"] > 50
