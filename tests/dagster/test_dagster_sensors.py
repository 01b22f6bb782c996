"""The retry-partitions sensor (after real runs with injected failures, and its delays and round
caps) and the new-data sensor, evaluated with ``build_sensor_context``."""

from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from dagster._core.test_utils import create_run_for_test

from assets.pipeline import cleaned_transcripts
from dagster_batchllm import (
    BatchInferenceResource,
    Ledger,
    build_inference_asset,
    build_new_data_sensor,
    build_retry_partitions_sensor,
)
from dagster_batchllm.sensors import retry_partitions as sensors_module
from resources.warehouse import WarehouseResource

PARTS = dg.StaticPartitionsDefinition(["a", "b", "c"])
ROWS = 10
pytestmark = pytest.mark.timeout(90)


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.multi_run(1))
def calls(context) -> pd.DataFrame:
    part = context.partition_key
    return pd.DataFrame({"text": [f"partition {part}, call {i}" for i in range(ROWS)]})


summaries = build_inference_asset(
    name="summaries", source=calls, prompt="Summarize: {text}", output_column="summary",
    max_tokens=16, partitions_def=PARTS,
)
SCOPE = "summaries"


@pytest.fixture
def clock(monkeypatch):
    """The sensors' notion of now, moved by hand."""
    now = {"t": 1_000_000.0}
    monkeypatch.setattr(sensors_module, "_now", lambda: now["t"])
    return now


def _evaluate(sensor: dg.SensorDefinition, instance, cursor: str | None) -> dg.SensorResult:
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, dg.SensorResult)
    return result


def _requested(result: dg.SensorResult) -> list[tuple[str, str]]:
    return [(r.partition_key, r.tags["batchllm/retry_round"]) for r in result.run_requests]


def _skip(result: dg.SensorResult) -> str:
    assert not result.run_requests
    return result.skip_reason.skip_message


# -- retry partitions ---------------------------------------------------------------------------


@pytest.mark.slow
def test_retry_sensor_requests_exactly_the_incomplete_partitions_and_the_rerun_pays_only_for_them(
    sim, make_llm_resource, instance,
):
    llm = make_llm_resource(sim)

    def materialize(partition: str, resource: BatchInferenceResource, **kwargs):
        result = dg.materialize([calls, summaries], partition_key=partition, instance=instance,
                                resources={"llm": resource}, **kwargs)
        assert result.success
        return result

    materialize("a", llm)
    sim.script(400, 400, 400)  # three of b's rows fail for good
    materialize("b", llm)
    # c runs with a token budget that defers some rows: a later run will send them
    materialize("c", make_llm_resource(sim, token_budget=120))
    needing = llm.ledger.partitions_needing_retry(scope=SCOPE)
    assert needing["b"] == {"failed": 3, "deferred": 0}
    deferred = needing["c"]["deferred"]
    assert set(needing) == {"b", "c"} and deferred > 0

    sensor = build_retry_partitions_sensor(summaries, resource=llm, base_delay_s=0)
    result = _evaluate(sensor, instance, None)
    assert _requested(result) == [("b", "1"), ("c", "1")]
    for request in result.run_requests:
        assert request.asset_selection == [summaries.key]
        assert request.tags["batchllm/retry"] == "true"

    sim.reset_stats()
    for request in result.run_requests:  # what the daemon launches for these requests
        materialize(request.partition_key, llm, selection=request.asset_selection,
                    tags=request.tags)
    stats = sim.stats(log=False)
    assert stats["requests"] == stats["ok"] == 3 + deferred  # only the missing rows are paid
    for partition in PARTS.get_partition_keys():
        assert llm.ledger.status_counts(partition, SCOPE)["ok"] == ROWS

    after = _evaluate(sensor, instance, result.cursor)
    assert "No partition of summaries has failed or deferred rows" in _skip(after)
    assert json.loads(after.cursor)["partitions"] == {}


def _record(partition: str, status: str, key: str = "k1") -> dict:
    return {"request_key": key, "scope": SCOPE, "partition_key": partition, "model": "sim-model",
            "status": status, "response": "x" if status == "ok" else None,
            "error": None if status == "ok" else "server_error: boom",
            "error_type": None if status == "ok" else "server_error", "attempts": 1,
            "run_id": "r"}


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield ledger
    ledger.dispose()


