"""Run Databricks' documented examples (:mod:`.documented`) on DuckDB and SQLite as written.

Each run translates the example with ``execute(..., dialect="databricks")`` on a fresh
connection holding the tables it reads, and compares the result types with the documented ones.
:mod:`.spark_compat` does the same in Spark SQL; ``bench/sql_compat.py`` prints the runs side
by side and ``tests/sql/test_documented_examples.py`` keeps them from regressing.

Example::

    from dagster_batchllm.testing.databricks.compat import run_on_duckdb
    from dagster_batchllm.testing.databricks.documented import EXAMPLES, SAMPLE_TABLES

    run = run_on_duckdb(EXAMPLES[5], llm, sample_frames())  # llm: an InferenceClient
    run.as_documented, run.types  # True, {0: 'STRING'}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...ai_functions.types import SQLType, parse_type
from .documented import SAMPLE_TABLES, DocumentedExample


@dataclass(frozen=True)
class ExampleRun:
    """What one engine made of one documented example."""

    example: str
    engine: str  # "duckdb", "sqlite" or "spark"
    translated: bool | None  # None: the engine reads Databricks SQL itself (Spark)
    ran: bool
    types: Mapping[str | int, str]  # checked result column -> the type it had, in Databricks' DDL
    types_match: bool | None  # None: nothing documented to compare (or it did not run)
    error: str | None = None  # why it was not translated or did not run (its first line)

    @property
    def as_documented(self) -> bool:
        """Ran, with the documented result types (where the docs give any)."""
        return self.ran and self.types_match is not False


def sample_frames(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:data:`~.documented.SAMPLE_TABLES` as pandas DataFrames, with ``extra`` tables added."""
    import pandas as pd

    frames = {name: pd.DataFrame(columns) for name, columns in SAMPLE_TABLES.items()}
    frames.update(extra or {})
    return frames


def transcripts_frame(path: Any) -> Any:
    """The call-center dataset (``assets/data/call_center_transcripts.csv.gz``) as the
    pipeline example reads it: every row, ``call_timestamp`` a timestamp."""
    import pandas as pd

    frame = pd.read_csv(path, dtype=str)
    frame["call_timestamp"] = pd.to_datetime(frame["call_timestamp"])
    return frame


def run_on_duckdb(example: DocumentedExample, llm: Any, tables: Mapping[str, Any],
                  *, default_model: str | None = None) -> ExampleRun:
    """Run ``example`` on a fresh in-memory DuckDB connection holding ``tables``."""
    import duckdb

    from ...sql.api import register_ai_functions

    with duckdb.connect() as con:
        for name in example.tables:
            _duckdb_table(con, name, tables[name])
        with register_ai_functions(con, llm, default_model=default_model):
            cursor = _executed(example, "duckdb", con)
            if isinstance(cursor, ExampleRun):
                return cursor
            description = cursor.description or []
            cursor.fetchall()
    found = {i: _duckdb_ddl(column[1]) for i, column in enumerate(description)}
    names = {column[0]: i for i, column in enumerate(description)}
    return compared_run(example, "duckdb", True, found, names)


def run_on_sqlite(example: DocumentedExample, llm: Any, tables: Mapping[str, Any],
                  *, default_model: str | None = None) -> ExampleRun:
    """Run ``example`` on a fresh in-memory SQLite database holding ``tables``.

    SQLite has no column types of its own: a result's type is read from its values (text,
    a number, or JSON text holding an object for a STRUCT).
    """
    import sqlite3

    from ...sql.api import register_ai_functions

    con = sqlite3.connect(":memory:")
    try:
        for name in example.tables:
            problem = _sqlite_table(con, name, tables[name])
            if problem:
                return ExampleRun(example.name, "sqlite", None, False, {}, None,
                                  f"setup: {problem}")
        with register_ai_functions(con, llm, default_model=default_model):
            cursor = _executed(example, "sqlite", con)
            if isinstance(cursor, ExampleRun):
                return cursor
            rows = cursor.fetchall()
            description = cursor.description or []
    finally:
        con.close()
    found = {i: _sqlite_ddl([row[i] for row in rows]) for i in range(len(description))}
    names = {column[0]: i for i, column in enumerate(description)}
    return compared_run(example, "sqlite", True, found, names)


def _executed(example: DocumentedExample, engine: str, con: Any) -> Any:
    """The example's cursor on ``con`` (AI functions registered), or the failed run: a
    refused translation or the engine's own error is the finding."""
    from ...sql.api import execute
    from ...sql.dialects import TranslationError

    try:
        return execute(con, example.sql, dialect="databricks")
    except TranslationError as exc:
        return _failed(example, engine, exc, translated=False)
    except Exception as exc:  # the engine's error is the finding: report it
        return _failed(example, engine, exc, translated=True)


