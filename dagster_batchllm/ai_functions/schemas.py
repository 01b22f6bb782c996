"""SQL types and JSON: the schema to ask a model for, the type a schema means, reading replies.

``ai_query``'s ``returnType`` on a chat model becomes a structured-output request
(:func:`return_type_format`): the type's JSON schema, a STRUCT as it is and any other type as the
one field ``value`` of an object, since structured-output APIs want an object at the root
(OpenAI's strict mode refuses anything else). :func:`read_return_type` reads the reply back.

Example::

    >>> from dagster_batchllm.ai_functions.schemas import to_json_schema, type_from_schema
    >>> from dagster_batchllm.ai_functions.types import parse_type
    >>> to_json_schema(parse_type("STRUCT<score: INT NOT NULL>"))["properties"]["score"]
    {'type': 'integer', 'minimum': -2147483648, 'maximum': 2147483647}
    >>> type_from_schema({"type": "object", "properties": {"tags": {"type": "array",
    ...                   "items": {"type": "string"}}}}).ddl()
    'STRUCT<tags: ARRAY<STRING>>'
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from ..core import StructuredOutputError
from .types import INT_BITS, JSON_TYPE, STRING, Field, SQLType


def to_json_schema(t: SQLType) -> dict[str, Any]:
    """The JSON schema that asks a model for a value of this type (strict-mode friendly)."""
    if t.name == "STRING":
        return {"type": "string"}
    if t.name in INT_BITS:
        bits = INT_BITS[t.name]
        return {"type": "integer", "minimum": -(2 ** bits), "maximum": 2 ** bits - 1}
    if t.name in ("FLOAT", "DOUBLE", "DECIMAL"):
        return {"type": "number"}
    if t.name == "BOOLEAN":
        return {"type": "boolean"}
    if t.name == "DATE":
        return {"type": "string", "format": "date"}
    if t.name == "TIMESTAMP":
        return {"type": "string", "format": "date-time"}
    if t.name == "ARRAY":
        return {"type": "array", "items": to_json_schema(t.args[0])}
    if t.name == "MAP":
        return {"type": "object", "additionalProperties": to_json_schema(t.args[1])}
    if t.name == "STRUCT":
        return {
            "type": "object",
            "properties": {f.name: _nullable(to_json_schema(f.type), f.nullable) for f in t.args},
            "required": [f.name for f in t.args],
            "additionalProperties": False,
        }
    return {}  # JSON: any document


RETURN_TYPE_FIELD = "value"  # the one field a non-STRUCT returnType is asked for in


def return_type_format(t: SQLType) -> dict[str, Any]:
    """The OpenAI ``response_format`` that asks a chat model for a value of ``returnType`` ``t``.

    Example::

        >>> from dagster_batchllm.ai_functions.types import parse_type
        >>> fmt = return_type_format(parse_type("BOOLEAN"))
        >>> fmt["json_schema"]["schema"]["properties"], fmt["json_schema"]["strict"]
        ({'value': {'type': 'boolean'}}, True)
    """
    schema = to_json_schema(t)
    if t.name != "STRUCT":
        schema = {"type": "object", "properties": {RETURN_TYPE_FIELD: schema},
                  "required": [RETURN_TYPE_FIELD], "additionalProperties": False}
    # Strict mode needs every object closed and typed: a MAP (additionalProperties) or a JSON
    # value (any document) cannot be said so, and a strict server would refuse the schema.
    return {"type": "json_schema",
            "json_schema": {"name": "return_type", "schema": schema, "strict": _closed(t)}}


def _closed(t: SQLType) -> bool:
    if t.name in ("MAP", "JSON"):
        return False
    if t.name == "ARRAY":
        return _closed(t.args[0])
    if t.name == "STRUCT":
        return all(_closed(f.type) for f in t.args)
    return True


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    if not nullable:
        return schema
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]} if schema else schema


def type_from_schema(schema: Mapping[str, Any]) -> SQLType:
    """The SQL type a JSON schema's documents map onto; what has no SQL shape stays JSON."""
    if "enum" in schema or "const" in schema:
        values = list(schema.get("enum", [schema.get("const")]))
        if values and all(isinstance(v, str) for v in values):
            return STRING
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return SQLType("BIGINT")
        return JSON_TYPE
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if len(non_null) == 1 else None
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "object":
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            required = set(schema.get("required", ()))
            return SQLType("STRUCT", tuple(
                Field(name, type_from_schema(sub) if isinstance(sub, Mapping) else JSON_TYPE,
                      nullable=name not in required or _allows_null(sub))
                for name, sub in properties.items()))
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            return SQLType("MAP", (STRING, type_from_schema(extra)))
        return JSON_TYPE
    if kind == "array":
        items = schema.get("items")
        return SQLType("ARRAY", (type_from_schema(items) if isinstance(items, Mapping)
                                 else JSON_TYPE,))
    return {"string": STRING, "integer": SQLType("BIGINT"), "number": SQLType("DOUBLE"),
            "boolean": SQLType("BOOLEAN")}.get(kind, JSON_TYPE)


