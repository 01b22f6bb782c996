"""The inference asset's checks pass on a clean run and fail, at the configured severity, when
rows fail or are deferred."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import build_inference_asset

ROWS = 20
pytestmark = pytest.mark.timeout(60)


@dg.asset
def calls() -> pd.DataFrame:
    return pd.DataFrame({"text": [f"call {i}: the customer asks about order {i}"
                                  for i in range(ROWS)]})


def _run(sim, make_llm_resource, **asset_kwargs) -> dict[str, dg.AssetCheckEvaluation]:
    summaries = build_inference_asset(
        name="summaries", source=calls, prompt="Summarize: {text}", output_column="summary",
        warn_failed_rate=0.05, error_failed_rate=0.30, **asset_kwargs,
    )
    result = dg.materialize_to_memory([calls, summaries],
                                      resources={"llm": make_llm_resource(sim)})
    assert result.success  # failing checks report; they do not fail the run
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"failed_row_rate", "row_count_matches_input",
                                "no_rows_deferred"}
    for evaluation in evaluations.values():
        assert type(evaluation.passed) is bool
    assert evaluations["row_count_matches_input"].passed
    return evaluations


def test_checks_pass_on_a_clean_run(sim, make_llm_resource):
    evaluations = _run(sim, make_llm_resource)
    assert all(e.passed for e in evaluations.values())
    assert evaluations["failed_row_rate"].metadata["failed_rows"].value == 0
    assert evaluations["no_rows_deferred"].metadata["deferred_rows"].value == 0


@pytest.mark.parametrize(
    ("failures", "severity"),
    [(2, dg.AssetCheckSeverity.WARN), (8, dg.AssetCheckSeverity.ERROR)],
    ids=["10%-warns", "40%-errors"],
)
def test_failed_row_rate_fails_at_the_level_its_thresholds_set(sim, make_llm_resource,
                                                                failures, severity):
    sim.script(*[400] * failures)  # 400 is final: no retry can turn these rows green
    evaluation = _run(sim, make_llm_resource)["failed_row_rate"]
    assert evaluation.passed is False
    assert evaluation.severity == severity
    assert evaluation.metadata["failed_rows"].value == failures
    assert evaluation.metadata["failed_row_rate"].value == pytest.approx(failures / ROWS)
    assert evaluation.metadata["errors_by_type"].value == {"bad_request": failures}


def test_no_rows_deferred_fails_when_a_token_budget_defers_rows(sim, make_llm_resource):
    evaluations = _run(sim, make_llm_resource, token_budget=200, max_tokens=32)
    deferred = evaluations["no_rows_deferred"]
    assert deferred.passed is False
    assert deferred.severity == dg.AssetCheckSeverity.WARN
    assert 0 < deferred.metadata["deferred_rows"].value < ROWS
    assert evaluations["failed_row_rate"].passed  # deferred rows are not failures