# -- comparing -------------------------------------------------------------------------------
def compared_run(example: DocumentedExample, engine: str, translated: bool | None,
              found: Mapping[int, str], names: Mapping[str, int]) -> ExampleRun:
    """The run, its checked columns' types read from ``found`` (position -> DDL)."""
    types: dict[str | int, str] = {}
    matches = []
    for column, documented in example.result_types.items():
        position = column if isinstance(column, int) else names.get(column)
        got = found.get(position) if position is not None else None
        types[column] = got or "(missing)"
        matches.append(got is not None and _same_type(engine, documented, got))
    return ExampleRun(example.name, engine, translated, True, types,
                      all(matches) if matches else None)


def _same_type(engine: str, documented: str, got: str) -> bool:
    want = parse_type(documented).ddl()
    if engine == "sqlite":  # no STRUCT, no FLOAT: JSON text with the fields, a REAL
        want = _sqlite_form(parse_type(documented))
    return got in (want, "NULL")  # only NULLs came back: nothing contradicts the type


def _sqlite_form(t: SQLType) -> str:
    if t.name == "STRUCT":  # JSON text: its keys in the order the model wrote them
        return _json_struct(f.name for f in t.args)
    return "DOUBLE" if t.name in ("FLOAT", "DOUBLE") else t.ddl()


def _json_struct(keys: Any) -> str:
    return "JSON STRUCT<" + ", ".join(f"{k}: STRING" for k in sorted(keys)) + ">"


def _failed(example: DocumentedExample, engine: str, exc: BaseException, *,
            translated: bool | None) -> ExampleRun:
    return ExampleRun(example.name, engine, translated, False, {}, None, first_line(exc))


def first_line(exc: BaseException) -> str:
    """An error's first informative line, shortened, as the bench shows it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if text.startswith("This Databricks SQL cannot be translated") and len(lines) > 1:
        text = lines[1]  # the first construct is more telling than the preamble
    return text if len(text) <= 200 else text[:197] + "..."


# -- DuckDB ----------------------------------------------------------------------------------
def _duckdb_table(con: Any, name: str, frame: Any) -> None:
    parts = [f'"{part}"' for part in name.split(".")]
    if len(parts) == 3:
        con.execute(f"ATTACH ':memory:' AS {parts[0]}")
    if len(parts) >= 2:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {'.'.join(parts[:-1])}")
    con.register("_batchllm_rows", frame)
    try:
        con.execute(f"CREATE TABLE {'.'.join(parts)} AS SELECT * FROM _batchllm_rows")
    finally:
        con.unregister("_batchllm_rows")


_DUCKDB_SCALARS = {"VARCHAR": "STRING", "INTEGER": "INT", "BIGINT": "BIGINT", "FLOAT": "FLOAT",
                   "DOUBLE": "DOUBLE", "BOOLEAN": "BOOLEAN", "DATE": "DATE",
                   "TIMESTAMP": "TIMESTAMP", "JSON": "JSON"}


def _duckdb_ddl(t: Any) -> str:
    """A DuckDB column type (``DuckDBPyType``) in Databricks' DDL."""
    if t.id == "struct":
        fields = ", ".join(f"{name}: {_duckdb_ddl(child)}" for name, child in t.children)
        return f"STRUCT<{fields}>"
    if t.id == "list":
        return f"ARRAY<{_duckdb_ddl(t.child)}>"
    text = str(t)
    return _DUCKDB_SCALARS.get(text, text)


# -- SQLite ----------------------------------------------------------------------------------
def _sqlite_table(con: Any, name: str, frame: Any) -> str | None:
    parts = name.split(".")
    if len(parts) > 2:
        return f"SQLite has no catalogs, so no table can be named {name}"
    if len(parts) == 2:
        con.execute(f"ATTACH ':memory:' AS \"{parts[0]}\"")
    table = ".".join(f'"{part}"' for part in parts)
    columns = ", ".join(f'"{column}"' for column in frame.columns)
    con.execute(f"CREATE TABLE {table} ({columns})")
    rows = [tuple(_sqlite_value(v) for v in row)
            for row in frame.astype(object).itertuples(index=False, name=None)]
    marks = ", ".join("?" * len(frame.columns))
    con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    return None


def _sqlite_value(value: Any) -> Any:
    if value is None or value != value:  # NaN and NaT are not equal to themselves
        return None
    return value.isoformat(sep=" ") if hasattr(value, "isoformat") else value


def _sqlite_ddl(values: Sequence[Any]) -> str:
    """The type a SQLite result column's values show."""
    present = [v for v in values if v is not None]
    if not present:
        return "NULL"
    kinds = {_sqlite_kind(v) for v in present}
    return kinds.pop() if len(kinds) == 1 else " | ".join(sorted(kinds))


def _sqlite_kind(value: Any) -> str:
    if isinstance(value, float):
        return "DOUBLE"
    if isinstance(value, int):
        return "BIGINT"
    if isinstance(value, str) and value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return "STRING"
        if isinstance(parsed, dict) and all(v is None or isinstance(v, str)
                                            for v in parsed.values()):
            return _json_struct(parsed)
    return "STRING"
