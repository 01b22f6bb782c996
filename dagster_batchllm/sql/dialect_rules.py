"""The checks and rewrites that :func:`.dialects.translate` applies to sqlglot's syntax tree.

:func:`check` looks at the untouched tree (so errors quote the source as written) and yields
every construct that cannot be written for the engine with the same meaning; :func:`rewrite` then
gives the AI function calls the engine's form and patterns their RE2 / GLOB syntax.

Example::

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT ai_query('m', t, failOnError => false) FROM x",
    ...                          read="databricks")
    >>> list(check(tree, "databricks", "duckdb"))
    []
    >>> rewrite(tree, "duckdb").sql("duckdb")
    "SELECT AI_QUERY('m', t, failOnError := FALSE) FROM x"
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

from sqlglot import exp

from ..ai_functions.catalogue import FUNCTIONS, REQUIRED, AIFunction, legacy_options
from . import read_files
from .dialect_names import DIALECT_NAMES as NAMES
from .patterns import java_to_re2_pattern, java_to_re2_replacement, like_to_glob


def check(tree, read: str, write: str) -> Iterator[tuple[exp.Expression, str]]:
    """Every construct of ``tree`` that cannot be written for ``write`` faithfully, and why."""
    placeholders: set[str] = set()  # each named once, where it first appears
    for node in tree.walk():
        if isinstance(node, exp.Parameter):  # ${name}: Databricks and Spark have no $name
            if node.this.name not in placeholders:
                placeholders.add(node.this.name)
                yield node, _placeholder_problem(node.this.name, node.parent, write)
            continue
        if _is_string(node) and _PLACEHOLDER.fullmatch(node.this):  # "${endpoint}"
            if node.this[2:-1] not in placeholders:
                placeholders.add(node.this[2:-1])
                yield node, _placeholder_problem(node.this[2:-1], None, write, quoted=True)
            continue
        spec = ai_function(node)
        if spec is not None:
            try:
                _ai_arguments(node, spec)
            except ValueError as exc:
                yield node, str(exc)
            continue
        if read_files.is_read_files(node):
            reason = read_files.problem(node, write)
            if reason:
                yield node, reason
            continue
        if isinstance(node, exp.Anonymous) and node.name.lower() in _builtins(write):
            yield node, (
                f"sqlglot does not know the {NAMES[read]} function {node.name}(), so it would "
                f"pass the call on unchanged, and {NAMES[write]} has a {node.name}() of its own, "
                "which may mean something else")
        if write == "duckdb" and type(node).__name__ in _REGEXP_FUNCTIONS:
            for reason in _regexp_problems(node):
                yield node, reason
        if isinstance(node, exp.Like | exp.ILike):
            reason = _like_problem(node, write)
            if reason:
                yield node, reason
        if write == "sqlite":
            reason = _sqlite_problem(node)
            if reason:
                yield node, reason


_PLACEHOLDER = re.compile(r"\$\{\w+\}")


def _placeholder_problem(name: str, parent, write: str, *, quoted: bool = False) -> str:
    """Why a ``${name}`` placeholder (the Databricks SQL editor's, a notebook widget's) is
    refused: sqlglot would write it as ``$name``, which nothing binds here; quoted, it would
    be the text ``${name}`` itself."""
    start = (f"a placeholder that the Databricks SQL editor or a notebook widget fills in "
             f"before the query runs; nothing fills it in on {NAMES[write]} "
             + (f"(the string would stay '${{{name}}}'). " if quoted else
                f"(sqlglot would pass it on as ${name}). "))
    substitute = f"string.Template(query).substitute({name}=...)"
    name_only = (f"a table or column name no SQL parameter can stand for: put it into the text "
                 f"first, e.g. with {substitute}")
    if isinstance(parent, exp.Table):
        return start + "It stands for " + name_only
    return (start + f"For a value, write :{name} and pass the value as execute(con, query, "
            f"{{'{name}': ...}}, dialect='databricks'); for {name_only}")


_REGEXP_FUNCTIONS = frozenset((
    "RegexpReplace", "RegexpExtract", "RegexpExtractAll", "RegexpLike", "RegexpILike",
    "RegexpSplit", "RegexpCount", "RegexpInstr", "RegexpSubstr", "RegexpFullMatch"))


def _regexp_problems(node) -> Iterator[str]:
    """Why a regexp call cannot be given RE2 syntax with Java's meaning (pattern, then
    replacement)."""
    texts = [("pattern", node.expression, java_to_re2_pattern)]
    if isinstance(node, exp.RegexpReplace):
        texts.append(("replacement", node.args.get("replacement"), java_to_re2_replacement))
    for what, literal, convert in texts:
        if not _is_string(literal):
            yield (f"the {what} must be a string literal: Databricks reads it with Java's "
                   "regexp syntax, which is rewritten for DuckDB's RE2 where only a constant "
                   "allows it")
            continue
        try:
            convert(literal.this)
        except ValueError as exc:
            yield f"the {what}: {exc}"


def _like_problem(node, write: str) -> str | None:
    pattern = node.expression
    if isinstance(pattern, exp.Any | exp.All):
        if write == "sqlite" or any("\\" in p.this for p in pattern.find_all(exp.Literal)
                                    if p.is_string):
            return "LIKE ANY/ALL can only be translated for DuckDB, without escapes"
        return None
    if write != "sqlite" or isinstance(node, exp.ILike):
        return None  # DuckDB: an explicit ESCAPE '\' is added; SQLite ILIKE: _SQLITE_REFUSED
    if not _is_string(pattern):
        return ("SQLite's LIKE ignores case; only a constant pattern can be rewritten to the "
                "case-sensitive GLOB")
    try:
        like_to_glob(pattern.this, _escape_char(node))
    except ValueError as exc:
        return str(exc)
    return None


def _escape_char(like) -> str:
    parent = like.parent
    if isinstance(parent, exp.Escape) and parent.this is like:
        escape = parent.expression
        if not _is_string(escape) or len(escape.this) != 1:
            raise ValueError("the ESCAPE character must be a one-character string literal")
        return escape.this
    return "\\"


# SQLite: constructs whose SQLite form means something else, or that SQLite does not have.
_SQLITE_REFUSED = {
    "Lower": "SQLite's lower() changes only ASCII letters; Databricks' changes every letter",
    "Upper": "SQLite's upper() changes only ASCII letters; Databricks' changes every letter",
    "ILike": "SQLite compares case only for ASCII letters; Databricks' ILIKE for every letter",
    **dict.fromkeys(_REGEXP_FUNCTIONS, "SQLite has no regular expression functions"),
}


def _sqlite_problem(node) -> str | None:
    reason = _SQLITE_REFUSED.get(type(node).__name__)
    if reason:
        return reason
    if isinstance(node, exp.Struct | exp.Array | exp.VarMap | exp.Map):
        if not _in_ai_argument(node):
            return ("SQLite has no structs, arrays or maps (as an argument of an AI function it "
                    "becomes JSON text)")
        if isinstance(node, exp.Struct) and not all(
                isinstance(e, exp.PropertyEQ) for e in node.expressions):
            return "a struct argument needs field names (named_struct('name', value, ...))"
    return None


def _in_ai_argument(node) -> bool:
    parent = node.parent
    while isinstance(parent, exp.Struct | exp.Array | exp.VarMap | exp.Map | exp.PropertyEQ
                     | exp.Kwarg):
        parent = parent.parent
    return parent is not None and ai_function(parent) is not None


# -- the AI functions ------------------------------------------------------------------------
def ai_function(node) -> AIFunction | None:
    """The AI function ``node`` calls, whether sqlglot parsed it as a typed or a plain call."""
    if isinstance(node, exp.Anonymous):
        return FUNCTIONS.get(node.name.lower())
    if isinstance(node, exp.Func):
        for name in type(node).sql_names():
            if name.lower() in FUNCTIONS:
                return FUNCTIONS[name.lower()]
    return None


def _ai_arguments(node, spec: AIFunction) -> tuple[dict[str, object], set[str]]:
    """Parameter name -> argument expression, and the names given by position; ValueError
    says what is wrong with the call."""
    if isinstance(node, exp.Anonymous):
        given = list(node.expressions)
    else:  # a typed sqlglot expression: its arguments in declaration (= positional) order
        given = []
        for key in type(node).arg_types:
            value = node.args.get(key)
            given.extend(value if isinstance(value, list) else [value] if value else [])
    names = [p.name for p in spec.params]
    if len(given) >= 2 and not any(isinstance(a, exp.Kwarg | exp.PropertyEQ) for a in given):
        pairs = legacy_options(spec, given[2:], _string_value)
        if pairs is not None:  # ai_query(e, r, 'returnType', 'STRING'): the options by name
            return {names[0]: given[0], names[1]: given[1], **pairs}, set(names[:2])
    canonical = {n.lower(): n for n in names}
    bound: dict[str, object] = {}
    positional: set[str] = set()
    named = False
    for i, argument in enumerate(given):
        if isinstance(argument, exp.Kwarg | exp.PropertyEQ):
            named = True
            key = canonical.get(argument.this.name.lower())
            if key is None:
                raise ValueError(f"{spec.name} has no parameter '{argument.this.name}'; "
                                 f"signature: {spec.signature()}")
            if key in bound:
                raise ValueError(f"argument '{key}' is given twice")
            bound[key] = argument.expression
        elif named:
            raise ValueError("a positional argument follows a named one")
        elif i >= len(names):
            raise ValueError(f"{spec.name} takes at most {len(names)} arguments; "
                             f"signature: {spec.signature()}")
        else:
            bound[names[i]] = argument
            positional.add(names[i])
    missing = [p.name for p in spec.params if p.default is REQUIRED and p.name not in bound]
    if missing:
        raise ValueError(f"{spec.name} needs '{missing[0]}'; signature: {spec.signature()}")
    return bound, positional


def _string_value(node) -> str | None:
    return node.this if _is_string(node) else None


def _ai_call(node, spec: AIFunction, write: str):
    """The call in the engine's form: DuckDB named parameters, SQLite positional arguments."""
    bound, given_by_position = _ai_arguments(node, spec)
    names = [p.name for p in spec.params]
    if write == "duckdb":
        # Positional while the Databricks call was; the rest by name, which the macro accepts.
        positional = []
        for name in names:
            if name not in bound or name not in given_by_position:
                break
            positional.append(bound.pop(name))
        args = positional + [exp.PropertyEQ(this=exp.to_identifier(name), expression=value)
                             for name, value in bound.items()]
    else:
        last = max(names.index(name) for name in bound)
        args = [_json_value(bound[name]) if name in bound else exp.Null()
                for name in names[:last + 1]]
    call = exp.Anonymous(this=spec.name, expressions=args)
    call.meta.update(node.meta)
    return call


