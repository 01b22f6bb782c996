"""Fill a JSON schema (OpenAI structured outputs) from one text, classically.

Every value is derived from the text, by what the field's schema and name ask for:

* enums: :func:`choose_label` (lexicon + VADER); numeric enums (``[1, 2, 3, 4, 5]``) the step
  nearest the number the field would get (below); ``const``: the constant;
* strings: a field naming an entity kind (``email``, ``phone``, ``person``/``name``, ``date``,
  ``order_number``, ``amount``/``price``, ``product``, ... see :mod:`.patterns`) gets what
  that kind's pattern finds in the text, else null (``""`` where the schema does not allow
  null); a summary-like field (``summary``, ``description``, ``gist`` ...) the extractive
  summary; a sentiment/tone field the sentiment; ``language`` "English" when the text reads as
  English.  Any other free-text field is null (``""`` where null is not allowed): there is no
  classical way to write it, so nothing is made up (``ai_extract``'s labels follow these
  rules too: a label no pattern can find is always null);
* numbers: a similarity score (``ai_similarity``) the cosine of the two texts' embeddings;
  score/rating/satisfaction fields the sentiment on the field's scale; confidence fields how
  clear the sentiment is; priority/severity/urgency fields the severity level; count/length
  fields and any other number the word count; amount/price, order/account number, year and
  age fields the number the text gives (null or 0 where it gives none).  A field's own
  minimum/maximum are its scale; the machine-integer ranges a SQL ``INT`` type sends
  (-2147483648..2147483647) are not a scale, so no value lands on such a bound;
* booleans: cue evidence for the concepts the field name names.

The result validates against the schema for the subset of JSON Schema that structured outputs
use ($ref/$defs, anyOf, enum, const, object, array, string, number, integer, boolean, null,
min/max bounds and lengths).
"""

from __future__ import annotations

import re
from typing import Any

from dagster_batchllm.managed.classical import patterns
from dagster_batchllm.managed.classical.classifier import TextContext, choose_label
from dagster_batchllm.managed.classical.lexicon import concepts_of, word_list

FIELD_SUMMARY_WORDS = 20
_MAX_DEPTH = 12  # recursive schemas ($ref to self) stop here with their smallest value
_SCORE_WORDS = ("score", "rating", "sentiment", "polarity", "stars", "satisfaction", "nps")
_CONFIDENCE_WORDS = ("confidence", "probability", "likelihood", "certainty")
_SENTIMENT_FIELDS = ("sentiment", "tone", "mood", "emotion", "feeling")
_SEVERITY_FIELDS = ("priority", "severity", "urgency", "risk", "escalation")
_SEVERITY_RANK = {"low": 0.0, "medium": 0.5, "high": 1.0}
_SUMMARY_FIELDS = re.compile(
    r"summar|gist|synopsis|overview|abstract|tl;?dr|recap|digest|description|brief", re.I)
_ENGLISH = frozenset(word_list("the a an and is are was to of in for on it you i my your this"))
_MACHINE_INT_BOUNDS = {(-(2 ** bits), 2 ** bits - 1) for bits in (7, 15, 31, 63)}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_YEAR = re.compile(r"\b(?:19|20)\d{2}\b")
_AGE = re.compile(r"\b(\d{1,3})[- ](?:years?|yrs?)[- ]old\b", re.I)


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


def _scale(schema: dict) -> tuple[float | None, float | None]:
    """The field's own bounds, unless they are only a machine integer's range."""
    low, high = schema.get("minimum"), schema.get("maximum")
    if (low, high) in _MACHINE_INT_BOUNDS:
        return None, None
    return low, high


def _on_scale(unit: float, low: float | None, high: float | None,
              default: tuple[float, float]) -> float:
    """``unit`` in [0, 1] placed on [low, high] (a default where the field gives none)."""
    if low is None or high is None:
        low, high = default
    return low + unit * (high - low)


def _stated_number(kind: str | None, lname: str, text: str) -> float | None:
    """A number the text states for the field (an amount, an order number, a year, an age)."""
    if kind == "money":
        found = _NUMBER.search((patterns.find("money", text) or "").replace(",", ""))
        return float(found.group(0)) if found else None
    if kind in ("order", "account"):
        found = patterns.find(kind, text)
        digits = re.sub(r"\D", "", found or "")
        return float(digits) if digits else None
    if "year" in lname:
        found = _YEAR.search(text)
        return float(found.group(0)) if found else None
    if lname == "age" or lname.endswith("_age"):
        found = _AGE.search(text)
        return float(found.group(1)) if found else None
    return None


def _number(schema: dict, name: str, ctx: TextContext, integer: bool, nullable: bool,
            similarity: float | None) -> float | int | None:
    low, high = _scale(schema)
    lname = name.lower()
    # "order_count" counts orders: a count, not an order number.
    kind = patterns.kind_of(name) if name and "count" not in lname else None
    if similarity is not None and ("similar" in lname or "score" in lname or not name):
        value = _on_scale(max(0.0, min(1.0, similarity)), low, high, (0.0, 1.0))
    elif any(w in lname for w in _CONFIDENCE_WORDS):
        value = _on_scale(0.5 + 0.5 * abs(ctx.sentiment_score()), low, high,
                          (0, 100) if integer else (0.0, 1.0))
    elif any(w in lname for w in _SCORE_WORDS):
        unit = (ctx.sentiment_score() + 1.0) / 2.0  # [-1, 1] -> [0, 1]
        if "rating" in lname or "stars" in lname:
            default = (1, 5)
        elif "nps" in lname:
            default = (0, 10)
        else:
            default = (0, 100) if integer else (-1.0, 1.0)
        value = _on_scale(unit, low, high, default)
    elif any(w in lname for w in _SEVERITY_FIELDS):
        value = _on_scale(_SEVERITY_RANK[ctx.severity()], low, high, (1, 3))
    elif kind in ("money", "order", "account") or "year" in lname or "age" in lname.split("_"):
        stated = _stated_number(kind, lname, ctx.text)
        if stated is None:
            return None if nullable else _bounded(0, schema, integer)
        value = stated
    else:  # counts, and any number the name does not explain: the text's length in words
        value = float(len(ctx.tokens))
    return _bounded(value, schema, integer)


