"""The results ledger: one record per (request key, scope, partition), in any SQLAlchemy database.

The ledger is what makes a run resumable and cheap to repeat: before sending, keys already ``ok``
(in any partition) are answered from it; outcomes are written in small batches while the run goes,
so a crash loses at most the requests in flight and one unwritten batch. Records of different
partitions stay separate, so a retry partition knows exactly which of its rows still need work;
``scope`` (the asset key, in Dagster) keeps two assets that share a ledger and a partition apart.

The store is opened as :mod:`.stores` says (SQLite files that several processes share);
PostgreSQL gets native upserts, SQLite upserts sent to the driver as plain tuples.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from ..errors import InferenceConfigError
from ..settings import DEFAULT_LEDGER_TABLE
from .db_timeouts import DEFAULT_ROUND_TRIP_TIMEOUT_S
from .key_lists import KeyList, in_key_order
from .schema import ADDED_COLUMNS, ledger_table, widen_token_columns
from .stores import (
    add_missing_columns,
    make_engine,
    normalize_store_url,
    sqlite_literal,
    validate_identifier,
)

OK, FAILED, DEFERRED, SUPERSEDED = "ok", "failed", "deferred", "superseded"
STATUSES = (OK, FAILED, DEFERRED, SUPERSEDED)

_LOOKUP_BATCH = 500  # keys per statement where each key is a bind parameter
_LOOKUP_COLUMNS = ("request_key", "scope", "partition_key", "response", "prompt_tokens",
                   "completion_tokens")
# Names derived from the ledger table's ("ix_<table>_status_partition", "<table>_claims") must
# fit PostgreSQL's 63-character identifiers too.
_MAX_LEDGER_TABLE = 63 - len("ix__status_partition")


def new_record(key: str, scope: str, partition_key: str, model: str, status: str,
               response: str | None, error: str | None, error_type: str | None,
               prompt_tokens: int, completion_tokens: int, attempts: int,
               endpoint: str | None, latency_ms: float | None, run_id: str | None,
               cached_tokens: int | None = None, cost_usd: float | None = None,
               estimated_prompt_tokens: int | None = None,
               usage_corrected: str | None = None) -> dict[str, Any]:
    """One ledger record as every writer makes it: every column the upsert writes (so all of
    a write's records share its fast road). ``cost_usd``: what the reply cost at the price
    of the endpoint that gave it (None: no reply, or no price). ``estimated_prompt_tokens``:
    ``RowRequest.typical_prompt_tokens``, which plans calibrate by (:mod:`..plan`).
    ``usage_corrected``: what the server reported where its usage was no count or past the
    request's bound (the tokens kept are then that bound, see :mod:`..usage`); None: as
    reported."""
    return {"request_key": key, "scope": scope, "partition_key": partition_key,
            "model": model, "status": status, "response": response, "error": error,
            "error_type": error_type, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "attempts": attempts,
            "endpoint": endpoint, "latency_ms": latency_ms, "run_id": run_id,
            "cached_tokens": cached_tokens, "cost_usd": cost_usd,
            "estimated_prompt_tokens": estimated_prompt_tokens,
            "usage_corrected": usage_corrected}


#: Record fields that all the records of one write usually share (see Ledger._shared_rows).
_SHARED = ("scope", "partition_key", "model", "status", "error", "error_type", "attempts",
           "endpoint", "run_id", "usage_corrected")
_SHARED_FIELDS = operator.itemgetter(*_SHARED)
_SHARED_MIN_RECORDS = 64  # below, a statement of its own per write is not worth compiling


_REQUEST_KEY = operator.itemgetter("request_key")
_ADDED_NULL = dict.fromkeys(ADDED_COLUMNS)


def _with_added_columns(records: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    """Records of an older version's form (its journal's) with the columns added since as
    NULL, so they take the fast roads too; the others as they are."""
    if ADDED_COLUMNS.keys() <= records[0].keys():
        return records
    return [{**_ADDED_NULL, **r} for r in records]


class Ledger:
    """Create with a SQLAlchemy URL; ``None`` keeps an in-memory ledger for one process."""

    def __init__(self, url: str | None, table_name: str = DEFAULT_LEDGER_TABLE, *,
                 statement_timeout_s: float = DEFAULT_ROUND_TRIP_TIMEOUT_S):
        """``statement_timeout_s``: how long a database server may leave a statement
        unanswered before its connection is closed (the statement then fails and is retried)."""
        validate_identifier(table_name, "ledger_table")
        if len(table_name.rpartition(".")[2]) > _MAX_LEDGER_TABLE:
            raise InferenceConfigError(
                f"ledger_table {table_name!r} is too long: at most {_MAX_LEDGER_TABLE} characters "
                "(index and table names derived from it must fit 63)."
            )
        self.url = normalize_store_url(url or "sqlite://")
        self.in_memory = self.url in ("sqlite://", "sqlite:///:memory:")
        self.table = ledger_table(table_name)
        self.engine = make_engine(self.url, round_trip_timeout_s=statement_timeout_s)
        # (SQL, record -> its values, the statement's constants), on the first SQLite upsert
        self._sqlite_upsert: tuple[str, Any, tuple] | None = None
        self._create_table()

    def _create_table(self) -> None:
        try:
            self.table.metadata.create_all(self.engine, checkfirst=True)
        except sa.exc.DatabaseError:
            # Another process created it between our check and our CREATE: fine if it exists now.
            if not sa.inspect(self.engine).has_table(self.table.name, schema=self.table.schema):
                raise
        # A table made by an earlier version gets the columns added since.
        add_missing_columns(self.engine, self.table, ADDED_COLUMNS)
        widen_token_columns(self.engine, self.table)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- reading ---------------------------------------------------------------------------
    def lookup_ok(self, keys: Iterable[str], partition_key: str = "",
                  scope: str = "") -> dict[str, dict[str, Any]]:
        """Answers already paid for: key -> {scope, partition_key, response, tokens}.

        Any ``ok`` record answers; the record of this scope and partition is preferred.
        """
        found: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for row in self._ok_rows(conn, _LOOKUP_COLUMNS, list(keys)):
                key = row[0]
                if key not in found or (row[2] == partition_key and row[1] == scope):
                    found[key] = dict(zip(_LOOKUP_COLUMNS, row, strict=True))
        return found

    def _ok_rows(self, conn: sa.Connection, columns: Sequence[str], keys: list[str],
                 per_key_and_model: bool = False) -> list[tuple]:
        """``SELECT <columns> ... WHERE request_key IN <keys> AND status = 'ok'`` (grouped by
        key and model with ``per_key_and_model``, for aggregate columns).

        On SQLite and PostgreSQL the keys go as ONE parameter (a JSON array read by
        ``json_each``; an array; see `KeyList`)."""
        table = self.engine.dialect.identifier_preparer.format_table(self.table)
        rows: list[tuple] = []
        key_list = KeyList.of(self.engine.dialect.name)
        group_by = " GROUP BY request_key, model" if per_key_and_model else ""
        if key_list is not None and self.engine.dialect.name == "sqlite":
            # Driven by the keys, distinct and in key order (neighbouring probes of the
            # primary key share pages), rather than "request_key IN (SELECT value FROM
            # json_each(?))", which first builds a temporary index of the list: about 0.4 us
            # less per key. The + keeps the planner off the status index (a scan of every ok
            # record) and on the primary key, which starts with request_key.
            sql = (f"SELECT {', '.join(columns)} FROM json_each(?) AS listed CROSS JOIN {table} "
                   f"ON request_key = listed.value WHERE +status = '{OK}'{group_by}")
            for batch in key_list.batches(keys):
                rows += conn.exec_driver_sql(sql, (key_list.encode(sorted(set(batch))),)).all()
        elif key_list is not None:
            sql = (f"SELECT {', '.join(columns)} FROM {table} WHERE request_key "
                   f"{key_list.keys_in} AND status = '{OK}'{group_by}")
            for batch in key_list.batches(keys):
                rows += conn.exec_driver_sql(sql, (key_list.encode(batch),)).all()
        else:
            t = self.table
            query = sa.select(*(sa.literal_column(c) for c in columns)).select_from(t)
            if per_key_and_model:
                query = query.group_by(t.c.request_key, t.c.model)
            for start in range(0, len(keys), _LOOKUP_BATCH):
                rows += conn.execute(query.where(
                    t.c.request_key.in_(keys[start:start + _LOOKUP_BATCH]),
                    t.c.status == OK)).all()
        return rows

    def status_counts(self, partition_key: str | None = None,
                      scope: str | None = None) -> dict[str, int]:
        t = self.table
        query = sa.select(t.c.status, sa.func.count()).group_by(t.c.status)
        if partition_key is not None:
            query = query.where(t.c.partition_key == partition_key)
        if scope is not None:
            query = query.where(t.c.scope == scope)
        with self.engine.connect() as conn:
            counts = dict(conn.execute(query).all())
        return {s: int(counts.get(s, 0)) for s in STATUSES}

    def partitions_needing_retry(self, scope: str | None = None) -> dict[str, dict[str, int]]:
        """Partitions that still hold failed or deferred records, with their counts."""
        counts = self._counts_by_partition(self.table.c.status, (FAILED, DEFERRED), scope)
        return {partition: {FAILED: 0, DEFERRED: 0, **by_status}
                for partition, by_status in counts.items()}

    def failed_by_error_type(self, scope: str | None = None) -> dict[str, dict[str, int]]:
        """Failed records of each partition by error type: ``{partition: {error_type: n}}``
        (so a reader can tell the failures a retry may fix from those it cannot)."""
        return self._counts_by_partition(self.table.c.error_type, (FAILED,), scope)

    def _counts_by_partition(self, column: sa.Column, statuses: tuple[str, ...],
                             scope: str | None) -> dict[str, dict[str, int]]:
        """Records of the given statuses per partition (partitioned ones only), by
        ``column``'s value (None as "unknown")."""
        t = self.table
        query = (
            sa.select(t.c.partition_key, column, sa.func.count())
            .where(t.c.status.in_(statuses), t.c.partition_key != "")
            .group_by(t.c.partition_key, column)
        )
        if scope is not None:
            query = query.where(t.c.scope == scope)
        result: dict[str, dict[str, int]] = {}
        with self.engine.connect() as conn:
            for partition, value, count in conn.execute(query):
                result.setdefault(partition, {})[value or "unknown"] = int(count)
        return result

    def answer_tokens(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """What the answers to ``keys`` cost when they were paid for, by model: ``{model:
        {"answers", "prompt_tokens", "completion_tokens"}}``, with ``cached_tokens`` where
        some were, ``cost_usd`` (the sum of the costs kept) where any answer kept one, and
        then the ``uncosted_prompt_tokens`` and ``uncosted_completion_tokens`` of those kept
        without one (written before costs were, or with no price then).

        Each key counts once, with the ``ok`` record that paid for it, whichever partition or
        scope that was (records copied from the ledger into another partition carry no tokens),
        so the figures stay the same however often the answers are served again. Keys without
        an ``ok`` record are left out.
        """
        totals: dict[str, dict[str, Any]] = {}
        keys = list(dict.fromkeys(keys))
        with self.engine.connect() as conn:
            rows = self._ok_rows(
                conn, ("model", "MAX(prompt_tokens)", "MAX(completion_tokens)",
                       "MAX(cached_tokens)", "MAX(cost_usd)"), keys, per_key_and_model=True)
        for model, prompt_tokens, completion_tokens, cached_tokens, cost in rows:
            held = totals.setdefault(
                model, {"answers": 0, "prompt_tokens": 0, "completion_tokens": 0})
            prompt_tokens, completion_tokens = int(prompt_tokens or 0), int(completion_tokens or 0)
            held["answers"] += 1
            held["prompt_tokens"] += prompt_tokens
            held["completion_tokens"] += completion_tokens
            if cached_tokens:
                held["cached_tokens"] = held.get("cached_tokens", 0) + int(cached_tokens)
            if cost is not None:
                held["cost_usd"] = held.get("cost_usd", 0.0) + float(cost)
            else:
                for name, value in (("uncosted_prompt_tokens", prompt_tokens),
                                    ("uncosted_completion_tokens", completion_tokens)):
                    held[name] = held.get(name, 0) + value
        for held in totals.values():
            if "cost_usd" not in held:  # no cost kept: its tokens say it all
                held.pop("uncosted_prompt_tokens", None)
                held.pop("uncosted_completion_tokens", None)
        return totals

    def records(self, partition_key: str | None = None, scope: str | None = None):
        """The ledger's records as a pandas DataFrame (for inspection and tests)."""
        import pandas as pd

        query = sa.select(self.table)
        if partition_key is not None:
            query = query.where(self.table.c.partition_key == partition_key)
        if scope is not None:
            query = query.where(self.table.c.scope == scope)
        with self.engine.connect() as conn:
            return pd.DataFrame(conn.execute(query).mappings().all(),
                                columns=[c.name for c in self.table.columns])

    # -- writing ---------------------------------------------------------------------------
    def upsert(self, records: Sequence[dict[str, Any]],
               also: Callable[[sa.Connection], None] | None = None) -> None:
        """Insert or update records; an ``ok`` record is never overwritten by a worse status.
        ``also(conn)`` runs in the same transaction (what must commit with the records)."""
        if not records:
            return
        records = _with_added_columns(records)
        now = time.time()
        backend = self.engine.dialect.name
        if backend == "sqlite":
            prepared = self._shared_rows(records, now) or self._positional_rows(records, now)
            if prepared is not None:  # every record has every field: no per-row SQLAlchemy work
                sql, rows = prepared
                in_key_order(rows)
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(sql, rows)
                    if also is not None:
                        also(conn)
                return
        rows = in_key_order([{**_ADDED_NULL, **r, "created_at": now, "updated_at": now}
                             for r in records], key=_REQUEST_KEY)
        with self.engine.begin() as conn:
            if backend in ("sqlite", "postgresql"):
                conn.execute(self._upsert_statement(backend), rows)
            else:
                self._generic_upsert(conn, rows)
            if also is not None:
                also(conn)

    def _upsert_statement(self, backend: str) -> Any:
        t = self.table
        dialect_insert = (sa.dialects.sqlite.insert if backend == "sqlite"
                          else sa.dialects.postgresql.insert)
        stmt = dialect_insert(t)
        updated = {
            c.name: stmt.excluded[c.name]
            for c in t.columns
            if c.name not in ("request_key", "scope", "partition_key", "created_at")
        }
        return stmt.on_conflict_do_update(
            index_elements=[t.c.request_key, t.c.scope, t.c.partition_key],
            set_=updated,
            where=sa.or_(t.c.status != OK, stmt.excluded.status == OK),
        )

    def _compiled_sqlite_upsert(self) -> tuple[str, list[str], tuple]:
        """The SQLite upsert's SQL, its record fields in parameter order, and the values of
        its other parameters (the status compared in its WHERE)."""
        if self._sqlite_upsert is None:
            compiled = self._upsert_statement("sqlite").compile(dialect=self.engine.dialect)
            order = list(compiled.positiontup or ())
            fields = [c.name for c in self.table.columns
                      if c.name not in ("created_at", "updated_at")]
            if order[:len(fields) + 2] != [*fields, "created_at", "updated_at"]:
                raise RuntimeError(f"unexpected parameters of the ledger upsert: {order}")
            constants = tuple(compiled.binds[name].value for name in order[len(fields) + 2:])
            self._sqlite_upsert = (str(compiled), fields, constants)
        return self._sqlite_upsert

    def _positional_rows(self, records: Sequence[dict[str, Any]], now: float
                         ) -> tuple[str, list[tuple]] | None:
        """The upsert and the records as tuples in its parameter order (a run writes
        thousands per batch: building SQLAlchemy's parameters per row costs about a third of
        the write); None when a record lacks a field (the statement path fills defaults)."""
        sql, fields, constants = self._compiled_sqlite_upsert()
        get = operator.itemgetter(*fields)
        tail = (now, now, *constants)
        try:
            return sql, [get(r) + tail for r in records]
        except KeyError:
            return None

    def _shared_rows(self, records: Sequence[dict[str, Any]], now: float
                     ) -> tuple[str, list[tuple]] | None:
        """An upsert with the fields in :data:`_SHARED` and the times as SQL literals, and the
        records as tuples of their other fields, where every record has the same values of
        those (a batch pass's write: one partition, model, endpoint, status and attempt).
        SQLite binds each parameter of each record, at about a quarter of a microsecond: this
        binds 5 per record where the other statement binds 18. None where the records differ,
        or a shared value has no exact literal (see :func:`sqlite_literal`)."""
        if len(records) < _SHARED_MIN_RECORDS:
            return None
        records = _with_added_columns(records)
        shared_of = _SHARED_FIELDS
        try:
            shared = shared_of(records[0])
            if any(shared_of(r) != shared for r in records):
                return None
        except KeyError:
            return None
        sql, fields, constants = self._compiled_sqlite_upsert()
        literals = dict(zip(_SHARED, map(sqlite_literal, shared), strict=True))
        literals["created_at"] = literals["updated_at"] = repr(float(now))
        if None in literals.values() or not all(type(c) is str for c in constants):
            return None
        holes = ", ".join(["?"] * (len(fields) + 2))
        head, found, tail = sql.partition(holes)
        for constant in constants:  # the WHERE's parameters, in order
            tail = tail.replace("?", sqlite_literal(constant), 1)
        if not found or "?" in head or "?" in tail:
            raise RuntimeError(f"unexpected SQL of the ledger upsert: {sql}")
        own = [f for f in fields if f not in literals]
        shared_sql = head + ", ".join(literals.get(f, "?") for f in (
            *fields, "created_at", "updated_at")) + tail
        get = operator.itemgetter(*own)
        try:
            return shared_sql, [get(r) for r in records]
        except KeyError:  # a record of an older version (a journal's): the statement path
            return None

    def _generic_upsert(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        t = self.table
        for row in rows:
            where = sa.and_(t.c.request_key == row["request_key"], t.c.scope == row["scope"],
                            t.c.partition_key == row["partition_key"])
            current = conn.execute(sa.select(t.c.status).where(where)).scalar()
            if current is None:
                conn.execute(t.insert().values(**row))
            elif current != OK or row["status"] == OK:
                values = {k: v for k, v in row.items() if k != "created_at"}
                conn.execute(t.update().where(where).values(**values))

    def mark_superseded(self, partition_key: str, keep_keys: Iterable[str],
                        scope: str = "") -> int:
        """Retire a partition's failed/deferred records whose request is no longer asked for
        (its input changed), so they stop making it a retry partition."""
        keep = set(keep_keys)
        t = self.table
        with self.engine.begin() as conn:
            stale = [
                key for (key,) in conn.execute(
                    sa.select(t.c.request_key).where(
                        t.c.partition_key == partition_key, t.c.scope == scope,
                        t.c.status.in_((FAILED, DEFERRED)),
                    )
                )
                if key not in keep
            ]
            for start in range(0, len(stale), _LOOKUP_BATCH):
                conn.execute(
                    t.update()
                    .where(t.c.partition_key == partition_key, t.c.scope == scope,
                           t.c.request_key.in_(stale[start:start + _LOOKUP_BATCH]))
                    .values(status=SUPERSEDED, updated_at=time.time())
                )
        return len(stale)