def _json_value(value):
    """SQLite form of a struct, map or array argument: JSON text built with json_object/array."""
    if isinstance(value, exp.Struct):
        pairs = [(exp.Literal.string(e.this.name), e.expression) for e in value.expressions]
    elif isinstance(value, exp.VarMap | exp.Map):
        keys, values = value.args.get("keys"), value.args.get("values")
        pairs = list(zip(keys.expressions, values.expressions, strict=True))
    elif isinstance(value, exp.Array):
        return exp.Anonymous(this="json_array",
                             expressions=[_json_value(e) for e in value.expressions])
    else:
        return value
    return exp.Anonymous(this="json_object", expressions=[
        part for key, item in pairs for part in (key, _json_value(item))])


# -- rewriting (the checks passed) -----------------------------------------------------------
def rewrite(tree, write: str):
    """Rewrite ``tree`` (checked by :func:`check`) in place for ``write``; returns it."""
    # Innermost first, so a rewritten call can sit inside another one's arguments.
    for node in reversed(list(tree.walk())):
        spec = ai_function(node)
        if spec is not None:
            node.replace(_ai_call(node, spec, write))
        elif isinstance(node, exp.Table) and read_files.is_read_files(node.this):
            node.replace(read_files.rewrite(node))  # binaryFile rows from DuckDB's read_blob
        elif write == "duckdb" and type(node).__name__ in _REGEXP_FUNCTIONS:
            _rewrite_regexp(node)
        elif isinstance(node, exp.Like | exp.ILike) and not isinstance(node.expression,
                                                                       exp.Any | exp.All):
            _rewrite_like(node, write)
    return tree


