"""Which partitions wait for which batches: what the batch-collect and retry sensors read.

Two records say a partition's rows wait for a batch:

* the batch book's batch row, for the rows whose lines a run of the partition put in its own
  batches: the rows have no ledger record until that partition's run writes their outcomes
  (and sets the batch's ``delivered_at``);
* a deferred ledger record "waiting for batch <id>", for a row whose key was already in another
  run's batch (another partition's, or a crashed run's).

:func:`poll_waiting_partitions` is the batch-collect sensor's one question to the core: which
partitions wait, for which batches, and what the provider says of each now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..delivery.batch_api.book import COLLECTED, COLLECTING, ENDED, SUBMIT_FAILED, BatchBook
from ..delivery.batch_api.collect import BatchCollector
from ..delivery.batch_api.providers import protocol_for
from ..ledger.deferrals import waiting_in_ledger
from ..ledger.table import DEFAULT_LEDGER_TABLE, Ledger
from ..settings import InferenceSettings
from .deadline import iso

# Book statuses after which a batch makes its rows wait no longer.
_DONE = (*ENDED, COLLECTED, SUBMIT_FAILED, COLLECTING)


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


@dataclass(frozen=True)
class PartitionWait:
    """One partition's rows that wait for provider batches, as the provider says now."""

    partition: str
    batches: dict[str, int]  # each batch the rows wait for (its name) -> rows waiting for it
    pending: dict[str, str]  # the batches not ended yet, by name -> their status
    switch_at: float | None  # when a deadline sends its rows online (epoch seconds), or None

    @property
    def switch_time(self) -> str | None:
        """:attr:`switch_at` as ISO 8601 text (UTC), for messages."""
        return iso(self.switch_at)

    def switch_due(self, now: float) -> bool:
        """Whether the deadline's switch time has come with batches still unfinished."""
        return bool(self.pending) and self.switch_at is not None and now >= self.switch_at


def poll_waiting_partitions(settings: InferenceSettings, scope: str, *,
                            log: Any = None) -> list[PartitionWait]:
    """The partitions of ``scope`` whose rows wait for batches, by partition key, each batch
    polled at its provider now (a ``batches.retrieve`` each, recorded in the batch book); empty,
    and nothing polled, when none waits. Reads the ledger ``settings`` name."""
    ledger = Ledger(settings.store_url, settings.ledger_table)
    try:
        waits = waiting_for_batches(ledger, scope)
        if not waits:
            return []
        protocols = {e.name: protocol_for(e) for e in settings.endpoints if e.batch_api}
        try:
            book = BatchBook(ledger)
            switch_times = book.switch_times(scope)
            BatchCollector(book, protocols, log=log).refresh_blocking(collect=False)
            status: dict[str, str] = {}
            for row in book.unfinished(protocols):
                status[row["submission_id"]] = row["status"]
                if row["batch_id"]:
                    status[row["batch_id"]] = row["status"]
        finally:
            for protocol in protocols.values():
                protocol.close()
    finally:
        ledger.dispose()
    # A batch no longer unfinished in the book was collected (or never created).
    return [PartitionWait(
        partition, dict(waits[partition]),
        {n: status[n] for n in sorted(waits[partition]) if status.get(n, COLLECTED) not in _DONE},
        switch_times.get(partition)) for partition in sorted(waits)]
