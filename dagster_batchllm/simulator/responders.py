"""Reply generators for the simulated endpoint (see `dagster_batchllm.openai_server.responder`
for what a responder is): `EchoResponder`, the default, and `schema_instance`, a document that
conforms to a JSON schema.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

from ..openai_server.responder import prompt_text

_MAX_DEPTH = 32  # stops recursive $ref schemas from recursing forever


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def pick_enum(values: list, text: str) -> Any:
    """The first enum value (in enum order) found in the text, else a stable hash pick."""
    if not values:
        return None
    lowered = text.lower()
    for value in values:
        if str(value).lower() in lowered:
            return value
    return values[stable_hash(text) % len(values)]


def schema_instance(schema: Any, text: str, root: Any = None, depth: int = 0) -> Any:
    """A deterministic JSON document that conforms to ``schema``, derived from ``text``.

    Covers what structured-output schemas use: objects (every property is emitted),
    arrays, enums, const, ``$ref`` into ``$defs``/``definitions``, ``anyOf``/``oneOf``/
    ``allOf`` (first non-null branch), nullable type lists, simple length/range bounds and the
    ``date`` and ``date-time`` string formats.
    """
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if depth > _MAX_DEPTH else text[:200]
    if "$ref" in schema:
        return schema_instance(_resolve_ref(root, schema["$ref"]), text, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return pick_enum(list(schema["enum"]), text)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if branches:
            non_null = [b for b in branches if not _is_null(b)]
            return schema_instance((non_null or branches)[0], text, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: schema_instance(sub, text, root, depth + 1)
                for name, sub in properties.items()}
    if kind == "array":
        item = schema_instance(schema.get("items", {"type": "string"}), text, root, depth + 1)
        return [item] * max(1, int(schema.get("minItems", 1)))
    if kind in ("integer", "number"):
        count = len(text.split())
        if "maximum" in schema:
            count = min(count, schema["maximum"])
        if "minimum" in schema:
            count = max(count, schema["minimum"])
        return count
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if schema.get("format") in ("date", "date-time"):  # a day of 2024 the text picks
        day = dt.date(2024, 1, 1) + dt.timedelta(days=stable_hash(text) % 366)
        return day.isoformat() if schema["format"] == "date" else f"{day.isoformat()}T12:00:00Z"
    value = text[:200]
    if "maxLength" in schema:
        value = value[: int(schema["maxLength"])]
    return value.ljust(int(schema.get("minLength", 0)), "x")


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _resolve_ref(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return {}  # remote refs are out of scope for a simulator
    node = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


class EchoResponder:
    """The default responder: deterministic replies derived from the last user message.

    Plain requests get ``"[sim] " + <last user message, whitespace-collapsed>``.
    ``response_format={"type": "json_schema", ...}`` gets a document conforming to the
    schema (see `schema_instance`); ``{"type": "json_object"}`` gets ``{"text": <prompt>}``.

    Example::

        >>> EchoResponder().respond("sim-model", [{"role": "user", "content": "hi  there"}], {})
        '[sim] hi there'
    """

    def __init__(self, models: tuple[str, ...] | list[str] = ("sim-model",)):
        self._models = list(models)

    def models(self) -> list[str]:
        return list(self._models)

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        text = prompt_text(messages)
        fmt = params.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {}
            return json.dumps(schema_instance(schema, text), ensure_ascii=False)
        if kind == "json_object":
            return json.dumps({"text": text}, ensure_ascii=False)
        return "[sim] " + text


# A small structured-output schema (one enum field) for tests and examples.
RISK_LEVEL_SCHEMA = {
    "type": "object",
    "properties": {"risk_level": {"type": "string", "enum": ["High", "Medium", "Low"]}},
    "required": ["risk_level"],
    "additionalProperties": False,
}