def test_retry_rounds_are_spaced_out_capped_and_reported(ledger, instance, clock, capfd):
    ledger.upsert([_record("b", "failed")])
    sensor = build_retry_partitions_sensor(summaries, store_url=ledger.url, base_delay_s=60,
                                           max_delay_s=100, max_rounds=3)
    cursor = None

    def tick(at: float) -> dg.SensorResult:
        nonlocal cursor
        clock["t"] = 1_000_000.0 + at
        result = _evaluate(sensor, instance, cursor)
        cursor = result.cursor
        return result

    assert "b (round 1 in 60 s)" in _skip(tick(0))  # first sight starts the clock
    assert "round 1 in 1 s" in _skip(tick(59))
    assert _requested(tick(60)) == [("b", "1")]
    assert "b (round 2 in 99 s)" in _skip(tick(61))  # 120 s, capped by max_delay_s
    assert _requested(tick(160)) == [("b", "2")]
    assert _skip(tick(259))
    assert _requested(tick(260)) == [("b", "3")]

    capfd.readouterr()
    exhausted = tick(261)
    assert "gave up after the last round (still incomplete): b" in _skip(exhausted)
    assert "WARNING - summaries partition b still has 1 failed" in capfd.readouterr().err
    [observation] = exhausted.asset_events
    assert observation.partition == "b"
    assert observation.metadata["batchllm/retry_exhausted"].value is True
    assert observation.metadata["batchllm/rows_failed"].value == 1
    later = tick(100_000)  # never again, and reported once
    assert "gave up" in _skip(later) and not later.asset_events

    ledger.upsert([_record("b", "ok")])  # fixed by hand: the partition leaves the cursor
    assert "No partition" in _skip(tick(100_001))
    assert json.loads(cursor)["partitions"] == {}


def test_partitions_with_a_run_in_progress_wait_for_it(ledger, instance, clock):
    ledger.upsert([_record("a", "deferred"), _record("c", "failed")])
    sensor = build_retry_partitions_sensor(summaries, store_url=ledger.url, base_delay_s=10)
    single = create_run_for_test(instance, status=dg.DagsterRunStatus.STARTED,
                                 tags={"dagster/partition": "a"},
                                 asset_selection=frozenset({summaries.key}))
    create_run_for_test(instance, status=dg.DagsterRunStatus.NOT_STARTED,
                        tags={"dagster/asset_partition_range_start": "b",
                              "dagster/asset_partition_range_end": "c"})
    elsewhere = create_run_for_test(instance, status=dg.DagsterRunStatus.STARTED,
                                    tags={"dagster/partition": "c"},
                                    asset_selection=frozenset({dg.AssetKey("other")}))
    assert elsewhere  # a run of another asset in the same partition does not count

    first = _evaluate(sensor, instance, None)
    assert "a (run in progress)" in _skip(first) and "c (run in progress)" in _skip(first)
    clock["t"] += 1_000
    second = _evaluate(sensor, instance, first.cursor)
    assert "a (run in progress)" in _skip(second) and "c (run in progress)" in _skip(second)

    for run in instance.get_runs():
        instance.report_run_failed(run)  # all finished now
    clock["t"] += 5  # the delay counts from the end of the run, not from the first sight
    waiting = _evaluate(sensor, instance, second.cursor)
    assert "round 1 in" in _skip(waiting)
    clock["t"] += 10
    assert _requested(_evaluate(sensor, instance, waiting.cursor)) == [("a", "1"), ("c", "1")]
    assert single.run_id


def test_unknown_partition_keys_in_the_ledger_are_reported_not_requested(ledger, instance,
                                                                         clock):
    ledger.upsert([_record("b", "failed"), _record("gone", "failed")])
    sensor = build_retry_partitions_sensor(summaries, store_url=ledger.url, base_delay_s=0)
    result = _evaluate(sensor, instance, None)
    assert _requested(result) == [("b", "1")]
    assert json.loads(result.cursor)["ignored"] == ["gone"]


def test_retry_sensor_reads_nothing_before_the_ledger_exists(tmp_path, instance):
    sensor = build_retry_partitions_sensor(
        summaries, store_url=f"sqlite:///{tmp_path / 'not_yet.db'}")
    assert "No partition" in _skip(_evaluate(sensor, instance, None))
    assert not (tmp_path / "not_yet.db").exists()