def _allows_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return True
    kind = schema.get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


# -- reading replies -------------------------------------------------------------------------
_FENCE = re.compile(r"^\s*```[A-Za-z]*\s*\n?(.*?)\n?\s*```\s*$", re.S)


def coerce_reply(text: str, t: SQLType) -> Any:
    """Read an unstructured reply as a value of ``t`` (for ``returnType``); a per-row error if not.

    Example::

        >>> from dagster_batchllm.ai_functions.types import parse_type
        >>> coerce_reply(" 42 ", parse_type("INT"))
        42
        >>> coerce_reply('```json\\n["a", "b"]\\n```', parse_type("ARRAY<STRING>"))
        ['a', 'b']
    """
    if t.name == "STRING":
        return text
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        if t.name == "BOOLEAN" and body.lower() in ("true", "false"):
            value: Any = body.lower() == "true"
        elif t.name in ("DATE", "TIMESTAMP"):
            value = body.strip('"')
            parse = dt.date.fromisoformat if t.name == "DATE" else dt.datetime.fromisoformat
            parse(value)
        else:
            value = json.loads(body)
    except ValueError:
        raise StructuredOutputError(
            f"the reply is not a {t.ddl()} (returnType): {text[:120]!r}") from None
    import jsonschema

    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(to_json_schema(t)).iter_errors(value))
    if error is not None:
        raise StructuredOutputError(
            f"the reply is not a {t.ddl()} (returnType): {error.message[:160]}")
    return value


def read_return_type(output: Any, t: SQLType) -> Any:
    """A reply as a value of ``returnType`` ``t``; :class:`StructuredOutputError` if it is not.

    A chat model was asked for ``t`` (:func:`return_type_format`), and its reply arrives parsed
    and checked against that schema: a STRUCT is the value, any other type its ``value`` field.
    A custom (MLflow) model's prediction arrives as text, read by :func:`coerce_reply`.

    Example::

        >>> from dagster_batchllm.ai_functions.types import parse_type
        >>> read_return_type({"value": [1.0, 2]}, parse_type("ARRAY<INT>"))
        [1, 2]
        >>> read_return_type("0.93", parse_type("DOUBLE"))
        0.93
    """
    if isinstance(output, str):
        return coerce_reply(output, t)
    value = output if t.name == "STRUCT" else output[RETURN_TYPE_FIELD]
    return _conform(value, t)


def _conform(value: Any, t: SQLType) -> Any:
    """What the JSON schema leaves open: a date that is no date (``format`` is not checked), an
    integer written ``3.0`` (valid JSON Schema, which engines' JSON readers may refuse)."""
    if value is None:
        return None
    if t.name in INT_BITS and isinstance(value, float):
        return int(value)  # the schema admitted it, so it is integral
    if t.name in ("DATE", "TIMESTAMP"):
        parse = dt.date.fromisoformat if t.name == "DATE" else dt.datetime.fromisoformat
        try:
            parse(value)
        except (TypeError, ValueError):
            raise StructuredOutputError(
                f"the reply is not a {t.ddl()} (returnType): {str(value)[:120]!r}") from None
    if t.name == "ARRAY":
        return [_conform(v, t.args[0]) for v in value]
    if t.name == "MAP":
        return {k: _conform(v, t.args[1]) for k, v in value.items()}
    if t.name == "STRUCT":
        return {f.name: _conform(value.get(f.name), f.type) for f in t.args}
    return value
