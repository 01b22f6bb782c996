"""The ledger's statements about deferred and failed records that the batch API needs.

A batch pass defers rows "waiting for batch <id>", renames those deferrals once the provider
names the batch, forgets a partition's deferrals when their keys go into its own batch, and
asks which keys failed; the sensors ask which partitions wait for batches, and the retry
sensor which rows a run of a partition would send again (:func:`unfinished_partitions`). Every
one of those statements on the ledger's table is here, beside the ledger's own (:mod:`.table`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from .key_lists import KeyList
from .table import DEFERRED, FAILED, Ledger

_CHUNK = 500  # keys per IN list where the dialect takes no key list as one parameter
_WAIT_NAME = re.compile(r"waiting for batch (?:\(file )?([A-Za-z0-9_\-]+)")


class Deferrals:
    """The statements of one ledger, prepared once (a pass forgets deferrals per parcel)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.table = t = ledger.table
        engine = ledger.engine
        self._key_list = KeyList.of(engine.dialect.name)
        self._forget = None
        if self._key_list is not None:
            preparer = engine.dialect.identifier_preparer
            name = (f"{preparer.quote_schema(t.schema)}.{preparer.quote(t.name)}" if t.schema
                    else preparer.quote(t.name))
            mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
            # SQLite: + keeps the planner on the primary key (see Ledger._ok_rows).
            status = "+status" if mark == "?" else "status"
            self._forget = (f"DELETE FROM {name} WHERE request_key {self._key_list.keys_in} "
                            f"AND scope = {mark} AND partition_key = {mark} "
                            f"AND {status} = '{DEFERRED}'")

    def forget(self, conn: sa.Connection, keys: list[str], scope: str, partition: str) -> None:
        """Delete the partition's deferred records of ``keys`` (in the caller's transaction):
        their lines are in the partition's own batch now, which says they wait."""
        t = self.table
        if conn.execute(sa.select(t.c.request_key).where(  # usually none: a probe per key saved
                t.c.status == DEFERRED, t.c.scope == scope,
                t.c.partition_key == partition).limit(1)).first() is None:
            return
        if self._forget is None:
            for start in range(0, len(keys), _CHUNK):
                conn.execute(t.delete().where(
                    t.c.request_key.in_(keys[start:start + _CHUNK]), t.c.scope == scope,
                    t.c.partition_key == partition, t.c.status == DEFERRED))
            return
        for batch in self._key_list.batches(keys):
            conn.exec_driver_sql(self._forget, (self._key_list.encode(batch), scope, partition))

    def failed_keys(self, scope: str, partition: str) -> set[str]:
        """The keys of the partition's failed records (through the status index)."""
        t = self.table
        with self.ledger.engine.connect() as conn:
            return set(conn.execute(sa.select(t.c.request_key).where(
                t.c.status == FAILED, t.c.scope == scope,
                t.c.partition_key == partition)).scalars())

    def rename(self, scope: str, partition: str, renamed: Mapping[str, str]) -> None:
        """Deferred records whose error is a key of ``renamed`` get its value instead."""
        t = self.table
        with self.ledger.engine.begin() as conn:
            for old, new in renamed.items():
                if old != new:
                    conn.execute(t.update().where(
                        t.c.status == DEFERRED, t.c.error == old, t.c.scope == scope,
                        t.c.partition_key == partition).values(error=new))


def waiting_in_ledger(ledger: Ledger, scope: str | None = None) -> dict[str, dict[str, int]]:
    """The deferred ledger records that wait for a batch, per partition and batch (the part
    of the ledger's deferred rows that a retry would not help)."""
    t = ledger.table
    query = (sa.select(t.c.partition_key, t.c.error, sa.func.count())
             .where(t.c.status == DEFERRED, t.c.error.like("deferred: waiting for batch%"))
             .group_by(t.c.partition_key, t.c.error))
    if scope is not None:
        query = query.where(t.c.scope == scope)
    found: dict[str, dict[str, int]] = {}
    with ledger.engine.connect() as conn:
        for partition, error, rows in conn.execute(query):
            match = _WAIT_NAME.search(error or "")
            if match:
                names = found.setdefault(partition, {})
                names[match.group(1)] = names.get(match.group(1), 0) + int(rows)
    return found


@dataclass(frozen=True)
class Unfinished:
    """A partition's records that a run of it would send again."""

    failed: dict[str, int]  # its failed records by error type
    deferred: int  # its deferred records, less those that wait for a provider's batch


def unfinished_partitions(ledger: Ledger, scope: str | None = None) -> dict[str, Unfinished]:
    """The partitions (of ``scope``) with failed or deferred records. Rows that wait in a
    provider's batch are not counted: the batch-collect sensor runs their partition when the
    batch ends (those whose lines are their own partition's have no deferred record at all)."""
    failed = ledger.failed_by_error_type(scope=scope)
    in_batches = {p: sum(names.values()) for p, names in waiting_in_ledger(ledger, scope).items()}
    return {partition: Unfinished(failed.get(partition, {}),
                                  by_status[DEFERRED] - in_batches.get(partition, 0))
            for partition, by_status in ledger.partitions_needing_retry(scope=scope).items()}


__all__ = ["Deferrals", "Unfinished", "unfinished_partitions", "waiting_in_ledger"]
