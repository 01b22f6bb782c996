"""SQL result types of the AI functions: Databricks type strings, JSON schemas, engine types.

``ai_query`` takes its result type two ways, as Databricks does: ``returnType`` / ``responseFormat``
written as a Databricks (Spark DDL) type string such as ``'STRUCT<risk: STRING, score: INT>'``, or
``responseFormat`` written as a JSON schema. Both become one :class:`SQLType`, which knows the JSON
schema to ask the model for (:mod:`.schemas`) and the DuckDB type to return.

Example::

    >>> from dagster_batchllm.ai_functions.types import parse_type
    >>> t = parse_type("STRUCT<risk: STRING, score: INT NOT NULL>")
    >>> t.ddl()
    'STRUCT<risk: STRING, score: INT NOT NULL>'
    >>> t.duckdb_structure()
    {'risk': 'VARCHAR', 'score': 'INTEGER'}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from ..core.errors import InferenceConfigError

_ALIASES = {
    "STRING": "STRING", "VARCHAR": "STRING", "CHAR": "STRING", "TEXT": "STRING",
    "INT": "INT", "INTEGER": "INT", "BIGINT": "BIGINT", "LONG": "BIGINT",
    "SMALLINT": "SMALLINT", "SHORT": "SMALLINT", "TINYINT": "TINYINT", "BYTE": "TINYINT",
    "FLOAT": "FLOAT", "REAL": "FLOAT", "DOUBLE": "DOUBLE",
    "DECIMAL": "DECIMAL", "DEC": "DECIMAL", "NUMERIC": "DECIMAL",
    "BOOLEAN": "BOOLEAN", "BOOL": "BOOLEAN", "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP", "TIMESTAMP_NTZ": "TIMESTAMP", "TIMESTAMP_LTZ": "TIMESTAMP",
    "JSON": "JSON", "VARIANT": "JSON",
    "ARRAY": "ARRAY", "MAP": "MAP", "STRUCT": "STRUCT",
}
INT_BITS = {"TINYINT": 7, "SMALLINT": 15, "INT": 31, "BIGINT": 63}
_DUCKDB_NAMES = {"STRING": "VARCHAR", "INT": "INTEGER", "JSON": "JSON"}


@dataclass(frozen=True)
class Field:
    name: str
    type: SQLType
    nullable: bool = True


@dataclass(frozen=True)
class SQLType:
    """A Databricks SQL type: ``name`` is canonical (``STRING``, ``INT``, ``STRUCT`` ...).

    ``args`` holds ``(precision, scale)`` for DECIMAL, ``(element,)`` for ARRAY,
    ``(key, value)`` for MAP and the :class:`Field` tuple for STRUCT.
    """

    name: str
    args: tuple = ()

    @property
    def is_text(self) -> bool:
        return self.name == "STRING"

    @property
    def is_complex(self) -> bool:
        return self.name in ("ARRAY", "MAP", "STRUCT", "JSON")

    def ddl(self) -> str:
        """The Databricks spelling, e.g. ``ARRAY<STRUCT<name: STRING>>``."""
        return self._spelled(json="JSON")

    def spark_ddl(self) -> str:
        """The Spark SQL spelling: Databricks' but for JSON (VARIANT), which is its JSON text."""
        return self._spelled(json="STRING")

    def _spelled(self, json: str) -> str:
        if self.name == "JSON":
            return json
        if self.name == "DECIMAL":
            return f"DECIMAL({self.args[0]},{self.args[1]})"
        if self.name == "ARRAY":
            return f"ARRAY<{self.args[0]._spelled(json)}>"
        if self.name == "MAP":
            return f"MAP<{self.args[0]._spelled(json)}, {self.args[1]._spelled(json)}>"
        if self.name == "STRUCT":
            fields = ", ".join(
                f"{_ddl_name(f.name)}: {f.type._spelled(json)}{'' if f.nullable else ' NOT NULL'}"
                for f in self.args)
            return f"STRUCT<{fields}>"
        return self.name

    def duckdb_type(self) -> str:
        """The DuckDB type name, e.g. ``STRUCT("risk" VARCHAR, "score" INTEGER)``."""
        if self.name == "DECIMAL":
            return f"DECIMAL({self.args[0]},{self.args[1]})"
        if self.name == "ARRAY":
            return f"{self.args[0].duckdb_type()}[]"
        if self.name == "MAP":
            return f"MAP({self.args[0].duckdb_type()}, {self.args[1].duckdb_type()})"
        if self.name == "STRUCT":
            inner = ", ".join(f'"{f.name.replace(chr(34), chr(34) * 2)}" {f.type.duckdb_type()}'
                              for f in self.args)
            return f"STRUCT({inner})"
        return _DUCKDB_NAMES.get(self.name, self.name)

    def duckdb_structure(self) -> Any:
        """The ``structure`` argument of DuckDB's ``from_json`` that yields this type."""
        if self.name == "ARRAY":
            return [self.args[0].duckdb_structure()]
        if self.name == "STRUCT":
            return {f.name: f.type.duckdb_structure() for f in self.args}
        return self.duckdb_type()


