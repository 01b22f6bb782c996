"""A token budget shared by every Spark task of one call, kept in the ledger database.

The driver creates one row in ``<ledger_table>_budgets`` holding the total. A task *claims* a
grant before it sends a batch (at most what the batch could use, and at most its fair part of
what is left, so one big batch cannot take it all while other tasks wait), runs ``infer`` with
``token_budget=grant`` and then *settles*: what the replies used is added to ``spent`` and the
rest of the grant goes back. Claims are serialized by the database (a row lock
on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so the tasks together never spend more than the
total, however many run at once and on however many machines share the database.

A task killed between claim and settle leaves its grant counted as used: the budget errs on the
side of spending less, never more.

Example::

    >>> from dagster_batchllm.spark.budget import SharedTokenBudget
    >>> budget = SharedTokenBudget.create("sqlite://", "batchllm_requests", total=1_000)
    >>> budget.claim(600), budget.claim(600)  # the second gets what is left
    (600, 400)
    >>> budget.settle(600, spent=250)  # the 350 tokens not used go back
    >>> budget.settle(400, spent=0)
    >>> budget.snapshot()["remaining"]
    750
    >>> budget.claim(600, parts=2, at_least=100)  # a fair part: half of what is left
    375
    >>> budget.close()
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import sqlalchemy as sa

from ..core import InferenceConfigError, Ledger, StoreLocation, validate_identifier


def _budget_table(ledger_table: str) -> sa.Table:
    schema, _, table = ledger_table.rpartition(".")
    name = validate_identifier(f"{table}_budgets", "budget table")
    return sa.Table(
        name,
        sa.MetaData(schema=schema or None),
        sa.Column("budget_id", sa.String(64), primary_key=True),
        sa.Column("total", sa.BigInteger, nullable=False),
        sa.Column("granted", sa.BigInteger, nullable=False, default=0),
        sa.Column("spent", sa.BigInteger, nullable=False, default=0),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def require_shared_store(store_url: str | None, what: str) -> str:
    """What Spark tasks share through the ledger needs a database they all reach."""
    if not store_url or StoreLocation.of(store_url).in_memory:
        raise InferenceConfigError(
            f"Spark tasks share {what} through the ledger database, so store_url must be one "
            "every executor reaches: PostgreSQL on a cluster, or a SQLite file in local mode "
            f"(got {store_url!r})."
        )
    return store_url


class SharedTokenBudget:
    """One budget row; ``engine`` is usually the ledger's, so no extra connections are opened."""

    def __init__(self, engine: sa.Engine, ledger_table: str, budget_id: str,
                 *, owns_engine: bool = False):
        self.engine = engine
        self.table = _budget_table(ledger_table)
        self.budget_id = budget_id
        self._owns_engine = owns_engine

    @classmethod
    def create(cls, store_url: str, ledger_table: str, *, total: int,
               budget_id: str | None = None) -> SharedTokenBudget:
        """Create the table if needed and a fresh budget row (driver side)."""
        if total < 0:
            raise InferenceConfigError("token_budget must not be negative.")
        engine = Ledger(store_url, ledger_table).engine
        budget = cls(engine, ledger_table, budget_id or uuid.uuid4().hex, owns_engine=True)
        try:
            budget.table.metadata.create_all(engine, checkfirst=True)
        except sa.exc.DatabaseError:
            # Another driver created it between the check and the CREATE.
            if not sa.inspect(engine).has_table(budget.table.name, schema=budget.table.schema):
                raise
        now = time.time()
        with engine.begin() as conn:
            conn.execute(budget.table.insert().values(
                budget_id=budget.budget_id, total=int(total), granted=0, spent=0,
                created_at=now, updated_at=now))
        return budget

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    def _where(self) -> Any:
        return self.table.c.budget_id == self.budget_id

    def claim(self, wanted: int, *, parts: int = 1, at_least: int = 0) -> int:
        """Take up to ``wanted`` tokens from what is left; returns the grant (may be 0).

        With ``parts`` > 1 (tasks sharing the budget at once) a grant is at most 1/parts of
        what is left, but at least ``at_least`` (one request's worth, so it can make progress).
        """
        t = self.table
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(t.c.total, t.c.granted, t.c.spent).where(self._where())
                .with_for_update()
            ).one_or_none()
            if row is None:
                raise InferenceConfigError(
                    f"token budget {self.budget_id} does not exist in {t.name}")
            available = max(0, row.total - row.granted - row.spent)
            fair = max(int(at_least), -(-available // max(1, parts)))
            grant = min(int(wanted), available, fair)
            if grant:
                conn.execute(t.update().where(self._where()).values(
                    granted=t.c.granted + grant, updated_at=time.time()))
        return grant

    def settle(self, granted: int, spent: int) -> None:
        """Give a grant back and charge what the replies used.

        ``spent`` is the servers' own count; it is charged in full even in the (tokenizer-bug)
        case where it exceeds the grant, so the row always tells the truth.
        """
        if not granted and not spent:
            return
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(t.update().where(self._where()).values(
                granted=t.c.granted - int(granted),
                spent=t.c.spent + int(spent),
                updated_at=time.time()))

    def snapshot(self) -> dict[str, int]:
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.c.total, t.c.granted, t.c.spent).where(self._where())).one()
        return {"total": row.total, "granted": row.granted, "spent": row.spent,
                "remaining": row.total - row.granted - row.spent}
