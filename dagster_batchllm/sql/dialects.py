r"""Databricks SQL on DuckDB and SQLite: translated by sqlglot, refused where it would mean more.

:func:`translate` parses a Databricks (or Spark) SQL statement with sqlglot and writes it in the
engine's dialect. sqlglot does the translation; this module only helps it where the AI functions
and Databricks' semantics need it, as transforms of sqlglot's syntax tree:

* ``ai_query`` and the AI functions pass through as plain calls (sqlglot knows some of them as
  Snowflake-style expressions), their named arguments (``failOnError => false``) become DuckDB's
  ``failOnError := false`` or, on SQLite, positional arguments with NULL for the skipped ones,
  and ``named_struct`` / ``map`` / ``array`` arguments become JSON text on SQLite (DuckDB gets
  sqlglot's struct and list literals).
* Regular expressions: sqlglot reads Databricks string escapes (``'\\s'`` is the two characters
  ``\s``) and adds DuckDB's ``'g'`` option to ``regexp_replace`` (Databricks replaces every
  match); here the Java syntax of patterns and replacements becomes RE2's where the two differ
  (``\s``, ``.``, ``$1``; see :mod:`.patterns`).
* ``LIKE``: Databricks' default escape character is ``\``; DuckDB gets an explicit
  ``ESCAPE '\'`` where it matters, and SQLite, whose LIKE ignores case, a case-sensitive ``GLOB``.
* The older ``ai_query`` form of Databricks' earlier reference page, options as name/value pairs
  (``ai_query(endpoint, request, 'returnType', 'STRING')``), is read as named options.

What cannot be translated faithfully is refused before the engine sees the query, so no request
is sent: what sqlglot reports as unsupported; a function sqlglot does not know (it would pass the
call on unchanged) whose name the engine uses for a built-in of its own; a regexp that is not a
constant or has no RE2 equivalent; and on SQLite, what it lacks or does differently
(regexps, Unicode case mapping, structs); and ``${name}`` placeholders, which the Databricks
SQL editor or a notebook widget fills in before a query runs (the refusal says how to bind a
value instead). The checks and rewrites are in :mod:`.dialect_rules`; :class:`TranslationError`
names each construct as written (without its comments) with its line.

Example::

    >>> from dagster_batchllm.sql.dialects import translate
    >>> print(translate("SELECT ai_query('m', t, failOnError => false) FROM calls",
    ...                 write="duckdb", pretty=False))
    SELECT AI_QUERY('m', t, failOnError := FALSE) FROM calls
    >>> print(translate("SELECT ai_query('m', t, modelParameters => named_struct('max_tokens', 9))"
    ...                 " FROM calls", write="sqlite", pretty=False))
    SELECT AI_QUERY('m', t, NULL, NULL, JSON_OBJECT('max_tokens', 9)) FROM calls
    >>> print(translate(r"SELECT regexp_replace(t, '(\\w+)@', '$1 at ') FROM calls",
    ...                 write="duckdb", pretty=False))
    SELECT REGEXP_REPLACE(t, '(\w+)@', '\1 at ', 'g') FROM calls
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from ..core import InferenceConfigError
from .dialect_names import DIALECT_NAMES, READ_DIALECTS, WRITE_DIALECTS


@dataclass(frozen=True)
class Problem:
    """One construct that cannot be translated faithfully."""

    line: int | None
    construct: str  # the construct as written in the source dialect (shortened)
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "somewhere"
        return f"{where}: {self.construct}: {self.reason}"


class TranslationError(InferenceConfigError):
    """A query that would mean something else on the target engine; nothing was run."""

    def __init__(self, read: str, write: str, problems: list[Problem]):
        self.problems = tuple(problems)
        listed = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(
            f"This {DIALECT_NAMES.get(read, read)} SQL cannot be translated to "
            f"{DIALECT_NAMES.get(write, write)} faithfully; it was not run and nothing was sent:\n"
            f"{listed}\nRewrite these constructs, or run the query in Spark SQL "
            "(dagster_batchllm.spark).")


def translate(query: str, *, read: str = "databricks", write: str = "duckdb",
              pretty: bool = True) -> str:
    """``query`` (one or more statements in ``read``'s dialect) in ``write``'s dialect.

    Raises :class:`TranslationError` listing every construct that cannot be translated
    faithfully, with its line; nothing is executed here.
    """
    # sqlglot (and the rules over its syntax tree) are imported on first use: SQL run without
    # a dialect does not pay for them.
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    from .dialect_rules import check, rewrite

    if read not in READ_DIALECTS:
        raise InferenceConfigError(
            f"dialect {read!r} cannot be translated; supported: {list(READ_DIALECTS)} (or the "
            f"engine's own dialect, {list(WRITE_DIALECTS)}, which runs unchanged).")
    if write not in WRITE_DIALECTS:
        raise InferenceConfigError(f"cannot translate into {write!r}; targets: "
                                   f"{list(WRITE_DIALECTS)}.")
    try:
        trees = [t for t in sqlglot.parse(query, read=read) if t is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise TranslationError(read, write, [Problem(
            first.get("line"), str(first.get("highlight") or "?"),
            f"sqlglot cannot parse this as {DIALECT_NAMES[read]} SQL ({first.get('description')})",
        )]) from None
    except TokenError as exc:
        raise TranslationError(read, write, [Problem(None, "the query text", str(exc))]) from None
    # Where each statement's text starts at the earliest: where the one before it ends.
    starts = [1] + [max(_lines(tree), default=1) for tree in trees[:-1]]
    problems = [Problem(_line(node, query, start), _quote(node, read), reason)
                for tree, start in zip(trees, starts, strict=True)
                for node, reason in check(tree, read, write)]
    problems.sort(key=lambda p: p.line if p.line is not None else float("inf"))
    if problems:
        raise TranslationError(read, write, problems)
    out = []
    for tree, start in zip(trees, starts, strict=True):
        sql, unsupported = _generate(rewrite(tree, write), read, write, pretty, query, start)
        problems += unsupported
        out.append(sql)
    if problems:
        raise TranslationError(read, write, problems)
    return ";\n".join(out)


# -- generation: sqlglot's own, recording where it reports something unsupported -----------
def _generate(tree, read: str, write: str, pretty: bool, source: str, start: int
              ) -> tuple[str, list[Problem]]:
    from sqlglot.errors import ErrorLevel

    generator = _tracking_generator(write)(pretty=pretty, dialect=write,
                                           unsupported_level=ErrorLevel.IGNORE)
    sql = generator.generate(tree, copy=False)
    problems = []
    for message, node in generator.unsupported_at:
        node = _construct(message, node)
        problems.append(Problem(_line(node, source, start), _quote(node, read),
                                f"sqlglot: {message}"))
    return sql, problems


_UNSUPPORTED_PROPERTY = re.compile(r"Unsupported property (\w+)")


def _construct(message: str, node):
    """The construct an unsupported-feature message is about, where sqlglot names it.

    sqlglot reports a statement's properties (``MATERIALIZED``, ``TBLPROPERTIES (...)``) while
    it writes the whole statement; quoting the statement would show its first line, not the
    property.
    """
    named = _UNSUPPORTED_PROPERTY.fullmatch(message)
    if node is None or named is None:
        return node
    for prop in node.find_all(exp_property_types()):
        if type(prop).__name__.lower() == named.group(1):
            return prop
    return node


@cache
def _tracking_generator(write: str):
    from sqlglot import exp
    from sqlglot.dialects.dialect import Dialect

    base = Dialect.get_or_raise(write).generator_class

    class Tracking(base):
        """sqlglot's generator, remembering which node it was writing when something failed."""

        def generate(self, expression, copy=True):
            self._nodes: list = []
            self.unsupported_at: list = []
            return super().generate(expression, copy=copy)

        def sql(self, expression, key=None, comment=True):
            if key or not isinstance(expression, exp.Expression):
                return super().sql(expression, key, comment)
            self._nodes.append(expression)
            try:
                return super().sql(expression, key, comment)
            finally:
                self._nodes.pop()

        def unsupported(self, message):
            self.unsupported_at.append((message, self._nodes[-1] if self._nodes else None))
            super().unsupported(message)

    return Tracking


# -- helpers ---------------------------------------------------------------------------------
def _quote(node, read: str) -> str:
    """The construct in the source dialect, on one line and shortened."""
    if node is None:
        return "?"
    # Without comments: a leading "-- Step 1" belongs to the statement, not to the construct.
    text = " ".join(node.sql(dialect=read, normalize_functions=False, comments=False).split())
    return text if len(text) <= 80 else text[:77] + "..."


def exp_property_types():
    from sqlglot import exp

    return exp.Property


def _line(node, source: str, start: int = 1) -> int | None:
    """The first source line of ``node``, in a statement whose text starts at line ``start``
    at the earliest.

    sqlglot records lines on tokens, not on every node: a node without a token of its own (a
    keyword property such as ``MATERIALIZED``, a ``${name}`` placeholder) is found in
    ``source`` by its first word, from ``start`` on.
    """
    if node is None:
        return None
    own = _lines(node)
    if own:
        return min(own)
    lead = re.match(r"\$\{\w+\}|\w+", node.sql(dialect="databricks", comments=False))
    if lead:
        word = re.escape(lead.group())
        pattern = re.compile(word if lead.group().startswith("$") else rf"\b{word}\b",
                             re.IGNORECASE)
        for number, text in enumerate(source.splitlines(), start=1):
            if number >= start and pattern.search(text.split("--", 1)[0]):
                return number
    parent = node.parent
    while parent is not None and not _lines(parent):
        parent = parent.parent
    return min(_lines(parent)) if parent is not None else None


def _lines(node) -> list[int]:
    return [n.meta["line"] for n in node.walk() if "line" in n.meta]
