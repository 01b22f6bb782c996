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

from ..core import InferenceConfigError

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
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)+`)|('(?:[^'\\]|\\.)*')|([A-Za-z_][A-Za-z0-9_]*)"
                    r"|(\d+)|([<>(),:]))")


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
class _Tokens:
    def __init__(self, text: str, argument: str):
        self.text = text
        self.argument = argument
        self.items: list[tuple[str, str, int]] = []  # (kind, value, offset)
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None:
                self.fail(f"unexpected character {text[pos:].lstrip()[0]!r}", pos)
            quoted, string, word, number, punct = match.groups()
            offset = match.start(match.lastindex)
            if quoted:
                self.items.append(("name", quoted[1:-1].replace("``", "`"), offset))
            elif string:
                self.items.append(("string", string, offset))
            elif word:
                self.items.append(("word", word, offset))
            elif number:
                self.items.append(("number", number, offset))
            else:
                self.items.append(("punct", punct, offset))
            pos = match.end()
        self.index = 0

    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        i = self.index + ahead
        return self.items[i] if i < len(self.items) else ("end", "", len(self.text))

    def take(self) -> tuple[str, str, int]:
        item = self.peek()
        self.index += 1
        return item

    def expect(self, punct: str) -> None:
        kind, value, offset = self.take()
        if kind != "punct" or value != punct:
            self.fail(f"expected '{punct}' but found {value or 'the end'!r}", offset)

    def accept_word(self, word: str) -> bool:
        kind, value, _ = self.peek()
        if kind == "word" and value.upper() == word:
            self.index += 1
            return True
        return False

    def fail(self, message: str, offset: int) -> None:
        raise InferenceConfigError(
            f"argument '{self.argument}': {message} at position {offset + 1} of "
            f"{self.text!r}. Write a Databricks type such as 'STRING', 'ARRAY<STRING>' or "
            "'STRUCT<risk: STRING, score: INT>'."
        )


def parse_type(text: str, argument: str = "returnType") -> SQLType:
    """Parse a Databricks type string; a bare field list ``'a STRING, b INT'`` is a STRUCT.

    Errors name ``argument`` (the SQL argument the string came from).
    """
    if not isinstance(text, str) or not text.strip():
        raise InferenceConfigError(f"argument '{argument}' must be a non-empty type string.")
    tokens = _Tokens(text, argument)
    first, second = tokens.peek(), tokens.peek(1)
    bare_fields = (first[0] in ("word", "name") and
                   (second[0] in ("word", "name") or second[1] == ":") and
                   first[1].upper() not in ("ARRAY", "MAP", "STRUCT"))
    result = SQLType("STRUCT", _fields(tokens, until="end")) if bare_fields else _type(tokens)
    kind, value, offset = tokens.peek()
    if kind != "end":
        tokens.fail(f"unexpected {value!r} after the type", offset)
    return result


def _type(tokens: _Tokens) -> SQLType:
    kind, value, offset = tokens.take()
    name = _ALIASES.get(value.upper()) if kind == "word" else None
    if name is None:
        tokens.fail(f"unknown type {value or 'end of text'!r}", offset)
    if name == "ARRAY":
        tokens.expect("<")
        element = _type(tokens)
        tokens.expect(">")
        return SQLType("ARRAY", (element,))
    if name == "MAP":
        tokens.expect("<")
        key = _type(tokens)
        if key.name != "STRING":
            tokens.fail("MAP keys must be STRING (JSON object keys are text)", offset)
        tokens.expect(",")
        value_type = _type(tokens)
        tokens.expect(">")
        return SQLType("MAP", (key, value_type))
    if name == "STRUCT":
        tokens.expect("<")
        return SQLType("STRUCT", _fields(tokens, until=">"))
    numbers = _type_arguments(tokens)
    if name == "DECIMAL":
        precision, scale = (numbers + [10, 0][len(numbers):])[:2]
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            tokens.fail(f"DECIMAL({precision},{scale}) is out of range", offset)
        return SQLType("DECIMAL", (precision, scale))
    return SQLType(name)


def _type_arguments(tokens: _Tokens) -> list[int]:
    if tokens.peek()[1] != "(":
        return []
    tokens.take()
    numbers = []
    while True:
        kind, value, offset = tokens.take()
        if kind != "number":
            tokens.fail(f"expected a number but found {value!r}", offset)
        numbers.append(int(value))
        if tokens.peek()[1] == ",":
            tokens.take()
            continue
        tokens.expect(")")
        return numbers


def _fields(tokens: _Tokens, until: str) -> tuple[Field, ...]:
    fields: list[Field] = []
    while True:
        kind, value, offset = tokens.peek()
        if until == ">" and value == ">" and kind == "punct":
            tokens.take()
            break
        if kind not in ("word", "name"):
            tokens.fail(f"expected a field name but found {value or 'the end'!r}", offset)
        tokens.take()
        if value in (f.name for f in fields):
            tokens.fail(f"field {value!r} appears twice", offset)
        if tokens.peek()[1] == ":":
            tokens.take()
        field_type = _type(tokens)
        nullable = True
        if tokens.accept_word("NOT"):
            if not tokens.accept_word("NULL"):
                tokens.fail("expected NULL after NOT", tokens.peek()[2])
            nullable = False
        if tokens.accept_word("COMMENT") and tokens.take()[0] != "string":
            tokens.fail("COMMENT needs a quoted string", tokens.peek(-1)[2])
        fields.append(Field(value, field_type, nullable))
        kind, value, offset = tokens.peek()
        if kind == "punct" and value == ",":
            tokens.take()
            continue
        if until == "end" and kind == "end":
            break
        if until == ">" and kind == "punct" and value == ">":
            continue  # the loop head consumes it
        closing = "" if until == "end" else " or '>'"
        tokens.fail(f"expected ','{closing} but found {value or 'the end'!r}", offset)
    if not fields:
        tokens.fail("a STRUCT needs at least one field", tokens.peek()[2])
    return tuple(fields)
