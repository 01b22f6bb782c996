"""Asset checks of an inference asset, computed from the run's own figures."""

from __future__ import annotations

import dagster as dg

from .core.results import InferenceStats

FAILED_ROW_RATE = "failed_row_rate"
ROW_COUNT_MATCHES_INPUT = "row_count_matches_input"
NO_ROWS_DEFERRED = "no_rows_deferred"
CHECK_NAMES = (FAILED_ROW_RATE, ROW_COUNT_MATCHES_INPUT, NO_ROWS_DEFERRED)


def inference_check_specs(asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(FAILED_ROW_RATE, asset=asset_key,
                          description="Share of rows that failed after all attempts."),
        dg.AssetCheckSpec(ROW_COUNT_MATCHES_INPUT, asset=asset_key,
                          description="Every input row is in the output, none added."),
        dg.AssetCheckSpec(NO_ROWS_DEFERRED, asset=asset_key,
                          description="No row was left unsent by a token budget."),
    ]


def inference_check_results(
    asset_key: dg.AssetKey, stats: InferenceStats, *, input_rows: int, output_rows: int,
    warn_failed_rate: float, error_failed_rate: float,
) -> list[dg.AssetCheckResult]:
    rate = stats.failure_rate
    if rate > error_failed_rate:
        rate_severity, rate_passed = dg.AssetCheckSeverity.ERROR, False
    elif rate > warn_failed_rate:
        rate_severity, rate_passed = dg.AssetCheckSeverity.WARN, False
    else:
        rate_severity, rate_passed = dg.AssetCheckSeverity.WARN, True
    return [
        dg.AssetCheckResult(
            asset_key=asset_key, check_name=FAILED_ROW_RATE, passed=bool(rate_passed),
            severity=rate_severity,
            metadata={"failed_rows": stats.failed, "rows": stats.rows,
                      "failed_row_rate": round(rate, 6), "warn_above": warn_failed_rate,
                      "error_above": error_failed_rate,
                      "errors_by_type": dg.MetadataValue.json(stats.errors_by_type)},
        ),
        dg.AssetCheckResult(
            asset_key=asset_key, check_name=ROW_COUNT_MATCHES_INPUT,
            passed=bool(input_rows == output_rows), severity=dg.AssetCheckSeverity.ERROR,
            metadata={"input_rows": input_rows, "output_rows": output_rows},
        ),
        dg.AssetCheckResult(
            asset_key=asset_key, check_name=NO_ROWS_DEFERRED, passed=bool(stats.deferred == 0),
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"deferred_rows": stats.deferred},
        ),
    ]
