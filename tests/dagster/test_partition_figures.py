"""What the UI shows for an inference asset is true per partition: a single-run backfill records
each partition's own rows, tokens, cost and failures, its checks are partitioned, and a rerun
served from the ledger keeps what the partition's answers cost."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.pipeline import build_transcript_summaries, pipeline_assets
from dagster_batchllm import Ledger, Price
from dagster_batchllm.factories.checks import CHECK_NAMES
from resources.warehouse import WarehouseIOManager, WarehouseResource

DAYS = ["2026-11-02", "2026-11-03", "2026-11-04"]  # 3, 0 and 3 blank transcripts
SUMMARIES = "transcript_summaries"
PROMPT_PRICE, COMPLETION_PRICE = 1.5, 6.0  # USD per 1M tokens
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def resources(sim, make_llm_resource, tmp_path):
    warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}")
    llm = make_llm_resource(sim, default_model="sim-model", prices={"sim-model": Price(
        input_per_mtok=PROMPT_PRICE, output_per_mtok=COMPLETION_PRICE)})
    return {"llm": llm, "warehouse": warehouse,
            "io_manager": WarehouseIOManager(warehouse=warehouse)}


def _backfill(resources, instance) -> dg.ExecuteInProcessResult:
    """What a single-run backfill of DAYS launches: one run over the range."""
    # The example warns above 5% failed rows (its data is messy on purpose); at 1% the days
    # with blank transcripts are marked.
    assets = [a for a in pipeline_assets if a.key != dg.AssetKey(SUMMARIES)]
    assets.append(build_transcript_summaries(warn_failed_rate=0.01))
    result = dg.materialize(assets, resources=resources, instance=instance, tags={
        "dagster/asset_partition_range_start": DAYS[0],
        "dagster/asset_partition_range_end": DAYS[-1]})
    assert result.success
    return result


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, dict]:
    return {m.partition: {k: v.value for k, v in m.metadata.items()}
            for m in result.asset_materializations_for_node(asset)}


def _cost(prompt_tokens: int, completion_tokens: int) -> float:
    return round((prompt_tokens * PROMPT_PRICE + completion_tokens * COMPLETION_PRICE) / 1e6, 6)


@pytest.mark.slow
def test_a_single_run_backfill_records_each_partitions_own_figures(resources, instance):
    result = _backfill(resources, instance)
    by_day = _metadata(result, SUMMARIES)
    assert sorted(by_day) == DAYS
    ledger = resources["llm"].ledger
    for day in DAYS:
        metadata = by_day[day]
        stored = resources["warehouse"].read_partition(SUMMARIES, day)
        failed = stored[stored["summary_error"].notna()]
        assert metadata["dagster/row_count"] == len(stored)
        assert metadata["batchllm/rows_failed"] == len(failed)
        assert metadata["batchllm/rows_succeeded"] == len(stored) - len(failed)
        # Blank transcripts: input errors, which no retry can fix.
        assert metadata["batchllm/rows_failed_unretryable"] == len(failed)

        records = ledger.records(day, SUMMARIES)
        prompt, completion = int(records["prompt_tokens"].sum()), int(
            records["completion_tokens"].sum())
        assert metadata["batchllm/run/requests"] == len(records)
        assert metadata["batchllm/run/prompt_tokens"] == prompt
        assert metadata["batchllm/run/completion_tokens"] == completion
        assert metadata["batchllm/run/cost_usd"] == pytest.approx(_cost(prompt, completion))
        assert metadata["batchllm/answers/prompt_tokens"] == prompt
        assert metadata["batchllm/sim-model/prompt_tokens"] == prompt
        assert metadata["batchllm/sim-model/cost_usd"] == pytest.approx(
            _cost(prompt, completion))
        [model_row] = metadata["batchllm/run/by_model"].records
        assert model_row.data["model"] == "sim-model"
        assert model_row.data["cost_usd"] == pytest.approx(_cost(prompt, completion))

        if len(failed):
            table = metadata["batchllm/failed_rows"]
            assert [r.data["call_id"] for r in table.records] == list(failed["call_id"])
            assert {r.data["error_type"] for r in table.records} == {"invalid_input"}
            assert not any(r.data["retryable"] for r in table.records)
            assert all(r.data["reason"].startswith("column 'transcript_text'")
                       for r in table.records)
            [errors] = metadata["batchllm/errors_by_type"].records
            assert errors.data == {"error_type": "invalid_input", "rows": len(failed),
                                   "retryable": False,
                                   "what_to_do": "a retry cannot fix these; fix the input"}
        else:
            assert "batchllm/failed_rows" not in metadata
    # The figures are each day's, not the run's totals.
    assert len({m["batchllm/run/prompt_tokens"] for m in by_day.values()}) == len(DAYS)


@pytest.mark.slow
def test_a_backfills_checks_are_evaluated_per_partition(resources, instance):
    result = _backfill(resources, instance)
    evaluations = [e for e in result.get_asset_check_evaluations()
                   if e.asset_key == dg.AssetKey(SUMMARIES)]
    assert sorted((e.partition, e.check_name) for e in evaluations) == sorted(
        (day, name) for day in DAYS for name in CHECK_NAMES)
    rate = {e.partition: e for e in evaluations if e.check_name == "failed_row_rate"}
    assert rate["2026-11-03"].passed
    for day in ("2026-11-02", "2026-11-04"):  # 3 of ~85 rows failed: above the 1% warning
        assert not rate[day].passed and rate[day].severity == dg.AssetCheckSeverity.WARN
        assert "a retry cannot fix these; fix the input" in rate[day].description
        assert rate[day].metadata["rows_a_retry_cannot_fix"].value == 3
    materializations = {r.partition_key: r.storage_id for r in instance.fetch_materializations(
        dg.AssetKey(SUMMARIES), limit=10).records}
    for evaluation in evaluations:  # each tied to its own partition's materialization
        assert (evaluation.target_materialization_data.storage_id
                == materializations[evaluation.partition])

    # In the instance: one result per partition, none left planned ("Skipped" in the UI) and
    # none without a partition.
    for name in CHECK_NAMES:
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(SUMMARIES), name), limit=20)
        assert sorted(r.partition for r in history) == DAYS
        assert {r.status.value for r in history} <= {"SUCCEEDED", "FAILED"}

    # A clean day run later does not turn the failed days green.
    again = dg.materialize(pipeline_assets, resources=resources, instance=instance,
                           partition_key="2026-11-03")
    assert again.success
    latest = {}
    for record in instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(SUMMARIES), "failed_row_rate"), limit=20):
        latest.setdefault(record.partition, record.status.value)
    assert latest == {"2026-11-02": "FAILED", "2026-11-03": "SUCCEEDED",
                      "2026-11-04": "FAILED"}


@pytest.mark.slow
def test_a_rerun_from_the_ledger_keeps_what_the_answers_cost(resources, instance, sim):
    day = DAYS[1]
    first = _metadata(dg.materialize(pipeline_assets, resources=resources, instance=instance,
                                     partition_key=day), SUMMARIES)[day]
    sim.reset_stats()
    rerun = _metadata(dg.materialize(pipeline_assets, resources=resources, instance=instance,
                                     partition_key=day), SUMMARIES)[day]
    assert sim.stats(log=False)["requests"] == 0
    assert first["batchllm/run/prompt_tokens"] > 0
    assert rerun["batchllm/run/requests"] == rerun["batchllm/run/prompt_tokens"] == 0
    assert rerun["batchllm/run/cost_usd"] == 0
    assert rerun["batchllm/rows_cached"] == first["batchllm/rows_succeeded"]
    for figure in ("batchllm/answers/count", "batchllm/answers/prompt_tokens",
                   "batchllm/answers/completion_tokens", "batchllm/answers/cost_usd",
                   "batchllm/sim-model/prompt_tokens", "batchllm/sim-model/cost_usd"):
        assert rerun[figure] == first[figure] > 0, figure
    assert first["batchllm/answers/prompt_tokens"] == first["batchllm/run/prompt_tokens"]


@pytest.mark.slow
def test_each_partition_logs_its_summary_line(resources, instance):
    result = _backfill(resources, instance)
    lines = [entry.user_message for entry in instance.all_logs(result.run_id)
             if entry.user_message.startswith(f"{SUMMARIES} partition ")]
    assert [line.split(",")[0] for line in lines] == [f"{SUMMARIES} partition {d}" for d in DAYS]
    by_day = _metadata(result, SUMMARIES)
    for day, line in zip(DAYS, lines, strict=True):
        figures = by_day[day]
        tokens = figures["batchllm/run/prompt_tokens"] + figures["batchllm/run/completion_tokens"]
        assert "model sim-model" in line
        assert f"{figures['dagster/row_count']:,} rows" in line
        assert f"{tokens:,} tokens, ${figures['batchllm/run/cost_usd']:.6f}" in line
    assert "invalid_input 3 - a retry cannot fix these; fix the input" in lines[0]


@pytest.mark.slow
def test_an_unpriced_model_says_how_to_price_it(sim, make_llm_resource, tmp_path, instance):
    warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}")
    resources = {"llm": make_llm_resource(sim, default_model="sim-model"), "warehouse": warehouse,
                 "io_manager": WarehouseIOManager(warehouse=warehouse)}
    result = dg.materialize(pipeline_assets, resources=resources, instance=instance,
                            partition_key=DAYS[1])
    metadata = _metadata(result, SUMMARIES)[DAYS[1]]
    assert "batchllm/run/cost_usd" not in metadata and "batchllm/answers/cost_usd" not in metadata
    assert ("No price for sim-model: set prices={model: Price(input_per_mtok=..., "
            "output_per_mtok=...)} on the resource" in metadata["batchllm/cost_note"])
    assert metadata["batchllm/answers/prompt_tokens"] > 0


def test_answers_served_from_another_partition_count_what_they_cost_there(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")

    def record(key: str, partition: str, prompt: int, completion: int, status: str = "ok"):
        return {"request_key": key, "scope": SUMMARIES, "partition_key": partition,
                "model": "m", "status": status, "response": "x", "error": None,
                "error_type": None, "prompt_tokens": prompt, "completion_tokens": completion,
                "attempts": 1, "run_id": "r"}

    try:
        # k1 and k2 paid for in partition a; b holds copies served from the ledger (0 tokens).
        ledger.upsert([record("k1", "a", 10, 5), record("k2", "a", 20, 7),
                       record("k1", "b", 0, 0), record("k2", "b", 0, 0),
                       record("k3", "b", 0, 0, status="failed")])
        assert ledger.answer_tokens(["k1", "k2", "k3", "k1"]) == {
            "m": {"answers": 2, "prompt_tokens": 30, "completion_tokens": 12}}
        assert ledger.answer_tokens([]) == {}
    finally:
        ledger.dispose()