STRING = SQLType("STRING")
FLOAT = SQLType("FLOAT")
JSON_TYPE = SQLType("JSON")


def struct(**fields: SQLType) -> SQLType:
    return SQLType("STRUCT", tuple(Field(name, t) for name, t in fields.items()))


def _ddl_name(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("`", "``") + "`"


# -- parsing Databricks type strings ---------------------------------------------------------
# sqlglot's Databricks dialect parses the grammar. It also reads other dialects' spellings
# (NUMBER, INT8, DOUBLE PRECISION, INT[], a trailing ';') that Databricks refuses, so the words
# are checked against _ALIASES first: a query that runs here then runs on Databricks too.
_NAMES = {exp.DataType.build(word, dialect="databricks").this: name
          for word, name in _ALIASES.items()}
_FIELD_WORDS = ("NOT", "NULL", "COMMENT")
_KNOWN_WORDS = (*_ALIASES, *_FIELD_WORDS)
_CLOSING = {TokenType.LT: TokenType.GT, TokenType.L_PAREN: TokenType.R_PAREN}
_SHAPES = {"ARRAY": "ARRAY takes one element type, as in ARRAY<STRING>",
           "MAP": "MAP takes a key and a value type, as in MAP<STRING, INT>",
           "STRUCT": "a STRUCT needs at least one field"}
_PUNCTUATION = (TokenType.LT, TokenType.GT, TokenType.L_PAREN, TokenType.R_PAREN,
                TokenType.COMMA, TokenType.COLON, TokenType.NUMBER)


class _Refused(Exception):
    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset


def parse_type(text: str, argument: str = "returnType") -> SQLType:
    """Parse a Databricks type string; a bare field list ``'a STRING, b INT'`` is a STRUCT.

    Errors name ``argument`` (the SQL argument the string came from).
    """
    if not isinstance(text, str) or not text.strip():
        raise InferenceConfigError(f"argument '{argument}' must be a non-empty type string.")
    try:
        return _parsed(text)
    except _Refused as refused:
        where = "in" if refused.offset is None else f"at position {refused.offset + 1} of"
        raise InferenceConfigError(
            f"argument '{argument}': {refused} {where} {text!r}. Write a Databricks type such "
            "as 'STRING', 'ARRAY<STRING>' or 'STRUCT<risk: STRING, score: INT>'."
        ) from None


def _parsed(text: str) -> SQLType:
    try:
        tokens = sqlglot.tokenize(text, read="databricks")
    except TokenError:
        raise _Refused("a quote or comment is not closed") from None
    if not tokens:
        raise _Refused("expected a type but found only a comment")
    _check_words(tokens)
    # As Spark's from_json reads a schema: a leading 'name TYPE' or 'name:' is a field list.
    bare = (len(tokens) > 1 and _is_word(tokens[0])
            and tokens[0].text.upper() not in ("ARRAY", "MAP", "STRUCT")
            and (tokens[1].token_type is TokenType.COLON or _is_word(tokens[1])))
    prefix = "STRUCT<" if bare else ""
    source = f"{prefix}{text}{'>' if bare else ''}"
    try:
        tree = sqlglot.parse_one(source, read="databricks", into=exp.DataType,
                                 error_message_context=len(source))
    except ParseError as exc:
        error = exc.errors[0]
        offset = min(max(len(error["start_context"]) - len(prefix), 0), len(text))
        found = error["highlight"] if offset < len(text) else "the end"  # or the added '>'
        expecting = re.fullmatch(r"Expecting (.+)", error["description"])
        message = (f"expected {expecting[1]!r} but found {found!r}" if expecting
                   else f"unexpected {found!r}")
        raise _Refused(message, offset) from None
    if not isinstance(tree, exp.DataType):  # a cast such as 'ARRAY<INT>(3)'
        raise _Refused("unexpected text after the type")
    return _converted(tree)


def _is_word(token: Token | None) -> bool:
    """A name or a keyword: what may stand for a field name or a type."""
    return token is not None and (token.token_type is TokenType.IDENTIFIER or (
        token.token_type is not TokenType.NUMBER and token.text.replace("_", "a").isalnum()))


def _check_words(tokens: list[Token]) -> None:
    """Each word is a type spelled as Databricks spells it, a field name (followed by ':' or its
    type) or NOT NULL / COMMENT, and brackets pair up. sqlglot backtracks out of a STRUCT it
    cannot read and reports its first field, so these mistakes are named here, where they are."""
    opened: list[Token] = []
    for i, token in enumerate(tokens):
        kind = token.token_type
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        if kind in _CLOSING:
            opened.append(token)
        elif kind in _CLOSING.values() and (
                not opened or _CLOSING[opened.pop().token_type] is not kind):
            raise _Refused(f"unexpected {token.text!r}", token.start)
        elif kind is TokenType.NEQ and i and tokens[i - 1].text.upper() in _SHAPES:
            raise _Refused(_SHAPES[tokens[i - 1].text.upper()], token.start)  # 'STRUCT<>'
        elif kind is TokenType.COLON and not _is_word(after):
            raise _Refused(f"unknown type {after.text if after else 'end of text'!r}",
                           after.start if after else token.end + 1)
        elif kind in _PUNCTUATION or (
                kind is TokenType.STRING and i and tokens[i - 1].token_type is TokenType.COMMENT):
            continue
        elif not _is_word(token):
            raise _Refused(f"unexpected {token.text!r}", token.start)
        elif (kind is TokenType.IDENTIFIER or token.text.upper() not in _KNOWN_WORDS) and not (
                after is not None and after.token_type is TokenType.COLON
                or _is_word(after) and after.text.upper() not in _FIELD_WORDS):
            # Not a type, nor a field name (which ':' or its type follows): a misspelt type.
            raise _Refused(f"unknown type {token.text!r}", token.start)
    if opened:
        closing = ">" if opened[-1].token_type is TokenType.LT else ")"
        raise _Refused(f"expected ',' or {closing!r} but found the end",
                       tokens[-1].end + 1)


def _converted(node: exp.Expression) -> SQLType:
    if not isinstance(node, exp.DataType):
        raise _Refused(f"expected a type but found {node.sql('databricks')!r}")
    name = _NAMES.get(node.this)
    if name is None:  # NULL (VOID): sqlglot reads it as a type, JSON schemas have no such type
        raise _Refused(f"unknown type {node.this.value!r}")
    children = node.expressions
    if name == "ARRAY":
        if len(children) != 1:
            raise _Refused(_SHAPES[name])
        return SQLType("ARRAY", (_converted(children[0]),))
    if name == "MAP":
        if len(children) != 2:
            raise _Refused(_SHAPES[name])
        key, value = (_converted(child) for child in children)
        if key.name != "STRING":
            raise _Refused("MAP keys must be STRING (JSON object keys are text)")
        return SQLType("MAP", (key, value))
    if name == "STRUCT":
        if not children:
            raise _Refused(_SHAPES[name])
        return SQLType("STRUCT", _fields(children))
    if name != "DECIMAL":
        return SQLType(name)  # a length, as in VARCHAR(10), is ignored: JSON text has none
    if not all(param.this.is_int for param in children):
        raise _Refused("DECIMAL's precision and scale are whole numbers")
    numbers = [int(param.name) for param in children]
    precision, scale = (numbers + [10, 0][len(numbers):])[:2]
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise _Refused(f"DECIMAL({precision},{scale}) is out of range")
    return SQLType("DECIMAL", (precision, scale))


def _fields(columns: list[exp.Expression]) -> tuple[Field, ...]:
    fields: list[Field] = []
    for column in columns:
        if not isinstance(column, exp.ColumnDef):
            raise _Refused(f"expected a field name before {column.sql('databricks')!r}")
        name = column.this
        if name.name in (f.name for f in fields):
            raise _Refused(f"field {name.name!r} appears twice")
        nullable = True
        for constraint in column.args.get("constraints") or []:
            kind = constraint.args["kind"]
            if isinstance(kind, exp.NotNullColumnConstraint) and not kind.args.get("allow_null"):
                nullable = False
            elif not isinstance(kind, exp.CommentColumnConstraint):
                raise _Refused(f"field {name.name!r} takes only NOT NULL and COMMENT after its "
                               "type")
        fields.append(Field(name.name, _converted(column.args["kind"]), nullable))
    return tuple(fields)
