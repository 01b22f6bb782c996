"""Asset checks of an inference asset, evaluated per partition from the partition's own figures.

With a ``partitions_def`` the checks are partitioned (``AssetCheckSpec(partitions_def=...)``, a
preview feature of Dagster 1.13): each partition keeps its own result, so a day whose rows failed
stays marked however many clean days run after it. Dagster's ``AssetCheckResult`` takes its
partition from the run, which a run over a range (a single-run backfill) does not have; there
the asset yields one ``AssetCheckEvaluation`` per partition, tied to that partition's
materialization.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from ..core import InferenceStats
from .error_kinds import ErrorKind, describe_errors, unretryable_rows

FAILED_ROW_RATE = "failed_row_rate"
ROW_COUNT_MATCHES_INPUT = "row_count_matches_input"
NO_ROWS_DEFERRED = "no_rows_deferred"
CHECK_NAMES = (FAILED_ROW_RATE, ROW_COUNT_MATCHES_INPUT, NO_ROWS_DEFERRED)
# What row_count_matches_input reports for a partition without input rows (the option
# empty_partition): an empty day usually means its load did not happen, which "0 rows out for 0
# in" would pass silently; where empty days are normal, "pass".
EMPTY_PARTITION_POLICIES = {
    "warn": dg.AssetCheckSeverity.WARN, "error": dg.AssetCheckSeverity.ERROR, "pass": None}


def inference_check_specs(asset_key: dg.AssetKey,
                          partitions_def: dg.PartitionsDefinition | None = None
                          ) -> list[dg.AssetCheckSpec]:
    """The three checks, partitioned like the asset."""
    with warnings.catch_warnings():
        # Partitioned checks are a preview feature of Dagster 1.13; without them a partition's
        # result is overwritten by the next partition's.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(FAILED_ROW_RATE, asset=asset_key, partitions_def=partitions_def,
                              description="Share of rows that failed after all attempts "
                              "(which rows, and whether a retry can fix them, in the "
                              "metadata)."),
            dg.AssetCheckSpec(ROW_COUNT_MATCHES_INPUT, asset=asset_key,
                              partitions_def=partitions_def,
                              description="Every input row is in the output, none added; "
                              "a partition without input rows warns (or errs, or passes: the "
                              "asset's empty_partition)."),
            dg.AssetCheckSpec(NO_ROWS_DEFERRED, asset=asset_key, partitions_def=partitions_def,
                              description="No row was left unsent by a token budget."),
        ]


def inference_check_results(
    asset_key: dg.AssetKey, stats: InferenceStats, *, input_rows: int, output_rows: int,
    warn_failed_rate: float, error_failed_rate: float, empty_partition: str = "warn",
    failed_rows: dg.TableMetadataValue | None = None,
) -> list[dg.AssetCheckResult]:
    """The checks' results for one call's figures (one partition's, in a backfill)."""
    rate = stats.failure_rate
    if rate > error_failed_rate:
        rate_severity, rate_passed = dg.AssetCheckSeverity.ERROR, False
    elif rate > warn_failed_rate:
        rate_severity, rate_passed = dg.AssetCheckSeverity.WARN, False
    else:
        rate_severity, rate_passed = dg.AssetCheckSeverity.WARN, True
    unfixable = sum(unretryable_rows(stats.errors_by_type).values())
    rate_metadata: dict[str, Any] = {
        "failed_rows": stats.failed, "rows": stats.rows, "failed_row_rate": round(rate, 6),
        "warn_above": warn_failed_rate, "error_above": error_failed_rate,
        "errors_by_type": dg.MetadataValue.json(stats.errors_by_type),
        "rows_a_retry_cannot_fix": unfixable,
    }
    if stats.failed:
        rate_metadata["what_to_do"] = describe_errors(stats.errors_by_type)
    if failed_rows is not None:
        rate_metadata["failed_rows_sample"] = failed_rows
    return [
        dg.AssetCheckResult(
            asset_key=asset_key, check_name=FAILED_ROW_RATE, passed=bool(rate_passed),
            severity=rate_severity, metadata=rate_metadata,
            description=_failed_rate_description(stats, warn_failed_rate, error_failed_rate),
        ),
        _row_count_result(asset_key, input_rows, output_rows, empty_partition),
        dg.AssetCheckResult(
            asset_key=asset_key, check_name=NO_ROWS_DEFERRED, passed=bool(stats.deferred == 0),
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"deferred_rows": stats.deferred},
            description=(f"{stats.deferred} rows {ErrorKind.DEFERRED.advice}."
                         if stats.deferred else "Every row was sent."),
        ),
    ]


