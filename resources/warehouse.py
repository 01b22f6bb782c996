"""The example's embedded warehouse: tables in one SQLite file, through SQLAlchemy.

SQLite rather than DuckDB because a backfill runs one process per partition and DuckDB lets only
one process open a file for writing; SQLite in WAL mode takes them all. Every table carries the
daily partition column ``call_date``; writing a partition replaces exactly its rows.
"""


import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from dagster_batchllm.core.ledger.stores import make_engine, redact_url, validate_identifier

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT / "data"
DATASET = REPO_ROOT / "assets" / "data" / "call_center_transcripts.csv.gz"
SOURCE_TABLE = "call_center_transcripts"
PARTITION_COLUMN = "call_date"


class WarehouseResource(dg.ConfigurableResource):
    """Read and write partitioned tables in the example's SQLite warehouse."""

    url: str = Field(
        default=f"sqlite:///{DEFAULT_DATA_DIR / 'warehouse.db'}",
        description="SQLAlchemy URL of the warehouse database.",
    )
    seed_source: bool = Field(
        default=True,
        description="Create the raw transcripts table from the shipped dataset on first use.",
    )

    _engine: sa.Engine | None = PrivateAttr(default=None)

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            url = sa.engine.make_url(self.url)
            if url.get_backend_name() == "sqlite" and url.database:
                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
            # The ledger's engine setup (WAL, busy timeout, BEGIN IMMEDIATE) is what several
            # processes writing one SQLite file need; reuse it rather than repeat it.
            self._engine = make_engine(self.url)
            if self.seed_source:
                self.ensure_source_table()
        return self._engine

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.engine  # noqa: B018 - create the file and seed it before the first step reads it

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    def table_exists(self, table: str) -> bool:
        return sa.inspect(self.engine).has_table(validate_identifier(table, "table"))

    def ensure_source_table(self) -> None:
        """Load the shipped transcripts into ``call_center_transcripts`` if it is missing.

        Every step process sets the resource up, so several seed a fresh warehouse at once:
        the check and the load are one writing transaction (BEGIN IMMEDIATE on SQLite), or
        each would see no table and the raw calls would be loaded twice."""
        if sa.inspect(self._engine).has_table(SOURCE_TABLE):
            return
        # Null transcripts are empty CSV fields (read as NaN); blank ones are a lone space.
        calls = pd.read_csv(DATASET, dtype=str)
        with self._engine.begin() as conn:
            if not sa.inspect(conn).has_table(SOURCE_TABLE):
                self._append(conn, SOURCE_TABLE, calls.astype(object).where(calls.notna(), None))

    def append_rows(self, table: str, df: pd.DataFrame) -> int:
        """Append rows, stamping each with an increasing ``ingest_id`` (the new-data cursor)."""
        validate_identifier(table, "table")
        with self.engine.begin() as conn:
            return self._append(conn, table, df)

    @staticmethod
    def _append(conn: sa.Connection, table: str, df: pd.DataFrame) -> int:
        df = _with_partition_column(df)
        start = 0
        if sa.inspect(conn).has_table(table):
            start = conn.execute(
                sa.text(f'SELECT COALESCE(MAX(ingest_id), 0) FROM "{table}"')
            ).scalar_one()
        df = df.assign(ingest_id=range(start + 1, start + 1 + len(df)))
        _storable(df).to_sql(table, conn, if_exists="append", index=False)
        return len(df)

    def read_partition(self, table: str, partition_key: str | Sequence[str]) -> pd.DataFrame:
        """Rows of one partition (or several), in their stored order."""
        validate_identifier(table, "table")
        keys = [partition_key] if isinstance(partition_key, str) else list(partition_key)
        if not self.table_exists(table):
            raise dg.Failure(f"Table '{table}' does not exist yet in {self.display_url}; "
                             "materialize its asset first.")
        query = sa.text(
            f'SELECT * FROM "{table}" WHERE {PARTITION_COLUMN} IN :keys ORDER BY rowid'
        ).bindparams(sa.bindparam("keys", expanding=True))
        with self.engine.connect() as conn:
            return pd.read_sql(query, conn, params={"keys": keys})

    def read_table(self, table: str) -> pd.DataFrame:
        validate_identifier(table, "table")
        with self.engine.connect() as conn:
            return pd.read_sql(sa.text(f'SELECT * FROM "{table}" ORDER BY rowid'), conn)

    def write_partition(self, table: str, df: pd.DataFrame,
                        partition_key: str | Sequence[str]) -> None:
        """Replace the rows of the given partition(s) with ``df``, in one transaction."""
        validate_identifier(table, "table")
        keys = [partition_key] if isinstance(partition_key, str) else list(partition_key)
        df = _with_partition_column(df)
        with self.engine.begin() as conn:
            if sa.inspect(conn).has_table(table):
                conn.execute(
                    sa.text(f'DELETE FROM "{table}" WHERE {PARTITION_COLUMN} IN :keys')
                    .bindparams(sa.bindparam("keys", expanding=True)),
                    {"keys": keys},
                )
            _storable(df).to_sql(table, conn, if_exists="append", index=False)

    def write_table(self, table: str, df: pd.DataFrame) -> None:
        validate_identifier(table, "table")
        with self.engine.begin() as conn:
            _storable(df).to_sql(table, conn, if_exists="replace", index=False)


def _with_partition_column(df: pd.DataFrame) -> pd.DataFrame:
    if PARTITION_COLUMN in df.columns or "call_timestamp" not in df.columns:
        return df
    return df.assign(**{PARTITION_COLUMN: df["call_timestamp"].astype(str).str[:10]})


def _storable(df: pd.DataFrame) -> pd.DataFrame:
    """SQLite stores text and numbers; dicts and lists (structured replies) become JSON,
    numpy vectors (embeddings) BLOBs of little-endian float32 (``vector_from_blob`` reads
    them back)."""
    out = df.copy()
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = out[column].map(_storable_value)
    return out


def _storable_value(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, np.ndarray):
        return value.astype("<f4").tobytes()
    return value


def vector_from_blob(value: Any) -> np.ndarray | None:
    """A stored embedding (float32 BLOB) as a numpy vector; None stays None."""
    return None if value is None else np.frombuffer(value, dtype="<f4")


class WarehouseIOManager(dg.ConfigurableIOManager):
    """Stores each asset as a table named after it; partitions replace their own rows."""

    warehouse: WarehouseResource

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        table = context.asset_key.path[-1]
        if context.has_asset_partitions:
            self.warehouse.write_partition(table, obj, context.asset_partition_keys)
        else:
            self.warehouse.write_table(table, obj)
        context.add_output_metadata({
            "dagster/table_name": f"main.{table}",
            "warehouse": self.warehouse.display_url,
        })

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        table = context.asset_key.path[-1]
        if context.has_asset_partitions:
            return self.warehouse.read_partition(table, context.asset_partition_keys)
        return self.warehouse.read_table(table)