def _bounded(value: float, schema: dict, integer: bool) -> float | int:
    value = _clamp(value, schema)
    if integer:
        return int(_clamp(int(round(value)), schema))
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


def _reads_as_english(ctx: TextContext) -> bool:
    return bool(ctx.tokens) and sum(t in _ENGLISH for t in ctx.tokens) >= 0.15 * len(ctx.tokens)


def _string_value(schema: dict, name: str, ctx: TextContext) -> str | None:
    """The field's value, or ``None`` when the text gives nothing for it."""
    lname = name.lower()
    fmt = schema.get("format", "")
    if fmt == "date":
        return patterns.iso_date(ctx.text)
    if fmt == "date-time":
        return patterns.iso_datetime(ctx.text)
    if fmt == "email":
        return patterns.find("email", ctx.text)
    if fmt in ("uri", "url"):
        return patterns.find("url", ctx.text)
    if any(w in lname for w in _SENTIMENT_FIELDS):
        return ctx.sentiment()
    if _SUMMARY_FIELDS.search(lname):
        return ctx.summary(FIELD_SUMMARY_WORDS) or None
    if "language" in lname:
        return "English" if _reads_as_english(ctx) else None
    kind = patterns.kind_of(name) if name else None
    return patterns.find(kind, ctx.text) if kind else None


def _fit_length(value: str, schema: dict) -> str:
    max_len = schema.get("maxLength")
    if max_len is not None:
        value = value[: int(max_len)]
    min_len = int(schema.get("minLength", 0))
    if len(value) < min_len:
        value = (value + " " + "n/a " * min_len)[:min_len]
    return value


def _string(schema: dict, name: str, ctx: TextContext, nullable: bool) -> str | None:
    value = _string_value(schema, name, ctx)
    if value is None:
        return None if nullable else _fit_length("", schema)
    return _fit_length(value, schema)


def _allows_null(schema: dict, root: dict) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    branches = schema.get("anyOf") or schema.get("oneOf") or []
    return any(_pick_type(_resolve(b, root)) == "null" for b in branches)


def fill(schema: dict, ctx: TextContext, name: str = "", root: dict | None = None,
         depth: int = 0, *, similarity: float | None = None, nullable: bool = False) -> Any:
    """A value for ``schema`` describing ``ctx``; ``name`` is the field it goes in.

    ``similarity``: the request rates two texts (``ai_similarity``) and this is their cosine;
    ``nullable``: an enclosing ``anyOf`` allows null.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    nullable = nullable or _allows_null(schema, root)
    more = {"similarity": similarity}
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        strings = [o for o in options if isinstance(o, str)]
        if len(strings) >= 2:
            return choose_label(strings, ctx)
        numbers = [o for o in options if isinstance(o, int | float) and not isinstance(o, bool)]
        if len(numbers) >= 2:  # a numeric scale ("stars": [1, 2, 3, 4, 5]): the nearest step
            scale = {"minimum": min(numbers), "maximum": max(numbers)}
            wanted = _number(scale, name, ctx, False, False, similarity)
            return min(numbers, key=lambda option: (abs(option - wanted), option))
        return options[0] if options else None
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            branches = [_resolve(b, root) for b in schema[key]]
            useful = [b for b in branches if _pick_type(b) != "null"] or branches
            return fill(useful[0], ctx, name, root, depth, nullable=nullable, **more)
    kind = _pick_type(schema)
    if kind == "object":
        props = schema.get("properties", {})
        if depth >= _MAX_DEPTH:
            props = {k: v for k, v in props.items() if k in schema.get("required", ())}
        return {key: fill(sub, ctx, key, root, depth + 1, **more) for key, sub in props.items()}
    if kind == "array":
        return _array(schema, ctx, name, root, depth, similarity)
    if kind == "string":
        return _string(schema, name, ctx, nullable)
    if kind in ("number", "integer"):
        return _number(schema, name, ctx, kind == "integer", nullable, similarity)
    if kind == "boolean":
        return _boolean(name, ctx)
    if kind == "null":
        return None
    return _string_value(schema, name, ctx)  # untyped: any JSON value, null included


def _array(schema: dict, ctx: TextContext, name: str, root: dict, depth: int,
           similarity: float | None) -> list:
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
    kind = patterns.kind_of(name) if name else None
    if kind and _pick_type(items) == "string" and "format" not in items:
        # A list of entities ("emails", "phone_numbers"): every one the pattern finds.
        found = [_fit_length(v, items) for v in patterns.find_all(kind, ctx.text)]
        found = found[:high] if "maxItems" in schema else found
        return found + [_fit_length("", items)] * max(0, low - len(found))
    value = fill(items, ctx, name, root, depth + 1, similarity=similarity)
    return [value] * count
