"""The ledger table's columns, and what opening an older ledger changes in them.

Columns added since the first ledgers were made are nullable and added on open
(:func:`~.stores.add_missing_columns` of :data:`ADDED_COLUMNS`); token counts are 64-bit, and a
PostgreSQL ledger made with 32-bit ones is widened on open (:func:`widen_token_columns`).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

log = logging.getLogger("dagster_batchllm")

# Columns added after the first ledgers were made: nullable, and added to an older table when
# it is opened (Ledger._create_table). A record that lacks them (a journal of an older
# version) writes NULL.
ADDED_COLUMNS = {"cached_tokens": sa.BigInteger, "cost_usd": sa.Float,
                 "estimated_prompt_tokens": sa.BigInteger, "usage_corrected": sa.Text}
# Token counts are 64-bit: the figures kept are held to each request's bound (see ..usage),
# and a count never overflows its column whatever a server or an old journal says. Ledgers
# made with 32-bit columns are widened on open (PostgreSQL; SQLite's integers are 64-bit).
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens",
                 "estimated_prompt_tokens")


def ledger_table(name: str) -> sa.Table:
    """The ledger table ``name`` (``schema.table`` or ``table``): one record per (request key,
    scope, partition)."""
    schema, _, table = name.rpartition(".")
    metadata = sa.MetaData(schema=schema or None)
    return sa.Table(
        table,
        metadata,
        sa.Column("request_key", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(255), primary_key=True, default=""),
        sa.Column("partition_key", sa.String(255), primary_key=True, default=""),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("response", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("error_type", sa.String(64)),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False, default=0),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False, default=0),
        sa.Column("attempts", sa.Integer, nullable=False, default=0),
        sa.Column("endpoint", sa.String(255)),
        sa.Column("latency_ms", sa.Float),
        sa.Column("run_id", sa.String(64)),
        # Before the times: the SQLite upsert's parameters are the record's fields, then them.
        *(sa.Column(name, kind) for name, kind in ADDED_COLUMNS.items()),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        # No index on (request_key, status): the primary key starts with request_key, which
        # is what lookups need (see Ledger._ok_rows); a second random-key index cost about a
        # third of every insert. Ledgers made before keep theirs, unused.
        sa.Index(f"ix_{table}_status_partition", "status", "scope", "partition_key"),
    )


def widen_token_columns(engine: sa.Engine, table: sa.Table) -> None:
    """Make a PostgreSQL ledger's 32-bit token columns (made before they were 64-bit) 64-bit,
    in one statement. SQLite's integers are 64-bit whatever the declared type; another
    database keeps its columns.

    PostgreSQL rewrites the table for it, holding it meanwhile, so this is tried only where
    it is quick: at most :data:`_WIDEN_MOST_ROWS` records (by the planner's count), and the
    table's lock got within 5 s (runs writing to it are not held up longer). Where it is not
    tried or does not succeed, a warning says the statement to run by hand, and the ledger
    works on: the figures written are held to each request's bound (:mod:`..usage`), far
    below 2^31. Two processes opening it at once may both try; one finds it done."""
    if engine.dialect.name != "postgresql":
        return

    def narrow() -> list[str]:
        columns = sa.inspect(engine).get_columns(table.name, schema=table.schema)
        return [c["name"] for c in columns if c["name"] in TOKEN_COLUMNS
                and isinstance(c["type"], sa.Integer)
                and not isinstance(c["type"], sa.BigInteger)]

    names = narrow()
    if not names:
        return
    quoted = engine.dialect.identifier_preparer.format_table(table)
    statement = f"ALTER TABLE {quoted} " + ", ".join(
        f"ALTER COLUMN {name} TYPE BIGINT" for name in names)
    why = ""
    try:
        with engine.begin() as conn:
            rows = conn.execute(sa.text(
                "SELECT reltuples FROM pg_class WHERE oid = to_regclass(:name)"),
                {"name": quoted}).scalar()
            if rows is not None and rows > _WIDEN_MOST_ROWS:
                why = f"it holds about {int(rows):,} records"
            else:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '5s'")
                conn.exec_driver_sql(statement)
    except sa.exc.DatabaseError as exc:
        if not narrow():
            return  # another process widened them meanwhile
        why = f"{type(exc.orig or exc).__name__}: {str(exc.orig or exc).strip()[:200]}"
    if why:
        log.warning(
            "batchllm: the ledger %s keeps token counts in 32-bit columns (%s), which were "
            "not widened on open (%s). It works on (the counts written are held to each "
            "request's bound); to widen them, run when no run writes to it: %s;",
            quoted, ", ".join(names), why, statement)


#: Ledgers of more records are not widened on open (the rewrite holds the table too long).
_WIDEN_MOST_ROWS = 2_000_000


__all__ = ["ADDED_COLUMNS", "TOKEN_COLUMNS", "ledger_table", "widen_token_columns"]
