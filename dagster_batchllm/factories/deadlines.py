"""An asset's deadline per partition: ``deadline=`` of every asset factory (``mode="batch_api"``).

The call's rows go to the provider's batch API first, and those it has not answered when the
time left falls to what the online endpoints need are sent online, so that the partition is
done by its deadline (see :mod:`dagster_batchllm.core.batch.deadline`). The
factory's ``deadline`` says, per partition:

* a ``datetime.timedelta``: after the end of the partition's time window (a daily, hourly,
  weekly or other time-window partition, also as a dimension of multi-partitions):
  ``timedelta(hours=9)`` is 09:00 the day after a daily partition, in the partitions'
  timezone. For an unpartitioned asset or partitions without a time window: from the run's
  start; a later run of a partition whose rows still wait for its batches (the batch-collect
  sensor's) keeps the deadline its latest materialization recorded
  (``batchllm/deadline/at``), so the deadline does not move with each run;
* a ``datetime`` (naive: local time): that moment, for every partition;
* a function ``(partition_key) -> datetime | timedelta`` (``None`` for an unpartitioned
  asset), its ``timedelta`` read as above.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import dagster as dg

from ..core import InferenceConfigError

#: The tag of a run the batch-collect sensor launches at a partition's switch time.
DEADLINE_TAG = "batchllm/deadline"
#: The materialization metadata key of a partition's deadline (what a later run keeps).
DEADLINE_AT = "batchllm/deadline/at"


def check_deadline(deadline: Any, mode: str) -> None:
    """The asset's ``deadline=``, checked at definition time."""
    if deadline is None:
        return
    if not (isinstance(deadline, dt.timedelta | dt.datetime) or callable(deadline)):
        raise InferenceConfigError(
            "deadline= is a datetime.timedelta (after the end of each partition's time window; "
            "from the run's start without one), a datetime, or a function (partition_key) -> "
            f"datetime | timedelta; got {type(deadline).__name__} {deadline!r}.")
    if isinstance(deadline, dt.timedelta) and deadline < dt.timedelta(0):
        raise InferenceConfigError(
            f"deadline= must not be negative, got {deadline}; give the time after the end of "
            "the partition's window (or after the run's start), e.g. timedelta(hours=9).")
    if mode != "batch_api":
        raise InferenceConfigError(
            "deadline= needs mode='batch_api' (the batch API first, online for the rows it "
            "has not answered in time); an online asset sends every row at once. Set "
            "mode='batch_api' (and an endpoint with batch_api=True), or drop deadline=.")


def describe_deadline(deadline: Any) -> str:
    """The asset's deadline in words (its definition metadata)."""
    if isinstance(deadline, dt.timedelta):
        return (f"{deadline} after the end of each partition's time window (from the run's "
                "start without one)")
    if isinstance(deadline, dt.datetime):
        return deadline.isoformat()
    return f"per partition, from {getattr(deadline, '__name__', repr(deadline))}(partition_key)"


def run_deadlines(deadline: Any, context: dg.AssetExecutionContext,
                  partitions_def: dg.PartitionsDefinition | None,
                  asset_key: dg.AssetKey) -> Callable[[str | None], dict[str, Any]]:
    """For a run: ``partition_key -> {"deadline": datetime}`` (the keywords of the call),
    ``{}`` for an asset without a deadline."""
    if deadline is None:
        return lambda _key: {}
    started = _run_start(context)

    def of(key: str | None) -> dict[str, Any]:
        value = deadline(key) if callable(deadline) else deadline
        if not isinstance(value, dt.timedelta | dt.datetime):
            raise dg.Failure(
                f"{asset_key.to_user_string()}: deadline({key!r}) returned "
                f"{type(value).__name__} {value!r}; it must return a datetime or a timedelta.")
        at = (value if isinstance(value, dt.datetime)
              else _after(value, key, partitions_def, context, asset_key, started))
        where = f"partition {key}" if key is not None else "the run"
        context.log.info(f"{asset_key.to_user_string()} {where}: deadline {at.isoformat()}")
        return {"deadline": at}

    return of


def _after(delta: dt.timedelta, key: str | None, partitions_def: Any, context: Any,
           asset_key: dg.AssetKey, started: float) -> dt.datetime:
    window = _time_window(partitions_def, key)
    if window is not None:
        return window.end + delta
    kept = _kept_deadline(context, asset_key, key)
    if kept is not None:
        return kept
    return dt.datetime.fromtimestamp(started, dt.timezone.utc) + delta


def _time_window(partitions_def: Any, key: str | None) -> Any:
    if key is None or partitions_def is None:
        return None
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition) or (
            isinstance(partitions_def, dg.MultiPartitionsDefinition)
            and partitions_def.has_time_window_dimension):
        return partitions_def.time_window_for_partition_key(key)
    return None


def _kept_deadline(context: Any, asset_key: dg.AssetKey, key: str | None) -> dt.datetime | None:
    """The deadline of the partition's latest materialization while its rows still wait for
    batches (the run that submitted them set it)."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key,
                              asset_partitions=[key] if key is not None else None),
        limit=1).records
    if not records:
        return None
    metadata = records[0].asset_materialization.metadata
    at, deferred = metadata.get(DEADLINE_AT), metadata.get("batchllm/rows_deferred")
    if at is None or deferred is None or not deferred.value:
        return None
    return dt.datetime.fromtimestamp(float(at.value), dt.timezone.utc)


def _run_start(context: Any) -> float:
    """When the run started (now, where the instance has not recorded it)."""
    record = context.instance.get_run_record_by_id(context.run.run_id)
    start = record.start_time if record is not None else None
    return float(start) if start is not None else time.time()


__all__ = ["DEADLINE_AT", "DEADLINE_TAG", "check_deadline", "describe_deadline",
           "run_deadlines"]
