"""A partitioned asset with deadline= (mode="batch_api"): the deadline resolved per partition,
the partition's batch/online figures in its materialization, and the batch-collect sensor
launching the switch run when the recorded switch time comes; against the simulated batch API,
a real Dagster instance and a real SQLite ledger.

Each test first answers a few rows online in another scope (as a past partition would have),
so the online rate comes from the ledger's measured latency (see test_deadline.py)."""

from __future__ import annotations

import datetime as dt
import time

import dagster as dg
import pandas as pd
import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, calibrated, frame

from dagster_batchllm import (
    BatchInferenceResource,
    Endpoint,
    Price,
    build_batch_collect_sensor,
    build_inference_asset,
)
from dagster_batchllm.core.batch.deadline import MARGIN_S, WAKE_S

ROWS = 40
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def instance(tmp_path):
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    yield instance
    instance.dispose()


def resource_for(sim, store_url: str) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="openai", base_url=sim.base_url, models=[MODEL],
                            api_key=sim.settings.api_key, batch_api=True)],
        prices={MODEL: Price(input_per_mtok=2.0, output_per_mtok=2.0)},
        store_url=store_url, batch_poll_initial_s=0.02, batch_poll_max_s=0.2,
        ledger_flush_interval_s=0.05, progress_interval_s=60.0)


def source_for(partitions_def: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    @dg.asset(name="calls", partitions_def=partitions_def)
    def calls(context) -> pd.DataFrame:
        return frame(ROWS, context.partition_key)

    return calls


def figures_of(instance, key: str, partition: str) -> dict:
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]),
        limit=1).records
    return {k: getattr(v, "value", v)
            for k, v in record.asset_materialization.metadata.items()}


@pytest.mark.slow
def test_a_daily_partition_answered_by_its_deadline_shows_batch_and_online_in_its_metadata(
        quick, make_client, store_url, instance):
    calibrated(make_client, quick)
    # Lines answered at an even pace over 60 s: by the switch (about 8 s in) a few of them.
    quick.configure(batch_in_progress_s=60.0)
    days = dg.DailyPartitionsDefinition(start_date="2026-01-01")
    yesterday = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date().isoformat()
    window_end = days.time_window_for_partition_key(yesterday).end
    set_at = []

    def soon(partition_key: str) -> dt.timedelta:
        """The time after the end of the day's window (as timedelta(hours=9) is) that falls
        8 s past the switch, from when the run asks (a slow start takes none of it)."""
        set_at.append(time.time() + MARGIN_S + 8)
        return dt.datetime.fromtimestamp(set_at[-1], dt.timezone.utc) - window_end

    calls = source_for(days)
    summaries = build_inference_asset(
        name="summaries", source=calls, prompt=PROMPT, model=MODEL, output_column="summary",
        partitions_def=days, mode="batch_api", wait=True, deadline=soon)

    result = dg.materialize([calls, summaries], partition_key=yesterday, instance=instance,
                            resources={"llm": resource_for(quick, store_url)})
    (deadline,) = set_at
    assert result.success and time.time() <= deadline

    got = figures_of(instance, "summaries", yesterday)
    assert got["batchllm/rows_succeeded"] == ROWS and got["batchllm/rows_deferred"] == 0
    assert got["batchllm/deadline/at"] == pytest.approx(deadline, abs=1)  # whole seconds
    assert got["batchllm/deadline/finished_at"] <= got["batchllm/deadline/at"]
    assert got["batchllm/deadline/met"] is True and got["batchllm/deadline/status"] == "met"
    by_batch, online = got["batchllm/deadline/rows_by_batch"], got["batchllm/deadline/rows_online"]
    assert 0 < by_batch < ROWS and by_batch + online == ROWS
    assert online == quick.stats(log=False)["requests"]  # each online row sent once
    assert got["batchllm/deadline/switched_online_at"] <= got["batchllm/deadline/at"]
    assert got["batchllm/deadline/duplicate_rows"] == 0
    assert got["batchllm/deadline/duplicate_cost_usd"] == 0
    # Paid: the batch's rows at half, the rest at the online price; against all online.
    paid, all_online = (got["batchllm/deadline/cost_usd"],
                        got["batchllm/deadline/all_online_cost_usd"])
    assert paid == got["batchllm/run/cost_usd"] and all_online * 0.5 < paid < all_online
    assert got["batchllm/deadline/saving_share"] == pytest.approx(1 - paid / all_online,
                                                                  abs=1e-4)


