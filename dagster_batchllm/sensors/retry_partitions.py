"""The retry-partitions sensor: re-materialize the partitions the ledger calls incomplete.

It keeps its state in the sensor cursor (JSON), so it survives daemon restarts and can be reset
from the UI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import dagster as dg

# What dg.define_asset_job returns; Dagster does not export the class at the top level.
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from ..core import (
    DEFAULT_LEDGER_TABLE,
    InferenceConfigError,
    Ledger,
    unfinished_partitions,
    validate_identifier,
)
from ..factories.error_kinds import describe_errors, kind_of
from .common import (
    RETRY_ROUND_TAG,
    RETRY_TAG,
    _in_memory_url,
    _load_cursor,
    _missing_sqlite_file,
    _unretryable_in_latest,
    _valid_partitions,
    watched_asset,
)

# Dagster's own run tags for the partitions a run covers.
_PARTITION_TAG = "dagster/partition"
_RANGE_START_TAG = "dagster/asset_partition_range_start"
_RANGE_END_TAG = "dagster/asset_partition_range_end"
_ACTIVE_RUN_STATUSES = [
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING,
]
_MAX_ACTIVE_RUNS_SCANNED = 1000



def _now() -> float:
    return time.time()


# -- retry partitions -------------------------------------------------------------------------


def build_retry_partitions_sensor(
    asset: dg.AssetsDefinition | dg.AssetSpec,
    *,
    resource: Any = None,
    store_url: str | None = None,
    ledger_table: str = DEFAULT_LEDGER_TABLE,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    base_delay_s: float = 60.0,
    max_delay_s: float = 3600.0,
    max_rounds: int = 5,
    also_materialize: Sequence[Any] = (),
    job: dg.JobDefinition | UnresolvedAssetJobDefinition | None = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> dg.SensorDefinition:
    """A sensor that re-materializes exactly the partitions whose rows failed or were deferred.

    Rows that failed after all attempts, or that a token budget deferred, stay in the ledger
    under their partition key (and the asset key as scope). This sensor reads those partitions
    and requests one run per partition, tagged ``batchllm/retry=true`` and
    ``batchllm/retry_round=<n>``. The rerun pays only for the missing rows: the others are
    ledger hits.

    Rounds are spaced out per partition: round ``n`` waits ``base_delay_s * 2**(n-1)`` (at most
    ``max_delay_s``) after the partition was first seen incomplete or after its last run ended,
    and a partition with a run in progress is left alone. After ``max_rounds`` rounds a
    partition that is still incomplete is reported (a warning in the sensor log, an asset
    observation on the partition, and the tick's skip reason) and not retried again; a
    partition whose rows all succeed later, whether by a retry or by hand, leaves the cursor.

    Args:
        asset: the partitioned inference asset (from ``build_inference_asset`` or any asset
            that calls ``BatchInferenceResource.infer(df, context=context)``).
        resource: the ``BatchInferenceResource`` the asset uses; the sensor reads its
            ``store_url`` and ``ledger_table`` (an ``EnvVar`` is read at evaluation time).
        store_url / ledger_table: the ledger's location, instead of ``resource``.
        also_materialize: assets re-materialized in the same runs, e.g. the assets fed by this
            one, so they pick up the filled rows.
        job: an asset job to launch the runs of; by default the sensor targets the asset itself
            (and ``also_materialize``).

    Example::

        import dagster as dg
        from dagster_batchllm import (
            BatchInferenceResource, Endpoint, build_inference_asset,
            build_retry_partitions_sensor,
        )

        days = dg.DailyPartitionsDefinition(start_date="2026-01-01")
        summaries = build_inference_asset(
            name="summaries", source="transcripts", prompt="Summarize: {text}",
            output_column="summary", partitions_def=days,
        )
        llm = BatchInferenceResource(
            endpoints=[Endpoint(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                models=["llama-70b"])],
            default_model="llama-70b", store_url="sqlite:///batchllm.db",
        )
        defs = dg.Definitions(
            assets=[dg.AssetSpec("transcripts", partitions_def=days), summaries],
            sensors=[build_retry_partitions_sensor(summaries, resource=llm, max_rounds=3)],
            resources={"llm": llm},
        )
    """
    watched = watched_asset(
        "build_retry_partitions_sensor", asset, also_materialize=also_materialize,
        minimum_interval_seconds=minimum_interval_seconds,
        unpartitioned=". Retry partitions are for partitioned assets; an unpartitioned "
        "inference asset sends its failed rows again on its next materialization (only "
        "successful answers are ledger hits).")
    where, key, partitions_def = watched.where, watched.key, watched.partitions_def
    source = _LedgerSource.from_arguments(where, resource, store_url, ledger_table)
    if max_rounds < 1:
        raise dg.DagsterInvalidDefinitionError(f"{where}: max_rounds must be at least 1.")
    if base_delay_s < 0 or max_delay_s < base_delay_s:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: need 0 <= base_delay_s <= max_delay_s, got {base_delay_s} and "
            f"{max_delay_s}."
        )
    selection, scope = watched.selection, watched.scope

    def delay_before(round_number: int) -> float:
        return min(max_delay_s, base_delay_s * 2 ** (round_number - 1))

    def evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = _load_cursor(context.cursor, {"partitions": {}, "ignored": []})
        tracked: dict[str, dict[str, Any]] = cursor["partitions"]
        ledger = source.ledger()
        needing, unfixable = _retry_work(ledger, scope) if ledger is not None else ({}, {})
        for partition, errors in _unretryable_in_latest(context.instance, key).items():
            known = unfixable.setdefault(partition, {})
            for error_type, rows in errors.items():  # the same rows may be in both: not added
                known[error_type] = max(known.get(error_type, 0), rows)
        known_partitions = _valid_partitions(partitions_def, unfixable, context.instance)
        unfixable = {p: e for p, e in unfixable.items() if p in known_partitions}
        now = _now()

        for partition in sorted(set(tracked) - set(needing)):
            rounds = tracked.pop(partition)["rounds"]
            after = f" after {rounds} retry round(s)" if rounds else ""
            if partition in unfixable:
                context.log.info(f"{scope} partition {partition} has no rows left that a retry "
                                 f"can fix{after}: {describe_errors(unfixable[partition])}.")
            else:
                context.log.info(f"{scope} partition {partition} is complete{after}.")
        if unfixable:
            context.log.info(f"Not retried, {_unfixable_text(unfixable)}")

        valid = _valid_partitions(partitions_def, needing, context.instance)
        newly_ignored = sorted(set(needing) - valid - set(cursor["ignored"]))
        if newly_ignored:
            context.log.warning(
                f"The ledger has failed/deferred rows of {scope} under partition keys its "
                f"partitions_def does not have, which are not retried: {newly_ignored[:10]}"
            )
        cursor["ignored"] = sorted(set(needing) - valid)
        busy = _partitions_in_flight(context.instance, key, partitions_def) if valid else set()

        requests: list[dg.RunRequest] = []
        observations: list[dg.AssetObservation] = []
        waiting: list[str] = []
        exhausted: list[str] = []
        for partition in sorted(valid):
            counts = needing[partition]
            entry = tracked.setdefault(partition, {"rounds": 0, "since": now,
                                                   "exhausted": False})
            if entry["exhausted"]:
                exhausted.append(partition)
                continue
            if partition in busy:
                # The delay counts from the end of the latest run, not from its request.
                entry["since"] = now
                waiting.append(f"{partition} (run in progress)")
                continue
            if entry["rounds"] >= max_rounds:
                entry["exhausted"] = True
                exhausted.append(partition)
                context.log.warning(
                    f"{scope} partition {partition} still has {counts.failed} failed and "
                    f"{counts.deferred} deferred rows after {max_rounds} retry round(s); the "
                    "sensor gives up on it. Materialize it by hand once the cause is fixed."
                )
                observations.append(dg.AssetObservation(
                    asset_key=key, partition=partition,
                    metadata={"batchllm/retry_exhausted": True,
                              "batchllm/retry_rounds": max_rounds,
                              "batchllm/rows_failed": counts.failed,
                              "batchllm/rows_deferred": counts.deferred},
                ))
                continue
            next_round = entry["rounds"] + 1
            due_in = entry["since"] + delay_before(next_round) - now
            if due_in > 0:
                waiting.append(f"{partition} (round {next_round} in {due_in:.0f} s)")
                continue
            entry["rounds"], entry["since"] = next_round, now
            requests.append(dg.RunRequest(
                partition_key=partition, asset_selection=selection,
                tags={RETRY_TAG: "true", RETRY_ROUND_TAG: str(next_round)},
            ))
            context.log.info(
                f"Retry round {next_round}/{max_rounds} of {scope} partition {partition}: "
                f"{counts.failed} failed and {counts.deferred} deferred rows."
            )

        new_cursor = json.dumps(cursor, sort_keys=True)
        if requests:
            return dg.SensorResult(run_requests=requests, cursor=new_cursor,
                                   asset_events=observations)
        return dg.SensorResult(
            skip_reason=_retry_skip_reason(scope, waiting, exhausted, cursor["ignored"],
                                           unfixable),
            cursor=new_cursor, asset_events=observations,
        )

    return watched.sensor(
        evaluate, suffix="retry_partitions", name=name, target=job,
        minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
        description=description or (
            f"Re-materializes the partitions of {scope} whose rows failed or were deferred "
            f"(at most {max_rounds} rounds per partition, {base_delay_s:g} s apart and "
            "doubling)."),
    )


class _RetryRows(NamedTuple):
    failed: int  # failed rows a retry may fix
    deferred: int


def _retry_work(ledger: Ledger, scope: str
                ) -> tuple[dict[str, _RetryRows], dict[str, dict[str, int]]]:
    """The partitions with rows a retry may fix, and those with failed rows no retry can fix
    (``{partition: {error_type: rows}}``). Rows waiting in a provider's batch are not retried
    (the core leaves them out): a retry now would only wait for the batch, and use up a round."""
    needing: dict[str, _RetryRows] = {}
    unfixable: dict[str, dict[str, int]] = {}
    for partition, rows in unfinished_partitions(ledger, scope).items():
        retryable = sum(n for t, n in rows.failed.items() if kind_of(t).retryable)
        cannot = {t: n for t, n in rows.failed.items() if not kind_of(t).retryable}
        if cannot:
            unfixable[partition] = cannot
        if retryable or rows.deferred:
            needing[partition] = _RetryRows(retryable, rows.deferred)
    return needing, unfixable


def _unfixable_text(unfixable: dict[str, dict[str, int]]) -> str:
    shown = sorted(unfixable)[:20]
    more = f" and {len(unfixable) - len(shown)} more" if len(unfixable) > len(shown) else ""
    return ("partitions with failed rows: "
            + "; ".join(f"{p}: {describe_errors(unfixable[p])}" for p in shown) + more + ".")


def _retry_skip_reason(scope: str, waiting: list[str], exhausted: list[str],
                       ignored: list[str], unfixable: dict[str, dict[str, int]]) -> str:
    parts = []
    if waiting:
        parts.append(f"waiting: {', '.join(waiting[:20])}")
    if exhausted:
        parts.append(f"gave up after the last round (still incomplete): "
                     f"{', '.join(exhausted[:20])}")
    if ignored:
        parts.append(f"unknown partition keys in the ledger: {', '.join(ignored[:5])}")
    not_retried = f" Not retried, {_unfixable_text(unfixable)}" if unfixable else ""
    if not parts:
        if unfixable:
            return f"No partition of {scope} has rows a retry can fix.{not_retried}"
        return f"No partition of {scope} has failed or deferred rows."
    return f"{scope}: " + "; ".join(parts) + "." + not_retried


class _LedgerSource:
    """The ledger the asset writes, opened at evaluation time and kept for the next ones."""

    def __init__(self, store_url: Any, ledger_table: str):
        self._store_url = store_url
        self._table = ledger_table
        self._ledger: Ledger | None = None
        self._opened_url: str | None = None

    @classmethod
    def from_arguments(cls, where: str, resource: Any, store_url: Any,
                       ledger_table: str) -> _LedgerSource:
        if (resource is None) == (store_url is None):
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: pass resource= (the BatchInferenceResource the asset uses) or "
                "store_url= (its ledger's SQLAlchemy URL), exactly one, so the sensor reads the "
                "ledger the runs write."
            )
        if resource is not None:
            if not hasattr(resource, "store_url") or not hasattr(resource, "ledger_table"):
                raise dg.DagsterInvalidDefinitionError(
                    f"{where}: resource= must be a BatchInferenceResource, got "
                    f"{type(resource).__name__}."
                )
            store_url, ledger_table = resource.store_url, resource.ledger_table
        if store_url is None or (not isinstance(store_url, dg.EnvVar)
                                 and _in_memory_url(store_url)):
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: the ledger is in memory (store_url={store_url!r}), which lasts one "
                "process and a sensor cannot read; use a SQLite file or PostgreSQL URL."
            )
        try:
            validate_identifier(ledger_table, "ledger_table")
        except InferenceConfigError as exc:
            raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
        return cls(store_url, ledger_table)

    def ledger(self) -> Ledger | None:
        """The ledger, or None while no run has created its SQLite file yet."""
        url = self._store_url.get_value() if isinstance(self._store_url, dg.EnvVar) \
            else self._store_url
        if not url:
            raise dg.DagsterInvariantViolationError(
                f"The ledger's store_url ({self._store_url!r}) is empty in the sensor's process."
            )
        if self._ledger is not None and self._opened_url == url:
            return self._ledger
        if _missing_sqlite_file(url):
            return None
        self._ledger, self._opened_url = Ledger(url, self._table), url
        return self._ledger




def _partitions_in_flight(instance: dg.DagsterInstance, key: dg.AssetKey,
                          partitions_def: dg.PartitionsDefinition) -> set[str]:
    """Partitions of ``key`` that a queued or running run covers (it may fill them itself)."""
    busy: set[str] = set()
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=_ACTIVE_RUN_STATUSES),
                             limit=_MAX_ACTIVE_RUNS_SCANNED)
    for run in runs:
        # A run without an asset selection (a whole asset job) may cover the asset: count it.
        if run.asset_selection is not None and key not in run.asset_selection:
            continue
        tags = run.tags
        if _PARTITION_TAG in tags:
            busy.add(tags[_PARTITION_TAG])
        start, end = tags.get(_RANGE_START_TAG), tags.get(_RANGE_END_TAG)
        if start and end:
            try:
                with dg.partition_loading_context(dynamic_partitions_store=instance):
                    busy.update(partitions_def.get_partition_keys_in_range(
                        dg.PartitionKeyRange(start, end)))
            except Exception:  # a range of another partitioning: not ours to interpret
                continue
    return busy
