"""A Component's ``deadline`` attribute: a duration string in defs.yaml, meaning what the
factory's timedelta means (after the end of the partition's time window); a bad one refused
at load, saying how to write it."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm.components.attributes import parse_duration
from dagster_batchllm.testing import SimulatedEndpoint
from tests.dagster.defs_yaml import loaded_defs_yaml

MODEL = "sim-model"
DAYS = dg.DailyPartitionsDefinition(start_date="2026-01-01")


@dg.asset(partitions_def=DAYS)
def calls(context) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{context.partition_key} call {i}" for i in range(6)]})


@pytest.fixture
def sim():
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        yield sim


def attributes_for(sim, tmp_path, **more) -> dict:
    return {
        "name": "call_summaries", "source": "calls", "prompt": "Summarize: {text}",
        "model": MODEL, "output_column": "summary", "mode": "batch_api",
        "partitions_def": {"type": "daily", "start_date": "2026-01-01"},
        "resource": {
            "endpoints": [{"name": "openai", "base_url": sim.base_url, "models": [MODEL],
                           "api_key": "sk-batch", "batch_api": True}],
            "prices": {MODEL: {"input_per_mtok": 2.0, "output_per_mtok": 2.0}},
            "store_url": f"sqlite:///{tmp_path / 'ledger.db'}", "batch_poll_initial_s": 0.02},
        **more}


def _chain(error: BaseException | None) -> list[str]:
    found = []
    while error is not None:
        found.append(str(error))
        error = error.__cause__ or error.__context__
    return found


@pytest.mark.slow
def test_a_deadline_in_defs_yaml_is_the_time_after_the_partitions_window(sim, tmp_path):
    with loaded_defs_yaml("dagster_batchllm.BatchInferenceComponent",
                          attributes_for(sim, tmp_path, deadline="1d12h"),
                          "call_summaries") as (component, defs):
        assert component.deadline == "1d12h"
        asset = defs.get_assets_def("call_summaries")
        llm = defs.resources["llm"]
    assert asset.metadata_by_key[asset.key]["batchllm/deadline"].startswith(
        "1 day, 12:00:00 after the end of each partition's time window")
    yesterday = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date().isoformat()
    result = dg.materialize([calls, asset], partition_key=yesterday, resources={"llm": llm})
    assert result.success
    (event,) = result.asset_materializations_for_node("call_summaries")
    got = {k: getattr(v, "value", v) for k, v in event.metadata.items()}
    # 12:00 UTC tomorrow (the partition is yesterday): ahead, so all by batch.
    expected = DAYS.time_window_for_partition_key(yesterday).end + dt.timedelta(days=1, hours=12)
    assert got["batchllm/deadline/at"] == expected.timestamp()
    assert got["batchllm/deadline/status"] == "met"
    assert got["batchllm/deadline/rows_by_batch"] == 6 and got["batchllm/deadline/rows_online"] == 0
    assert got["batchllm/deadline/saving_share"] == pytest.approx(0.5, abs=1e-3)
    assert sim.stats(log=False)["requests"] == 0


def test_the_embedding_component_takes_a_deadline_too(sim, tmp_path):
    attributes = {
        "name": "call_vectors", "source": "calls", "input_column": "text", "model": "bge",
        "mode": "batch_api", "deadline": "90m", "resource": {
            "endpoints": [{"name": "openai", "base_url": sim.base_url,
                           "embedding_models": ["bge"], "api_key": "sk-batch",
                           "batch_api": True}]}}
    with loaded_defs_yaml("dagster_batchllm.BatchEmbeddingComponent", attributes,
                          "call_vectors") as (_component, defs):
        asset = defs.get_assets_def("call_vectors")
    assert asset.metadata_by_key[asset.key]["batchllm/deadline"].startswith("1:30:00 after")


@pytest.mark.parametrize(("deadline", "mode", "message"), [
    ("9 hours", "batch_api", "deadline '9 hours' is not a duration"),
    ("PT9H", "batch_api", "e.g. deadline: 9h"),
    ("9h", "online", "deadline= needs mode='batch_api'"),
])
def test_a_bad_deadline_in_defs_yaml_says_how_to_write_it(sim, tmp_path, deadline, mode,
                                                          message):
    with pytest.raises(Exception) as info, loaded_defs_yaml(
            "dagster_batchllm.BatchInferenceComponent",
            attributes_for(sim, tmp_path, deadline=deadline, mode=mode), "call_summaries"):
        pass
    assert any(message in text for text in _chain(info.value)), _chain(info.value)


def test_the_duration_grammar():
    assert parse_duration("x", "9h") == dt.timedelta(hours=9)
    assert parse_duration("x", "90m") == dt.timedelta(minutes=90)
    assert parse_duration("x", "1d2h30m15s") == dt.timedelta(days=1, hours=2, minutes=30,
                                                             seconds=15)
    assert parse_duration("x", None) is None
    for bad in ("", "h", "2h1d", "1.5h", "9"):
        with pytest.raises(dg.DagsterInvalidDefinitionError, match="x: deadline"):
            parse_duration("x", bad)