def test_retry_sensor_definition_errors_say_what_to_fix(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    unpartitioned = build_inference_asset(name="plain", source="calls", prompt="{text}",
                                          output_column="out")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="no partitions_def"):
        build_retry_partitions_sensor(unpartitioned, store_url=url)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="resource= .* or store_url="):
        build_retry_partitions_sensor(summaries)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="in memory"):
        build_retry_partitions_sensor(summaries, resource=BatchInferenceResource(store_url=None))
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="in memory"):
        build_retry_partitions_sensor(summaries, store_url="sqlite://")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="max_rounds"):
        build_retry_partitions_sensor(summaries, store_url=url, max_rounds=0)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="base_delay_s <= max_delay_s"):
        build_retry_partitions_sensor(summaries, store_url=url, base_delay_s=10, max_delay_s=1)
    sensor = build_retry_partitions_sensor(summaries, store_url=url, also_materialize=["next"])
    assert sensor.name == "summaries_retry_partitions"
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED


# -- new source data ----------------------------------------------------------------------------


def _calls(*days: str) -> pd.DataFrame:
    return pd.DataFrame({"call_id": [f"C{i}" for i in range(len(days))],
                         "call_timestamp": [f"{d} 10:00:00" for d in days],
                         "transcript_raw_text": ["hello"] * len(days)})


def test_new_data_sensor_requests_the_partitions_that_got_rows(tmp_path, instance):
    warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / 'wh.db'}", seed_source=False)
    sensor = build_new_data_sensor(
        cleaned_transcripts, url=warehouse.url, table="call_center_transcripts",
        cursor_column="ingest_id", partition_column="call_date",
    )

    missing = _evaluate(sensor, instance, None)  # no database yet: nothing seen, nothing made
    assert "no rows yet" in _skip(missing) and missing.cursor is None
    assert not (tmp_path / "wh.db").exists()

    warehouse.append_rows("call_center_transcripts", _calls("2026-11-01", "2026-11-02"))
    started = _evaluate(sensor, instance, None)  # rows already there are history, not news
    assert "Started at cursor 2" in _skip(started)
    assert "No new rows" in _skip(_evaluate(sensor, instance, started.cursor))

    warehouse.append_rows("call_center_transcripts",
                          _calls("2026-11-03", "2026-11-05", "2026-11-03"))
    result = _evaluate(sensor, instance, started.cursor)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [
        ("2026-11-03", "2026-11-03@5"), ("2026-11-05", "2026-11-05@5")]
    assert result.run_requests[0].tags["batchllm/new_data"] == "true"
    again = _evaluate(sensor, instance, started.cursor)  # a lost cursor update: same run keys
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in result.run_requests]
    assert "No new rows" in _skip(_evaluate(sensor, instance, result.cursor))

    warehouse.append_rows("call_center_transcripts", _calls("2031-01-01"))
    outside = _evaluate(sensor, instance, result.cursor)
    assert "No new rows in any partition" in _skip(outside)
    assert json.loads(outside.cursor) == {"cursor": 6}


def test_new_data_sensor_with_a_function_and_an_unpartitioned_target(instance):
    arrivals = [("2026-11-02", 1), ("2026-11-04", 2), ("2026-11-04", 3)]

    def new_rows_since(cursor):
        new = [(day, i) for day, i in arrivals if cursor is None or i > cursor]
        return [day for day, _ in new], max((i for _, i in new), default=cursor)

    sensor = build_new_data_sensor(cleaned_transcripts, new_rows_since=new_rows_since,
                                   skip_existing_rows=False, name="calls_arrive")
    first = _evaluate(sensor, instance, None)
    assert [r.partition_key for r in first.run_requests] == ["2026-11-02", "2026-11-04"]
    assert sensor.name == "calls_arrive"

    @dg.asset
    def report() -> None: ...

    whole = build_new_data_sensor(report, new_rows_since=new_rows_since)
    started = _evaluate(whole, instance, None)
    assert not started.run_requests
    arrivals.append(("2026-11-09", 4))
    [request] = _evaluate(whole, instance, started.cursor).run_requests
    assert request.partition_key is None and request.run_key == "new-data@4"


