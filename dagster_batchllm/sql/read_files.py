"""Databricks' ``read_files(path, format => 'binaryFile')`` in translated SQL.

Databricks reads images and PDFs for ``ai_query(..., files => content)`` and
``ai_parse_document(content)`` with ``read_files``, whose binaryFile rows are ``path``,
``modificationTime``, ``length`` and ``content``. DuckDB's ``read_blob`` reads the same files
with other column names, so the call becomes a subquery that renames them::

    FROM read_files('/data/scans/*.png', format => 'binaryFile') AS f
    -- DuckDB:
    FROM (SELECT filename AS path, last_modified AS modificationTime, size AS length, content
          FROM read_blob('/data/scans/*.png')) AS f

Other formats (csv, json, parquet ...) and read_files' options are not translated, nor is
anything on SQLite, which has no table function that reads files: the query is refused
naming the call (see :func:`problem`).

The files a query names here are the query's own choice (its text is code, as DuckDB's
``read_blob`` is), so ``files_roots`` does not bound them; pass their ``content`` on
(``files => content``). Their ``path`` passed as ``files => path`` or to ``ai_parse_document``
is a path cell, read only under ``files_roots``
(:mod:`dagster_batchllm.core.file_policy`).
"""

from __future__ import annotations

from sqlglot import exp

NAME = "read_files"
_COLUMNS = (("filename", "path"), ("last_modified", "modificationTime"), ("size", "length"),
            ("content", "content"))


def is_read_files(node) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == NAME


def problem(node, write: str) -> str | None:
    """Why this ``read_files(...)`` call cannot be written for ``write``, or None."""
    if write == "sqlite":
        return ("SQLite has no table function that reads files: load the files into a table "
                "first (path TEXT, content BLOB) or run the query on DuckDB")
    path, options = _arguments(node)
    if path is None:
        return "read_files needs the path as its first argument"
    fmt = next((options.pop(k) for k in list(options) if k.lower() == "format"), None)
    if not (isinstance(fmt, exp.Literal) and fmt.is_string
            and fmt.this.lower() == "binaryfile"):
        return ("only read_files(path, format => 'binaryFile') is translated (its rows are "
                "path, modificationTime, length, content, from DuckDB's read_blob)")
    if options:
        return (f"read_files option(s) {sorted(options)} are not translated; DuckDB's read_blob "
                "takes a path or glob only")
    return None


def rewrite(table: exp.Table) -> exp.Expression:
    """The ``read_files`` table (checked by :func:`problem`) as a read_blob subquery."""
    path, _ = _arguments(table.this)
    select = exp.select(*(exp.alias_(exp.column(source), target)
                          for source, target in _COLUMNS)).from_(
        exp.Table(this=exp.Anonymous(this="read_blob", expressions=[path.copy()])))
    alias = table.args.get("alias")
    return exp.Subquery(this=select, alias=alias.copy() if alias else None)


def _arguments(node) -> tuple[exp.Expression | None, dict[str, exp.Expression]]:
    path = None
    options: dict[str, exp.Expression] = {}
    for i, argument in enumerate(node.expressions):
        if isinstance(argument, exp.Kwarg | exp.PropertyEQ):
            options[argument.this.name] = argument.expression
        elif i == 0:
            path = argument
    return path, options
