"""What the inference sensors share: tags, cursors, identifiers and partition checks."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from ..core import InferenceConfigError, StoreLocation
from ..factories.error_kinds import kind_of

# How many of an asset's latest materializations a sensor reads, newest first.
MATERIALIZATIONS_SCANNED = 500
RETRY_TAG = "batchllm/retry"
RETRY_ROUND_TAG = "batchllm/retry_round"
NEW_DATA_TAG = "batchllm/new_data"
NEW_DATA_CURSOR_TAG = "batchllm/new_data_cursor"


def _in_memory_url(url: str) -> bool:
    try:
        return StoreLocation.of(url).in_memory
    except InferenceConfigError as exc:
        raise dg.DagsterInvalidDefinitionError(str(exc)) from None


def _missing_sqlite_file(url: str) -> bool:
    sqlite_file = StoreLocation.of(url).sqlite_file
    return sqlite_file is not None and not Path(sqlite_file).exists()


def _valid_partitions(partitions_def: dg.PartitionsDefinition, keys: Iterable[str],
                      instance: dg.DagsterInstance) -> set[str]:
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return {k for k in keys if partitions_def.has_partition_key(k)}


def _unretryable_in_latest(instance: dg.DagsterInstance,
                           key: dg.AssetKey) -> dict[str, dict[str, int]]:
    """Partitions whose latest materialization (of the last ``MATERIALIZATIONS_SCANNED``) has
    failed rows no retry can fix, with their counts by error type. Input errors never reach the
    ledger (nothing was sent), so only the asset's own metadata knows them."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key),
                                              limit=MATERIALIZATIONS_SCANNED).records
    seen: set[str] = set()
    found: dict[str, dict[str, int]] = {}
    for record in records:
        partition = record.partition_key
        if partition is None or partition in seen:
            continue
        seen.add(partition)
        metadata = record.asset_materialization.metadata
        count = metadata.get("batchllm/rows_failed_unretryable")
        table = metadata.get("batchllm/errors_by_type")
        if count is None or not count.value or not isinstance(table, dg.TableMetadataValue):
            continue
        found[partition] = {
            r.data["error_type"]: int(r.data["rows"]) for r in table.records
            if not kind_of(r.data["error_type"]).retryable and r.data.get("rows")
        }
    return found


def _single_asset(asset: Any, where: str) -> tuple[dg.AssetKey, dg.PartitionsDefinition | None]:
    if isinstance(asset, dg.AssetSpec):
        return asset.key, asset.partitions_def
    if isinstance(asset, dg.AssetsDefinition):
        if len(asset.keys) != 1:
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: pass one asset; this definition has {len(asset.keys)} "
                f"({sorted(k.to_user_string() for k in asset.keys)[:5]}). Build one sensor per "
                "inference asset."
            )
        return asset.key, asset.partitions_def
    raise dg.DagsterInvalidDefinitionError(
        f"{where}: pass the asset definition (e.g. the result of build_inference_asset), got "
        f"{type(asset).__name__}."
    )


@dataclass(frozen=True)
class WatchedAsset:
    """The partitioned asset a sensor re-materializes, and what its runs select: the asset and
    the assets materialized with it."""

    key: dg.AssetKey
    partitions_def: dg.PartitionsDefinition
    where: str  # the sensor factory and the asset, for errors
    selection: list[dg.AssetKey]

    @property
    def scope(self) -> str:
        """The ledger scope of the asset's rows."""
        return self.key.to_user_string()

    def sensor(self, evaluate: Callable[[dg.SensorEvaluationContext], dg.SensorResult], *,
               suffix: str, name: str | None, minimum_interval_seconds: int, description: str,
               default_status: dg.DefaultSensorStatus, target: Any = None
               ) -> dg.SensorDefinition:
        """The sensor, named ``<asset>_<suffix>`` unless ``name``; it targets ``selection``
        unless ``target`` (a job)."""
        return dg.SensorDefinition(
            name=name or f"{self.key.to_python_identifier()}_{suffix}",
            evaluation_fn=evaluate,
            minimum_interval_seconds=minimum_interval_seconds,
            description=description,
            target=self.selection if target is None else target,
            default_status=default_status,
        )


def watched_asset(factory: str, asset: Any, *, also_materialize: Sequence[Any],
                  minimum_interval_seconds: int, unpartitioned: str) -> WatchedAsset:
    """The asset a sensor of ``factory`` watches, checked: one partitioned asset
    (``unpartitioned``: what to do instead), a positive interval."""
    key, partitions_def = _single_asset(asset, factory)
    where = f"{factory}('{key.to_user_string()}')"
    if partitions_def is None:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: the asset has no partitions_def{unpartitioned}")
    check_interval(where, minimum_interval_seconds)
    selection = [key, *(_asset_key(a) for a in also_materialize if _asset_key(a) != key)]
    return WatchedAsset(key, partitions_def, where, selection)


def check_interval(where: str, minimum_interval_seconds: int) -> None:
    if minimum_interval_seconds < 1:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: minimum_interval_seconds must be at least 1.")


def _asset_key(asset: Any) -> dg.AssetKey:
    if isinstance(asset, dg.AssetsDefinition | dg.AssetSpec):
        return asset.key
    return dg.AssetKey.from_coercible(asset)


def _load_cursor(raw: str | None, default: dict[str, Any]) -> dict[str, Any]:
    if not raw:
        return default
    try:
        loaded = json.loads(raw)
    except ValueError:
        raise dg.DagsterInvariantViolationError(
            f"The sensor cursor is not the JSON this sensor writes ({raw[:80]!r}); reset the "
            "cursor in the UI (Sensors > the sensor > Set cursor value) to start over."
        ) from None
    return {**default, **loaded} if isinstance(loaded, dict) else default


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars from pandas-based readers
        return value.item()
    return value


def _cursor_label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
