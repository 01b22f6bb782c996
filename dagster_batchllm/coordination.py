"""Sharing endpoints between runs: each process takes its share of every endpoint's limits.

Dagster caps concurrent steps, not requests or tokens: a backfill that launches one run per
partition would multiply the load on the endpoints. So every inference run registers itself in a
small table next to the ledger (the database all runs share anyway) and heartbeats; an endpoint
used by N live runs gives each 1/N of its ``max_concurrency``, ``requests_per_minute`` and
``tokens_per_minute``. A run that joins others waits one heartbeat before sending, so the others
have shrunk before it grows; a run that dies simply stops heartbeating and its share returns to
the others after ``stale_after_s``.
"""

from __future__ import annotations

import os
import time
import uuid

import sqlalchemy as sa


def _holders_table(ledger_table: sa.Table) -> sa.Table:
    metadata = sa.MetaData(schema=ledger_table.schema)
    return sa.Table(
        f"{ledger_table.name}_holders",
        metadata,
        sa.Column("holder_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(255), primary_key=True),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("description", sa.String(255)),
    )


class RunCoordinator:
    """Registers this run as a user of some endpoints and reports how many runs share each."""

    def __init__(self, engine: sa.Engine, ledger_table: sa.Table, endpoints: list[str], *,
                 stale_after_s: float = 10.0, description: str | None = None):
        self.engine = engine
        self.table = _holders_table(ledger_table)
        self.endpoints = endpoints
        self.stale_after_s = stale_after_s
        self.holder_id = uuid.uuid4().hex
        self.description = (description or f"pid {os.getpid()}")[:255]
        try:
            self.table.metadata.create_all(engine, checkfirst=True)
        except sa.exc.DatabaseError:
            if not sa.inspect(engine).has_table(self.table.name, schema=self.table.schema):
                raise

    def heartbeat(self) -> dict[str, int]:
        """Renew this run's registration; return live runs per endpoint (this one included)."""
        t = self.table
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(t.delete().where(t.c.heartbeat_at < now - self.stale_after_s))
            conn.execute(t.delete().where(t.c.holder_id == self.holder_id))
            conn.execute(t.insert(), [
                {"holder_id": self.holder_id, "endpoint": name, "heartbeat_at": now,
                 "description": self.description}
                for name in self.endpoints
            ])
            counts = dict(conn.execute(
                sa.select(t.c.endpoint, sa.func.count()).where(t.c.endpoint.in_(self.endpoints))
                .group_by(t.c.endpoint)
            ).all())
        return {name: max(1, int(counts.get(name, 1))) for name in self.endpoints}

    def leave(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.table.delete().where(self.table.c.holder_id == self.holder_id))