def _rewrite_regexp(node) -> None:
    node.expression.set("this", java_to_re2_pattern(node.expression.this))
    if isinstance(node, exp.RegexpReplace):
        replacement = node.args["replacement"]
        replacement.set("this", java_to_re2_replacement(replacement.this))
        if node.args.get("modifiers") is None:
            # Replace every match, as Databricks does. sqlglot 30 adds 'g' itself; saying it
            # here keeps an older sqlglot from silently replacing only the first match.
            node.set("modifiers", exp.Literal.string("g"))


def _rewrite_like(node, write: str) -> None:
    escaped = isinstance(node.parent, exp.Escape) and node.parent.this is node
    if write == "duckdb":
        pattern = node.expression
        if not escaped and not (_is_string(pattern) and "\\" not in pattern.this):
            # Databricks escapes with '\' by default; DuckDB's LIKE has no escape character.
            node.replace(exp.Escape(this=node.copy(), expression=exp.Literal.string("\\")))
        return
    glob = exp.Glob(this=node.this, expression=exp.Literal.string(
        like_to_glob(node.expression.this, _escape_char(node))))
    (node.parent if escaped else node).replace(glob)



# -- helpers ---------------------------------------------------------------------------------
def _is_string(node) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


@cache
def _builtins(write: str) -> frozenset[str]:
    """The target engine's built-in function names (a fresh in-memory connection's)."""
    if write == "duckdb":
        import duckdb

        with duckdb.connect() as con:
            rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                               "WHERE internal").fetchall()
    else:
        import sqlite3

        con = sqlite3.connect(":memory:")
        try:
            rows = con.execute("SELECT name FROM pragma_function_list WHERE builtin").fetchall()
        except sqlite3.Error:  # built without introspection pragmas: nothing to compare with
            rows = []
        finally:
            con.close()
    return frozenset(name.lower() for (name,) in rows)
