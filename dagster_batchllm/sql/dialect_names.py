"""The SQL dialects :func:`.dialects.translate` reads and writes, and their names in messages.

Apart from both the translation (:mod:`.dialects`) and its syntax-tree rules
(:mod:`.dialect_rules`), which both speak of dialects by these names, and without importing
sqlglot.
"""

from __future__ import annotations

READ_DIALECTS = ("databricks", "spark")
WRITE_DIALECTS = ("duckdb", "sqlite")
DIALECT_NAMES = {"databricks": "Databricks", "spark": "Spark", "duckdb": "DuckDB",
                 "sqlite": "SQLite"}
