"""Which partitions wait for which batches: what the batch-collect and retry sensors read.

Two records say a partition's rows wait for a batch:

* the batch book's batch row, for the rows whose lines a run of the partition put in its own
  batches: the rows have no ledger record until that partition's run writes their outcomes
  (and sets the batch's ``delivered_at``);
* a deferred ledger record "waiting for batch <id>", for a row whose key was already in another
  run's batch (another partition's, or a crashed run's).
"""

from __future__ import annotations

import sqlalchemy as sa

from ...ledger.deferrals import waiting_in_ledger
from ...ledger.table import DEFAULT_LEDGER_TABLE, Ledger
from .book import BatchBook


def waiting_for_batches(ledger: Ledger | str, scope: str | None = None, *,
                        table_name: str = DEFAULT_LEDGER_TABLE) -> dict[str, dict[str, int]]:
    """Rows that wait for a batch, per partition: ``{partition: {batch: rows}}`` (the
    batch's provider id, or its submission id before the provider gave one). ``ledger``: a
    :class:`Ledger` (``llm.ledger``) or the store URL of one (``table_name`` its table)."""
    if isinstance(ledger, str):
        opened = Ledger(ledger, table_name)
        try:
            return waiting_for_batches(opened, scope)
        finally:
            opened.dispose()
    if not isinstance(ledger, Ledger):
        raise TypeError(f"waiting_for_batches takes a Ledger (llm.ledger) or its store URL, "
                        f"got {type(ledger).__name__}")
    found = waiting_in_ledger(ledger, scope)
    if not sa.inspect(ledger.engine).has_table(
            f"{ledger.table.name}_batches", schema=ledger.table.schema):
        return found
    batches = BatchBook(ledger).batches
    query = (sa.select(batches.c.partition_key,
                       sa.func.coalesce(batches.c.batch_id, batches.c.submission_id),
                       batches.c.lines)
             .where(batches.c.delivered_at.is_(None)))
    if scope is not None:
        query = query.where(batches.c.scope == scope)
    with ledger.engine.connect() as conn:
        for partition, name, lines in conn.execute(query):
            names = found.setdefault(partition, {})
            names[name] = names.get(name, 0) + int(lines or 0)
    return found


__all__ = ["waiting_for_batches", "waiting_in_ledger"]
