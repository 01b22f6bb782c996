"""A partition without input rows is not a silent pass: its ``row_count_matches_input`` check
warns by default, errs or passes as the asset's ``empty_partition`` says, for the inference and
the embedding asset, in a single-run backfill, and from a Component's YAML."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
from dagster.components.testing import create_defs_folder_sandbox

from dagster_batchllm import build_embedding_asset, build_inference_asset

DAYS = dg.StaticPartitionsDefinition(["2026-11-04", "2026-11-05"])
FULL, EMPTY = DAYS.get_partition_keys()
ROW_COUNT = "row_count_matches_input"
pytestmark = pytest.mark.timeout(120)


@dg.asset(partitions_def=DAYS, backfill_policy=dg.BackfillPolicy.single_run())
def calls(context) -> pd.DataFrame:
    """Three calls on FULL, none on EMPTY (its load did not happen)."""
    days = [day for day in context.partition_keys if day == FULL]
    return pd.DataFrame([(day, f"call {i} about order {i}") for day in days for i in range(3)],
                        columns=["call_date", "text"])


def _summaries(**options) -> dg.AssetsDefinition:
    return build_inference_asset(
        name="summaries", source=calls, prompt="Summarize: {text}", output_column="summary",
        partitions_def=DAYS, partition_column="call_date", **options)


def _checks(result: dg.ExecuteInProcessResult) -> dict[tuple[str | None, str],
                                                      dg.AssetCheckEvaluation]:
    assert result.success  # a failing check reports; it does not fail the run
    return {(e.partition, e.check_name): e for e in result.get_asset_check_evaluations()}


def test_an_empty_partition_warns_by_default_and_the_other_checks_pass(sim, make_llm_resource,
                                                                       instance):
    result = dg.materialize([calls, _summaries()], partition_key=EMPTY, instance=instance,
                            resources={"llm": make_llm_resource(sim)})
    checks = _checks(result)
    row_count = checks[EMPTY, ROW_COUNT]
    assert row_count.passed is False
    assert row_count.severity == dg.AssetCheckSeverity.WARN
    assert row_count.description.startswith("No input rows")
    assert row_count.metadata["input_rows"].value == 0
    assert row_count.metadata["empty_partition"].value == "warn"
    assert checks[EMPTY, "failed_row_rate"].passed and checks[EMPTY, "no_rows_deferred"].passed
    assert sim.stats(log=False)["requests"] == 0
    # The check's result is the partition's in the instance, not only the run's event.
    [record] = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("summaries"), ROW_COUNT), limit=5)
    assert (record.partition, record.status.value) == (EMPTY, "FAILED")


@pytest.mark.parametrize(("empty_partition", "passed", "severity"), [
    ("error", False, dg.AssetCheckSeverity.ERROR),
    ("pass", True, dg.AssetCheckSeverity.ERROR),  # a pass's severity is Dagster's default
])
def test_empty_partition_sets_what_the_check_reports(sim, make_llm_resource, instance,
                                                     empty_partition, passed, severity):
    result = dg.materialize([calls, _summaries(empty_partition=empty_partition)],
                            partition_key=EMPTY, instance=instance,
                            resources={"llm": make_llm_resource(sim)})
    row_count = _checks(result)[EMPTY, ROW_COUNT]
    assert (row_count.passed, row_count.severity) == (passed, severity)
    if passed:
        assert row_count.description == "0 rows out for 0 in."


def test_a_single_run_backfill_marks_only_its_empty_partition(sim, make_llm_resource, instance):
    # In memory: the filesystem IO manager stores no output of several partitions.
    result = dg.materialize_to_memory([calls, _summaries()], instance=instance,
                            resources={"llm": make_llm_resource(sim)}, tags={
                                "dagster/asset_partition_range_start": FULL,
                                "dagster/asset_partition_range_end": EMPTY})
    checks = _checks(result)
    assert checks[FULL, ROW_COUNT].passed
    assert checks[FULL, ROW_COUNT].metadata["input_rows"].value == 3
    assert not checks[EMPTY, ROW_COUNT].passed
    assert checks[EMPTY, ROW_COUNT].severity == dg.AssetCheckSeverity.WARN


@pytest.mark.slow
def test_the_embedding_asset_warns_on_an_empty_partition(embed_sim, make_llm_resource,
                                                         instance):
    embeddings = build_embedding_asset(
        name="call_embeddings", source=calls, input_column="text", model="sim-embed",
        partitions_def=DAYS, partition_column="call_date")
    llm = make_llm_resource(embed_sim, endpoint_kwargs={"embedding_models": ["sim-embed"]})
    checks = _checks(dg.materialize([calls, embeddings], partition_key=EMPTY, instance=instance,
                                    resources={"llm": llm}))
    assert checks[EMPTY, ROW_COUNT].passed is False
    assert checks[EMPTY, ROW_COUNT].severity == dg.AssetCheckSeverity.WARN
    full = _checks(dg.materialize([calls, embeddings], partition_key=FULL, instance=instance,
                                  resources={"llm": llm}))
    assert full[FULL, ROW_COUNT].passed  # a day with rows is unchanged


def test_a_components_yaml_sets_empty_partition(sim, make_llm_resource, instance):
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / "summaries"
        path.mkdir()
        (path / "defs.yaml").write_text(f"""\
type: dagster_batchllm.BatchInferenceComponent
attributes:
  name: summaries
  source: calls
  prompt: "Summarize: {{text}}"
  output_column: summary
  partitions_def: {{type: static, partition_keys: ["{FULL}", "{EMPTY}"]}}
  partition_column: call_date
  empty_partition: error
""")
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert component.empty_partition == "error"
            asset = defs.get_assets_def("summaries")
    result = dg.materialize([calls, asset], partition_key=EMPTY, instance=instance,
                            resources={"llm": make_llm_resource(sim)})
    row_count = _checks(result)[EMPTY, ROW_COUNT]
    assert (row_count.passed, row_count.severity) == (False, dg.AssetCheckSeverity.ERROR)


def test_an_unknown_empty_partition_is_a_definition_error():
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="empty_partition is one of"):
        _summaries(empty_partition="ignore")
