"""A sensor that runs the partitions whose source rows are new (a cursor on an increasing key)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

# What dg.define_asset_job returns; Dagster does not export the class at the top level.
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from ..core import InferenceConfigError, validate_identifier
from .common import (
    NEW_DATA_CURSOR_TAG,
    NEW_DATA_TAG,
    _cursor_label,
    _identifier,
    _jsonable,
    _load_cursor,
    _missing_sqlite_file,
    _valid_partitions,
    check_interval,
)

NewRowsSince = Callable[[Any], tuple[Iterable[str], Any]]
#: What the sensor launches runs of: an asset job, or asset definitions sharing partitions.
NewDataTarget = (dg.JobDefinition | UnresolvedAssetJobDefinition | dg.AssetsDefinition
                 | Sequence[dg.AssetsDefinition])


def build_new_data_sensor(
    target: NewDataTarget,
    *,
    new_rows_since: NewRowsSince | None = None,
    url: str | dg.EnvVar | None = None,
    table: str | None = None,
    cursor_column: str | None = None,
    partition_column: str | None = None,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    skip_existing_rows: bool = True,
    tags: dict[str, str] | None = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> dg.SensorDefinition:
    """A sensor that materializes the partitions whose source table received new rows.

    It keeps a cursor on an increasing key of the source (an ingest id, a load timestamp) and
    requests one run per partition that got rows past it. Run keys include the new cursor
    (``<partition>@<cursor>``), so evaluating the same cursor twice launches nothing twice,
    while later rows for the same partition launch a fresh run.

    Tell it how to find new rows in one of two ways:

    * ``new_rows_since=fn``: ``fn(cursor) -> (partition_keys, new_cursor)``, any source; the
      cursor is ``None`` at first and then whatever ``fn`` returned (JSON-serializable).
    * ``url=``, ``table=``, ``cursor_column=`` and ``partition_column=``: a table reachable by
      SQLAlchemy; the sensor runs ``SELECT partition, MAX(cursor) ... WHERE cursor > :last
      GROUP BY partition``. ``url`` may be an ``EnvVar``.

    With ``skip_existing_rows`` (the default) the first evaluation that finds rows only records
    where the table stands: turning the sensor on does not re-materialize history (that is what
    backfills are for). An unpartitioned target gets one run whenever the cursor moves.

    Example::

        import dagster as dg
        from dagster_batchllm import build_new_data_sensor

        days = dg.DailyPartitionsDefinition(start_date="2026-01-01")
        calls_job = dg.define_asset_job("calls", selection="group:calls", partitions_def=days)
        defs = dg.Definitions(
            jobs=[calls_job],
            sensors=[build_new_data_sensor(
                calls_job, url="sqlite:///warehouse.db", table="raw_calls",
                cursor_column="ingest_id", partition_column="call_date",
            )],
        )
    """
    where = "build_new_data_sensor"
    target_name, partitions_def = _describe_target(target, where)
    where = f"build_new_data_sensor('{target_name}')"
    if (new_rows_since is None) == (url is None):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: pass new_rows_since= (a function cursor -> (partition_keys, new_cursor)) "
            "or url= with table=, cursor_column= and partition_column=, exactly one."
        )
    if url is not None:
        reader: NewRowsSince = _SqlNewRows.from_arguments(
            where, url, table, cursor_column, partition_column,
            partitioned=partitions_def is not None)
    else:
        if not callable(new_rows_since):
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: new_rows_since must be callable, got {type(new_rows_since).__name__}."
            )
        if any(v is not None for v in (table, cursor_column, partition_column)):
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: table=, cursor_column= and partition_column= go with url=; "
                "new_rows_since= finds the new rows by itself."
            )
        reader = new_rows_since
    check_interval(where, minimum_interval_seconds)
    run_tags = {NEW_DATA_TAG: "true", **dict(tags or {})}

    def evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        first = context.cursor is None
        previous = None if first else _load_cursor(context.cursor, {"cursor": None})["cursor"]
        keys, new_cursor = reader(previous)
        new_cursor = _jsonable(previous if new_cursor is None else new_cursor)
        keys = sorted({str(k) for k in keys if k is not None})
        if first and new_cursor is None:
            # Leave the cursor unset: the first rows the sensor ever finds are where it starts.
            return dg.SensorResult(skip_reason="The source has no rows yet.")
        stored = json.dumps({"cursor": new_cursor})
        if first and skip_existing_rows:
            return dg.SensorResult(
                skip_reason=f"Started at cursor {new_cursor!r}; rows already there are not new "
                "(backfill them if they need materializing).",
                cursor=stored,
            )
        label = _cursor_label(new_cursor)
        if partitions_def is None:
            if new_cursor == previous:
                return dg.SensorResult(skip_reason=f"No new rows past {previous!r}.",
                                       cursor=stored)
            return dg.SensorResult(
                run_requests=[dg.RunRequest(run_key=f"new-data@{label}",
                                            tags={**run_tags, NEW_DATA_CURSOR_TAG: label})],
                cursor=stored,
            )
        valid = _valid_partitions(partitions_def, keys, context.instance)
        unknown = [k for k in keys if k not in valid]
        if unknown:
            context.log.warning(
                f"New rows belong to partitions the target does not have (skipped): "
                f"{unknown[:10]}"
            )
        requests = [
            dg.RunRequest(run_key=f"{key}@{label}", partition_key=key,
                          tags={**run_tags, NEW_DATA_CURSOR_TAG: label})
            for key in sorted(valid)
        ]
        if not requests:
            return dg.SensorResult(
                skip_reason=f"No new rows in any partition past {previous!r}.", cursor=stored)
        context.log.info(f"New rows up to cursor {label} in partitions {sorted(valid)}.")
        return dg.SensorResult(run_requests=requests, cursor=stored)

    return dg.SensorDefinition(
        name=name or f"{_identifier(target_name)}_new_data",
        evaluation_fn=evaluate,
        minimum_interval_seconds=minimum_interval_seconds,
        description=description or f"Materializes {target_name} for partitions with new rows.",
        target=target,
        default_status=default_status,
    )


class _SqlNewRows:
    """``new_rows_since`` over a SQL table: the partitions with rows past the cursor."""

    def __init__(self, url: Any, table: str, cursor_column: str, partition_column: str | None):
        self._url = url
        schema, _, name = table.rpartition(".")
        columns = [sa.column(cursor_column)]
        if partition_column:
            columns.append(sa.column(partition_column))
        self._table = sa.table(name, *columns, schema=schema or None)
        self._cursor_column = cursor_column
        self._partition_column = partition_column
        self._engine: sa.Engine | None = None
        self._engine_url: str | None = None

    @classmethod
    def from_arguments(cls, where: str, url: Any, table: str | None, cursor_column: str | None,
                       partition_column: str | None, *, partitioned: bool) -> _SqlNewRows:
        if not table or not cursor_column:
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: url= needs table= and cursor_column= (an increasing column such as an "
                "ingest id or load timestamp)."
            )
        if partitioned and not partition_column:
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: the target is partitioned, so pass partition_column= (the column "
                "holding each row's partition key)."
            )
        if not partitioned and partition_column:
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: partition_column= is only meaningful for a partitioned target."
            )
        try:
            validate_identifier(table, "table")
            validate_identifier(cursor_column, "cursor_column")
            if partition_column:
                validate_identifier(partition_column, "partition_column")
        except InferenceConfigError as exc:
            raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
        return cls(url, table, cursor_column, partition_column)

    def _connect(self) -> sa.Engine | None:
        url = self._url.get_value() if isinstance(self._url, dg.EnvVar) else self._url
        if self._engine is not None and self._engine_url == url:
            return self._engine
        if _missing_sqlite_file(url):
            return None  # connecting would create an empty file where the source will be
        self._engine, self._engine_url = sa.create_engine(url), url
        return self._engine

    def __call__(self, cursor: Any) -> tuple[list[str], Any]:
        engine = self._connect()
        t = self._table
        if engine is None or not sa.inspect(engine).has_table(t.name, schema=t.schema):
            return [], cursor
        column = t.c[self._cursor_column]
        if self._partition_column:
            query = sa.select(t.c[self._partition_column], sa.func.max(column)).group_by(
                t.c[self._partition_column])
        else:
            query = sa.select(sa.literal(None), sa.func.max(column))
        if cursor is not None:
            query = query.where(column > cursor)
        with engine.connect() as conn:
            rows = conn.execute(query).all()
        tops = [top for _, top in rows if top is not None]
        if not tops:
            return [], cursor
        return [key for key, top in rows if top is not None and key is not None], max(tops)


def _describe_target(target: Any, where: str) -> tuple[str, dg.PartitionsDefinition | None]:
    if isinstance(target, dg.JobDefinition | UnresolvedAssetJobDefinition):
        return target.name, target.partitions_def
    assets = list(target) if isinstance(target, list | tuple) else [target]
    if not assets or not all(isinstance(a, dg.AssetsDefinition) for a in assets):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: the target must be an asset job (dg.define_asset_job(...)), an asset "
            f"definition or a list of them, got {type(target).__name__}."
        )
    partitions = {a.partitions_def for a in assets}
    if len(partitions) > 1:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: the target assets have different partitions_defs; one run per "
            "partition needs them to share one (or target an asset job)."
        )
    names = [k.to_user_string() for a in assets for k in a.keys]
    return (names[0] if len(names) == 1 else f"{names[0]}+{len(names) - 1}"), partitions.pop()

