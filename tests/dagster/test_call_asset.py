"""A fifth job as an asset: build_call_asset runs any registered job's call with the body every
factory shares (partitions, per-partition figures, checks, the ledger, the retry sensor), online
and through the batch API, with nothing written for that job but its call and task."""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import build_call_asset, build_retry_partitions_sensor
from dagster_batchllm.testing import SimulatedEndpoint
from tests.reverse_job import MODEL, ReverseCall, Reverser, TextCall


@dataclass(frozen=True)
class Unregistered(TextCall):
    """A call whose task nobody registered."""


PARTS = dg.StaticPartitionsDefinition(["a", "b"])
pytestmark = pytest.mark.timeout(120)


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.multi_run(1))
def texts(context) -> pd.DataFrame:
    part = context.partition_key
    return pd.DataFrame({"text_id": [f"{part}{i}" for i in range(4)],
                         "text": [f"{part} one", f"{part} two", None, f"{part} one"]})


reversed_texts = build_call_asset(name="reversed_texts", source=texts,
                                  call=ReverseCall(column="text"), partitions_def=PARTS,
                                  key_columns=["text_id"], warn_failed_rate=0.3,
                                  error_failed_rate=0.5)


@pytest.fixture
def sim():
    with SimulatedEndpoint(responder=Reverser(), models=(MODEL,)) as endpoint:
        yield endpoint


@pytest.fixture
def llm(sim, make_llm_resource):
    return make_llm_resource(sim, max_attempts=1)


def _figures(result: dg.ExecuteInProcessResult, node: str = "reversed_texts") -> dict:
    [event] = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in event.metadata.items()}


@pytest.mark.slow
def test_a_new_jobs_asset_answers_each_partition_with_its_figures_and_checks(llm, sim,
                                                                             instance):
    result = dg.materialize([texts, reversed_texts], instance=instance, resources={"llm": llm},
                            partition_key="a")
    assert result.success
    table = result.output_for_node("reversed_texts")
    assert table["reversed"].tolist() == ["eno a", "owt a", None, "eno a"]
    assert table["reversed_error"].notna().tolist() == [False, False, True, False]
    figures = _figures(result)
    assert figures["dagster/row_count"] == 4 and figures["batchllm/rows_succeeded"] == 3
    assert figures["batchllm/rows_failed"] == 1 and figures["batchllm/run/requests"] == 2
    assert figures["batchllm/run/stats"]["deduplicated"] == 1
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert all(c.passed for c in checks.values())  # 1 failed row of 4 is under 0.3
    assert sim.stats(log=False)["requests"] == 2
    assert llm.ledger.status_counts("a", "reversed_texts")["ok"] == 2

    again = dg.materialize([texts, reversed_texts], instance=instance, resources={"llm": llm},
                           partition_key="a")
    assert again.success and sim.stats(log=False)["requests"] == 2  # the ledger answered
    assert _figures(again)["batchllm/rows_cached"] == 3


@pytest.mark.slow
def test_the_retry_sensor_reruns_a_new_jobs_failed_partition(llm, sim, instance):
    sim.script(500)  # the first request of partition b fails; no retries here
    assert dg.materialize([texts, reversed_texts], instance=instance, resources={"llm": llm},
                          partition_key="b").success
    sensor = build_retry_partitions_sensor(reversed_texts, resource=llm, base_delay_s=0)
    requested = sensor(dg.build_sensor_context(instance=instance))
    [request] = requested.run_requests
    assert request.partition_key == "b"
    rerun = dg.materialize([texts, reversed_texts], instance=instance, resources={"llm": llm},
                           partition_key="b", selection=request.asset_selection,
                           tags=request.tags)
    assert rerun.success
    assert rerun.output_for_node("reversed_texts")["reversed"].tolist()[:2] == ["eno b",
                                                                                "owt b"]
    assert sim.stats(log=False)["requests"] == 3  # 2, then only the failed one again


@pytest.mark.slow
def test_a_new_jobs_asset_goes_through_the_batch_api(sim, make_llm_resource, instance):
    llm = make_llm_resource(sim, endpoint_kwargs={"batch_api": True}, max_attempts=1)
    batched = build_call_asset(name="reversed_by_batch", source=texts,
                               call=ReverseCall(column="text"), partitions_def=PARTS,
                               mode="batch_api")
    result = dg.materialize([texts, batched], instance=instance, resources={"llm": llm},
                            partition_key="a")
    assert result.success
    assert result.output_for_node("reversed_by_batch")["reversed"].tolist() == [
        "eno a", "owt a", None, "eno a"]
    stats = sim.stats(log=False)
    assert stats["batches"]["batches_created"] == 1 and stats["requests"] == 0
    assert next(iter(batched.specs)).metadata["batchllm/mode"] == "batch_api"


def test_the_asset_says_what_it_sends_and_refuses_what_cannot_run():
    spec = next(iter(reversed_texts.specs))
    assert spec.description.startswith("Batch job `reverse` with model `reverser`: reads `text`")
    assert spec.code_version == ReverseCall(column="text").code_version
    assert spec.metadata["batchllm/task"] == "reverse"
    with pytest.raises(dg.DagsterInvalidDefinitionError, match=r"@register_task\(Unregistered"):
        build_call_asset(name="x", source=texts, call=Unregistered())
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="build_inference_asset"):
        build_call_asset(name="x", source=texts, call={"prompt": "{text}"})
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="mode must be one of"):
        build_call_asset(name="x", source=texts, call=ReverseCall(), mode="offline")


def test_a_changed_call_is_a_new_code_version():
    one = build_call_asset(name="x", source=texts, call=ReverseCall(column="text"))
    other = build_call_asset(name="x", source=texts, call=ReverseCall(column="text",
                                                                      model="other"))
    assert next(iter(one.specs)).code_version != next(iter(other.specs)).code_version
