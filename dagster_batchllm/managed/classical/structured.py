"""Fill a JSON schema (OpenAI structured outputs) from one text, heuristically.

Every value is derived from the text: enums through :func:`choose_label`, free strings
through the summarizer or a regex extractor chosen by the field name, numbers from sentiment
or word counts, booleans from cue evidence.  The result always validates against the schema
for the subset of JSON Schema that structured outputs use ($ref/$defs, anyOf, enum, const,
object, array, string, number, integer, boolean, null, min/max bounds and lengths).
"""

from __future__ import annotations

import re
from typing import Any

from dagster_batchllm.managed.classical.classifier import TextContext, choose_label
from dagster_batchllm.managed.classical.lexicon import concepts_of

FIELD_SUMMARY_WORDS = 20
_MAX_DEPTH = 12  # recursive schemas ($ref to self) stop here with their smallest value
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_PHONE = re.compile(r"\+?\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_NAME = re.compile(r"\b(?:my name is|this is|i am|i'm)\s+([A-Z][a-z]+(?:\s+[A-Z][a-z]+)?)")
_SCORE_WORDS = ("score", "rating", "sentiment", "polarity", "stars", "satisfaction", "nps")
_CONFIDENCE_WORDS = ("confidence", "probability", "likelihood", "certainty")
_SENTIMENT_FIELDS = ("sentiment", "tone", "mood", "emotion", "feeling")


def _resolve(schema: dict, root: dict) -> dict:
    """Follow local ``$ref`` pointers ("#/$defs/X", "#/definitions/X")."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 32:
        node: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            if part:
                node = node.get(part.replace("~1", "/").replace("~0", "~"), {})
        schema = node if isinstance(node, dict) else {}
        seen += 1
    return schema if isinstance(schema, dict) else {}


def _pick_type(schema: dict) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        return non_null[0] if non_null else "null"
    if kind is None and "properties" in schema:
        return "object"
    return kind


def _clamp(value: float, schema: dict) -> float:
    """Respect minimum/maximum (exclusive bounds nudged inward)."""
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        value = schema["exclusiveMinimum"] + 1
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        value = schema["exclusiveMaximum"] - 1
    return value


def _number(schema: dict, name: str, ctx: TextContext, integer: bool) -> float | int:
    low, high = schema.get("minimum"), schema.get("maximum")
    lname = name.lower()
    if any(w in lname for w in _CONFIDENCE_WORDS):
        value = 0.5 + 0.5 * abs(ctx.sentiment_score())
        if low is not None and high is not None:
            value = low + value * (high - low)
    elif any(w in lname for w in _SCORE_WORDS):
        unit = (ctx.sentiment_score() + 1.0) / 2.0  # [-1, 1] -> [0, 1]
        if low is None or high is None:
            low, high = (1, 5) if ("rating" in lname or "stars" in lname) else (-1, 1)
        value = low + unit * (high - low)
    else:
        value = float(len(ctx.tokens))
    value = _clamp(value, schema)
    if integer:
        value = int(round(value))
        return int(_clamp(value, schema))
    return round(value, 4)


def _boolean(name: str, ctx: TextContext) -> bool:
    """True when the field name's concepts (or its own words) have evidence in the text."""
    concepts, words, negated = concepts_of(name.replace("_", " "))
    evidence = sum(ctx.concept_score(c) for c in concepts if c not in ("neutral", "low"))
    evidence += sum(1.0 for w in words if w in ctx.stem_set and w not in ("is", "has"))
    if "question" in name.lower() and "?" in ctx.text:
        evidence += 1.0
    present = evidence >= 1.0
    return not present if negated else present


def _string(schema: dict, name: str, ctx: TextContext) -> str:
    lname = name.lower()
    fmt = schema.get("format", "")
    value: str | None = None
    if fmt == "email" or "email" in lname:
        found = _EMAIL.search(ctx.text)
        value = found.group(0) if found else "unknown@example.com"
    elif fmt in ("date", "date-time"):
        found = _DATE.search(ctx.text)
        value = found.group(0) if found else "1970-01-01"
        value += "T00:00:00Z" if fmt == "date-time" else ""
    elif "phone" in lname:
        found = _PHONE.search(ctx.text)
        value = found.group(0) if found else ""
    elif lname in ("name", "customer_name", "person", "caller_name"):
        found = _NAME.search(ctx.text)
        value = found.group(1) if found else ""
    elif any(w in lname for w in _SENTIMENT_FIELDS):
        value = ctx.sentiment()
    elif "language" in lname:
        value = "English"
    if value is None:
        value = ctx.summary(FIELD_SUMMARY_WORDS)
    max_len = schema.get("maxLength")
    if max_len is not None:
        value = value[: int(max_len)]
    min_len = int(schema.get("minLength", 0))
    if len(value) < min_len:
        value = (value + " " + "n/a " * min_len)[:min_len] if min_len else value
    return value


def fill(schema: dict, ctx: TextContext, name: str = "", root: dict | None = None,
         depth: int = 0) -> Any:
    """A value for ``schema`` describing ``ctx``; ``name`` is the field it goes in."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        strings = [o for o in options if isinstance(o, str)]
        if len(strings) >= 2:
            return choose_label(strings, ctx)
        return options[0] if options else None
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            branches = [_resolve(b, root) for b in schema[key]]
            useful = [b for b in branches if _pick_type(b) != "null"] or branches
            return fill(useful[0], ctx, name, root, depth)
    kind = _pick_type(schema)
    if kind == "object":
        props = schema.get("properties", {})
        if depth >= _MAX_DEPTH:
            props = {k: v for k, v in props.items() if k in schema.get("required", ())}
        return {key: fill(sub, ctx, key, root, depth + 1) for key, sub in props.items()}
    if kind == "array":
        return _array(schema, ctx, name, root, depth)
    if kind == "string":
        return _string(schema, name, ctx)
    if kind in ("number", "integer"):
        return _number(schema, name, ctx, integer=kind == "integer")
    if kind == "boolean":
        return _boolean(name, ctx)
    if kind == "null":
        return None
    return ctx.summary(FIELD_SUMMARY_WORDS)  # untyped: a string is always valid


def _array(schema: dict, ctx: TextContext, name: str, root: dict, depth: int) -> list:
    items = _resolve(schema.get("items", {}), root)
    low = int(schema.get("minItems", 0))
    high = int(schema.get("maxItems", max(low, 1)))
    if depth >= _MAX_DEPTH or high == 0:
        count = low
    else:
        count = max(low, min(1, high))
    labels = [o for o in items.get("enum", []) if isinstance(o, str)]
    if labels:  # multi-label: the best label first, then the rest in their order
        best = choose_label(labels, ctx)
        ordered = [best] + [lab for lab in labels if lab != best]
        if schema.get("uniqueItems"):
            return ordered[:count]
        return (ordered * (count // len(ordered) + 1))[:count]
    value = fill(items, ctx, name, root, depth + 1)
    return [value] * count