def test_new_data_sensor_over_sql_runs_an_unpartitioned_target_when_rows_arrive(tmp_path,
                                                                               instance):
    url = f"sqlite:///{tmp_path / 'events.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE events (loaded_at TEXT)"))
        conn.execute(sa.text("INSERT INTO events VALUES ('2026-11-01T10:00:00')"))

    @dg.asset
    def report() -> None: ...

    sensor = build_new_data_sensor(report, url=url, table="events", cursor_column="loaded_at")
    started = _evaluate(sensor, instance, None)
    assert "Started at cursor '2026-11-01T10:00:00'" in _skip(started)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO events VALUES ('2026-11-02T08:30:00')"))
    [request] = _evaluate(sensor, instance, started.cursor).run_requests
    assert request.run_key == "new-data@2026-11-02T08:30:00"
    engine.dispose()


def test_new_data_sensor_definition_errors_say_what_to_fix():
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="exactly one"):
        build_new_data_sensor(cleaned_transcripts)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="partition_column="):
        build_new_data_sensor(cleaned_transcripts, url="sqlite://", table="t",
                              cursor_column="id")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="not a plain SQL identifier"):
        build_new_data_sensor(cleaned_transcripts, url="sqlite://", table="t; drop",
                              cursor_column="id", partition_column="day")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="asset job"):
        build_new_data_sensor("cleaned_transcripts", new_rows_since=lambda c: ([], c))


# -- failures a retry cannot fix ----------------------------------------------------------------


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.multi_run(1))
def calls_with_blanks(context) -> pd.DataFrame:
    texts = [f"partition {context.partition_key}, call {i}" for i in range(ROWS)]
    if context.partition_key == "b":
        texts[2] = texts[5] = None  # input errors: nothing is sent for them
    return pd.DataFrame({"text": texts})


blank_summaries = build_inference_asset(
    name="blank_summaries", source=calls_with_blanks, prompt="Summarize: {text}",
    output_column="summary", max_tokens=16, partitions_def=PARTS,
)
FIX_THE_INPUT = "a retry cannot fix these; fix the input"


@pytest.mark.slow
def test_input_errors_are_reported_not_retried_in_the_checks_words(sim, make_llm_resource,
                                                                  instance):
    llm = make_llm_resource(sim)
    for partition in PARTS.get_partition_keys():
        result = dg.materialize([calls_with_blanks, blank_summaries], partition_key=partition,
                                instance=instance, resources={"llm": llm})
        assert result.success
    [check] = [e for e in result.get_asset_check_evaluations()
               if e.check_name == "failed_row_rate"]
    assert check.partition == "c" and check.passed
    [b_check] = [r for r in instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(blank_summaries.key, "failed_row_rate"), limit=10)
        if r.partition == "b"]
    assert FIX_THE_INPUT in b_check.event.dagster_event.event_specific_data.description

    sensor = build_retry_partitions_sensor(blank_summaries, resource=llm, base_delay_s=0)
    skip = _skip(_evaluate(sensor, instance, None))
    assert skip == ("No partition of blank_summaries has rows a retry can fix. Not retried, "
                    f"partitions with failed rows: b: invalid_input 2 - {FIX_THE_INPUT}.")


def test_ledger_failures_a_retry_cannot_fix_are_not_retried(ledger, instance, clock):
    def failed(partition: str, key: str, error_type: str) -> dict:
        return {**_record(partition, "failed", key), "error_type": error_type,
                "error": f"{error_type}: too long"}

    ledger.upsert([failed("a", "k1", "context_length_exceeded"),
                   failed("b", "k2", "context_length_exceeded"), failed("b", "k3", "timeout")])
    sensor = build_retry_partitions_sensor(summaries, store_url=ledger.url, base_delay_s=0)
    result = _evaluate(sensor, instance, None)
    assert _requested(result) == [("b", "1")]  # its timeout may pass; a's row never will

    ledger.upsert([{**_record("b", "ok", "k3")}])  # the retry answered b's timed-out row
    skip = _skip(_evaluate(sensor, instance, result.cursor))
    assert skip == ("No partition of summaries has rows a retry can fix. Not retried, "
                    f"partitions with failed rows: a: context_length_exceeded 1 - "
                    f"{FIX_THE_INPUT}; b: context_length_exceeded 1 - {FIX_THE_INPUT}.")