@pytest.mark.slow
def test_the_sensor_launches_the_switch_run_when_the_recorded_switch_time_comes(
        held, make_client, store_url, instance):
    calibrated(make_client, held)
    held.configure(batch_cancelling_s=0.0)  # a batch stalled for good: it never answers
    parts = dg.StaticPartitionsDefinition(["p1", "p2"])
    calls = source_for(parts)
    # No time window: from the run's start; the switch comes about 8 s after it.
    summaries = build_inference_asset(
        name="summaries", source=calls, prompt=PROMPT, model=MODEL, output_column="summary",
        partitions_def=parts, mode="batch_api", wait=False,
        deadline=dt.timedelta(seconds=MARGIN_S + WAKE_S + 8))
    llm = resource_for(held, store_url)
    assert dg.materialize([calls, summaries], partition_key="p1", instance=instance,
                          resources={"llm": llm}).success
    first = figures_of(instance, "summaries", "p1")
    assert first["batchllm/rows_deferred"] == ROWS and first["batchllm/deadline/met"] is False
    assert first["batchllm/deadline/status"] == "pending"
    switch_at = book_of(make_client(held)).switch_times("summaries")["p1"]
    assert first["batchllm/deadline/switch_planned_at"] == pytest.approx(switch_at, abs=1)

    sensor = build_batch_collect_sensor(summaries, resource=llm)
    early = sensor(dg.build_sensor_context(instance=instance))
    assert not early.run_requests and "online at" in early.skip_reason.skip_message

    time.sleep(max(0.0, switch_at - time.time()) + 0.1)
    due = sensor(dg.build_sensor_context(instance=instance))
    (request,) = due.run_requests
    assert request.partition_key == "p1" and request.tags == {"batchllm/deadline": "true"}
    assert request.run_key == f"p1|deadline|{switch_at:.3f}"  # one run per recorded time

    # The sensor's run keeps the first run's deadline (it does not move with each run).
    assert dg.materialize([calls, summaries], partition_key="p1", instance=instance,
                          resources={"llm": llm}, tags=request.tags).success
    done = figures_of(instance, "summaries", "p1")
    assert done["batchllm/deadline/at"] == first["batchllm/deadline/at"]
    assert done["batchllm/rows_succeeded"] == ROWS and done["batchllm/rows_deferred"] == 0
    assert done["batchllm/deadline/rows_online"] == ROWS
    assert done["batchllm/deadline/status"] == "met"
    assert done["batchllm/deadline/switched_online_at"] <= done["batchllm/deadline/at"]
    assert held.stats(log=False)["requests"] == ROWS and batch_stats(held)["batches_created"] == 1
    after = sensor(dg.build_sensor_context(instance=instance))
    assert not after.run_requests
    assert "No partition of summaries waits for a batch" in after.skip_reason.skip_message


@pytest.mark.slow
def test_a_switch_run_that_finds_the_switch_not_due_records_a_new_time_and_waits_on(
        held, make_client, store_url, instance):
    calibrated(make_client, held)
    parts = dg.StaticPartitionsDefinition(["p1"])
    calls = source_for(parts)
    summaries = build_inference_asset(
        name="summaries", source=calls, prompt=PROMPT, model=MODEL, output_column="summary",
        partitions_def=parts, mode="batch_api", wait=False, deadline=dt.timedelta(hours=1))
    llm = resource_for(held, store_url)
    assert dg.materialize([calls, summaries], partition_key="p1", instance=instance,
                          resources={"llm": llm}).success
    book = book_of(make_client(held))
    # An earlier estimate (the endpoints measured slower then): its time has come.
    earlier = time.time() - 1
    book.set_switch_at("summaries", "p1", earlier)
    sensor = build_batch_collect_sensor(summaries, resource=llm)
    (request,) = sensor(dg.build_sensor_context(instance=instance)).run_requests
    assert request.run_key == f"p1|deadline|{earlier:.3f}"

    assert dg.materialize([calls, summaries], partition_key="p1", instance=instance,
                          resources={"llm": llm}, tags=request.tags).success
    got = figures_of(instance, "summaries", "p1")
    assert got["batchllm/rows_deferred"] == ROWS and got["batchllm/deadline/status"] == "pending"
    assert held.stats(log=False)["requests"] == 0  # nothing went online
    later = book.switch_times("summaries")["p1"]
    assert later > time.time() + 3000  # about an hour less the online need and margins
    waiting = sensor(dg.build_sensor_context(instance=instance))
    assert not waiting.run_requests and "online at" in waiting.skip_reason.skip_message


def test_the_time_dimension_of_multi_partitions_sets_the_deadline_of_a_function(
        quick, store_url, instance):
    days = dg.DailyPartitionsDefinition(start_date="2026-01-01")
    multi = dg.MultiPartitionsDefinition({"day": days,
                                          "region": dg.StaticPartitionsDefinition(["eu"])})
    yesterday = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date().isoformat()
    key = dg.MultiPartitionKey({"day": yesterday, "region": "eu"})
    asked = []

    def by_region(partition_key: str) -> dt.timedelta:
        asked.append(partition_key)
        return dt.timedelta(days=2)

    calls = source_for(multi)
    summaries = build_inference_asset(
        name="summaries", source=calls, prompt=PROMPT, model=MODEL, output_column="summary",
        partitions_def=multi, mode="batch_api", deadline=by_region)
    assert dg.materialize([calls, summaries], partition_key=key, instance=instance,
                          resources={"llm": resource_for(quick, store_url)}).success
    got = figures_of(instance, "summaries", key)
    end = days.time_window_for_partition_key(yesterday).end
    assert asked == [key] and got["batchllm/deadline/at"] == (end + dt.timedelta(days=2)
                                                             ).timestamp()
    assert got["batchllm/deadline/rows_by_batch"] == ROWS and got["batchllm/deadline/met"]


def test_a_deadline_without_batch_mode_or_of_the_wrong_kind_is_refused_at_definition():
    def build(**kwargs):
        return build_inference_asset(name="s", source="calls", prompt=PROMPT, model=MODEL,
                                     **kwargs)

    with pytest.raises(dg.DagsterInvalidDefinitionError,
                       match=r"build_inference_asset\('s'\): deadline= needs mode='batch_api'"):
        build(deadline=dt.timedelta(hours=9))
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="datetime.timedelta"):
        build(mode="batch_api", deadline="09:00")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="must not be negative"):
        build(mode="batch_api", deadline=dt.timedelta(hours=-1))
    from dagster_batchllm import build_embedding_asset

    with pytest.raises(dg.DagsterInvalidDefinitionError, match="needs mode='batch_api'"):
        build_embedding_asset(name="v", source="calls", input_column="text",
                              deadline=dt.datetime(2030, 1, 1, 9))
    per_day = build(mode="batch_api", deadline=lambda key: dt.timedelta(hours=9))
    assert "per partition" in per_day.metadata_by_key[per_day.key]["batchllm/deadline"]