def _row_count_result(asset_key: dg.AssetKey, input_rows: int, output_rows: int,
                      empty_partition: str) -> dg.AssetCheckResult:
    metadata: dict[str, Any] = {"input_rows": input_rows, "output_rows": output_rows}
    if input_rows != output_rows:
        passed, severity = False, dg.AssetCheckSeverity.ERROR
        description = (f"{output_rows} rows out for {input_rows} in: the transform added or "
                       "dropped rows.")
    elif input_rows == 0 and EMPTY_PARTITION_POLICIES[empty_partition] is not None:
        passed, severity = False, EMPTY_PARTITION_POLICIES[empty_partition]
        metadata["empty_partition"] = empty_partition
        description = ("No input rows: the upstream table has none for this partition (did "
                       "its load run?). Where empty partitions are normal, set "
                       "empty_partition='pass' on the asset.")
    else:
        passed, severity = True, dg.AssetCheckSeverity.ERROR
        description = f"{output_rows} rows out for {input_rows} in."
    return dg.AssetCheckResult(
        asset_key=asset_key, check_name=ROW_COUNT_MATCHES_INPUT, passed=passed,
        severity=severity, metadata=metadata, description=description)


def _failed_rate_description(stats: InferenceStats, warn_above: float,
                             error_above: float) -> str:
    if not stats.failed:
        return f"No row failed ({stats.rows} rows)."
    return (f"{stats.failed} of {stats.rows} rows failed ({stats.failure_rate:.1%}; warn above "
            f"{warn_above:.1%}, error above {error_above:.1%}): "
            f"{describe_errors(stats.errors_by_type)}.")


def check_events(context: dg.AssetExecutionContext, asset_key: dg.AssetKey,
                 results: Sequence[tuple[str | None, list[dg.AssetCheckResult]]]) -> Iterator[Any]:
    """What the asset yields for its checks: ``results`` are ``(partition, results)`` pairs,
    one per partition of the run (one ``(None, ...)`` pair for an unpartitioned asset).

    Yield these after the asset's ``Output``, so each evaluation finds its partition's
    materialization.
    """
    covers_a_range = context.has_partition_key_range and not context.has_partition_key
    if len(results) == 1 and not covers_a_range:
        yield from results[0][1]  # Dagster ties them to the run's one partition, if any
        return
    selected = context.selected_asset_check_keys
    output_names = {spec.key: name
                    for name, spec in context.assets_def.check_specs_by_output_name.items()}
    for check_key in sorted(selected, key=lambda k: k.name):
        if check_key.asset_key == asset_key and check_key in output_names:
            # The check's own output, which the step must yield once (it carries no value).
            yield dg.Output(None, output_name=output_names[check_key])
    for partition, partition_results in results:
        target = _latest_materialization(context.instance, asset_key, partition)
        for result in partition_results:
            if dg.AssetCheckKey(asset_key, result.check_name) not in selected:
                continue
            yield dg.AssetCheckEvaluation(
                asset_key=asset_key, check_name=result.check_name, passed=result.passed,
                metadata=result.metadata, severity=result.severity,
                description=result.description, blocking=False, partition=partition,
                target_materialization_data=target,
            )


def _latest_materialization(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                            partition: str | None
                            ) -> AssetCheckEvaluationTargetMaterializationData | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key,
                              asset_partitions=[partition] if partition else None),
        limit=1,
    ).records
    if not records:
        return None
    record = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        run_id=record.run_id, storage_id=record.storage_id, timestamp=record.timestamp)
