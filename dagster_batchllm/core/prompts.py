"""From table rows to requests: templates, messages, request keys and token estimates.

A request is serialized once, canonically (sorted keys, no whitespace); that byte string is both
the HTTP body and, hashed, the request key. So the key covers exactly what the server sees:
model, messages and every generation parameter.
"""

from __future__ import annotations

import hashlib
import json
import math
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InferenceConfigError, InvalidInputError, RowError

# Reservations must never be below what the server will count. Byte-level BPE and SentencePiece
# with byte fallback emit at most one token per UTF-8 byte, plus a few chat-template tokens per
# message; so this bound holds for every tokenizer we know of, at the price of over-reserving
# while a request is in flight (the reservation is settled to the reply's usage afterwards).
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS_PER_REQUEST = 8
# For dry runs and cost estimates: the usual ~4 characters per token of English text.
_TYPICAL_CHARS_PER_TOKEN = 4

GENERATION_PARAMS = (
    "max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
    "frequency_penalty", "n", "logit_bias", "user",
)


@dataclass(frozen=True)
class PromptSpec:
    """How to turn one row into one chat request (validated before anything is sent)."""

    template: str | None = None
    prompt_column: str | None = None
    messages_column: str | None = None
    system: str | None = None
    model: str | None = None
    model_column: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    response_format: Mapping[str, Any] | None = None

    @property
    def schema(self) -> Mapping[str, Any] | None:
        if self.response_format and self.response_format.get("type") == "json_schema":
            return self.response_format["json_schema"].get("schema")
        return None

    @property
    def structured(self) -> bool:
        return bool(self.response_format) and self.response_format.get("type") != "text"

    def template_fields(self) -> list[str]:
        return template_fields(self.template) if self.template else []

    def system_fields(self) -> list[str]:
        # A system template is rendered per row, except over a messages column (which holds
        # whole conversations).
        if self.system and self.messages_column is None:
            return template_fields(self.system)
        return []

    def input_columns(self) -> list[str]:
        cols = list(self.template_fields()) + self.system_fields()
        for col in (self.prompt_column, self.messages_column, self.model_column):
            if col:
                cols.append(col)
        return list(dict.fromkeys(cols))


@dataclass(frozen=True, slots=True)
class RowRequest:
    """One rendered request: its key, its body and what the budget needs to know."""

    key: str
    model: str
    body: bytes
    reserve_tokens: int
    typical_prompt_tokens: int
    max_tokens: int


def template_fields(template: str) -> list[str]:
    """The column names a ``str.format`` template refers to, in order, without repeats."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InferenceConfigError(
            f"The prompt template is not a valid format string ({exc}). Write columns as "
            "{column} and literal braces as {{ and }}."
        ) from exc
    names = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise InferenceConfigError(
                "The prompt template has a positional field '{}'; name the column instead, "
                "for example 'Summarize: {transcript}'."
            )
        names.append(name.split(".")[0].split("[")[0])
    return list(dict.fromkeys(names))


def build_prompt_spec(
    *,
    prompt: str | None,
    prompt_column: str | None,
    messages_column: str | None,
    system: str | None,
    model: str | None,
    model_column: str | None,
    params: Mapping[str, Any],
    response_format: Any,
    columns: Sequence[str],
    served_models: frozenset[str],
) -> PromptSpec:
    """Validate the call and freeze it; every mistake here is raised before a request is sent."""
    given = [n for n, v in (("prompt", prompt), ("prompt_column", prompt_column),
                            ("messages_column", messages_column)) if v is not None]
    if len(given) != 1:
        raise InferenceConfigError(
            "Pass exactly one of prompt= (a template such as 'Summarize: {text}'), "
            f"prompt_column= or messages_column=; got {given or 'none'}."
        )
    if (model is None) == (model_column is None):
        raise InferenceConfigError(
            "Pass exactly one of model= (one model for every row) "
            "or model_column= (per-row models)."
        )
    if model is not None and model not in served_models:
        raise InferenceConfigError(
            f"No configured endpoint serves model '{model}'. Served models: "
            f"{sorted(served_models)}. Add it to an Endpoint's models list or pick one of those."
        )
    spec = PromptSpec(
        template=prompt, prompt_column=prompt_column, messages_column=messages_column,
        system=system, model=model, model_column=model_column,
        params=dict(params), response_format=normalize_response_format(response_format),
    )
    for text, what in ((prompt, "prompt template"), (system, "system template")):
        if text is not None:
            _check_template(text, what)
    missing = [c for c in spec.input_columns() if c not in columns]
    if missing:
        raise InferenceConfigError(
            f"Column(s) {missing} are not in the input table; available columns: {list(columns)}."
        )
    unknown = [k for k in params if k not in GENERATION_PARAMS and not k.startswith("extra_")]
    if unknown:
        raise InferenceConfigError(
            f"Unknown generation parameter(s) {unknown}; supported: {list(GENERATION_PARAMS)}."
        )
    return spec


def _check_template(template: str, what: str) -> None:
    """Refuse, before anything is sent, a template that cannot render text cells."""
    fields = template_fields(template)
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and ("." in name or "[" in name):
            raise InferenceConfigError(
                f"The {what} refers to '{{{name}}}': name plain columns; attribute and index "
                "access are not supported."
            )
    try:
        template.format_map(dict.fromkeys(fields, "text"))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise InferenceConfigError(
            f"The {what} cannot be rendered ({type(exc).__name__}: {exc}). Cells are rendered "
            "as text, so numeric format specs such as '{price:.2f}' do not apply."
        ) from None


def normalize_response_format(response_format: Any) -> dict[str, Any] | None:
    """Accept a bare JSON schema, an OpenAI ``response_format`` dict, or a JSON string of either."""
    if response_format is None:
        return None
    if isinstance(response_format, str):
        try:
            response_format = json.loads(response_format)
        except ValueError as exc:
            raise InferenceConfigError(
                f"response_format is a string but not JSON ({exc}); pass a JSON schema as a dict."
            ) from exc
    if not isinstance(response_format, Mapping):
        raise InferenceConfigError("response_format must be a JSON schema (a dict) or None.")
    kind = response_format.get("type")
    if kind in ("text", "json_object"):
        return dict(response_format)
    if kind == "json_schema":
        inner = response_format.get("json_schema")
        if not isinstance(inner, Mapping) or not isinstance(inner.get("schema"), Mapping):
            raise InferenceConfigError(
                "response_format of type 'json_schema' needs {'json_schema': {'name': ..., "
                "'schema': {...}}}."
            )
        _check_schema(inner["schema"])
        return {"type": "json_schema", "json_schema": dict(inner)}
    _check_schema(response_format)
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": dict(response_format), "strict": True},
    }


def _check_schema(schema: Mapping[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InferenceConfigError(
            f"response_format is not a valid JSON schema: {exc.message}"
        ) from None


def row_tuples(frame: Any) -> Iterator[tuple]:
    """A DataFrame's rows as plain tuples, in column order. A frame without columns (a template
    that names none) still gives one empty tuple per row, which ``itertuples`` does not."""
    if len(frame.columns) == 0:
        return iter([()] * len(frame))
    return frame.itertuples(index=False, name=None)


def iter_row_requests(
    rows: Iterator[tuple], spec: PromptSpec, *, default_max_tokens: int
) -> Iterator[RowRequest | RowError]:
    """Render each row (a tuple in ``spec.input_columns()`` order) into a request or an error."""
    columns = spec.input_columns()
    position = {c: i for i, c in enumerate(columns)}
    fields = spec.template_fields()
    system_fields = spec.system_fields()
    params = dict(spec.params)
    if params.get("max_tokens") is None:
        # Always bound the completion: a budget can only be kept if every reply is bounded.
        params["max_tokens"] = default_max_tokens
    if spec.response_format is not None:
        params["response_format"] = spec.response_format
    max_tokens = int(params["max_tokens"])
    for row in rows:
        try:
            if spec.messages_column is not None:
                messages = _messages_from_cell(row[position[spec.messages_column]])
            else:
                if spec.template is not None:
                    text = _render(spec.template, fields, row, position)
                else:
                    text = _cell_text(row[position[spec.prompt_column]], spec.prompt_column)
                messages = [{"role": "user", "content": text}]
                if spec.system:
                    system = _render(spec.system, system_fields, row, position)
                    messages.insert(0, {"role": "system", "content": system})
            model = spec.model if spec.model is not None else _cell_text(
                row[position[spec.model_column]], spec.model_column
            )
            yield make_request(model, messages, params, max_tokens)
        except RowError as error:
            yield error


def make_request(
    model: str, messages: list[dict[str, Any]], params: Mapping[str, Any], max_tokens: int
) -> RowRequest:
    payload = {"model": model, "messages": messages, **params}
    try:
        body = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"the prompt is not valid Unicode text ({exc.reason})") from None
    except (ValueError, TypeError) as exc:  # NaN, or a cell object JSON cannot hold
        raise InvalidInputError(f"the request cannot be encoded as JSON ({exc})") from None
    content_bytes = 0
    content_chars = 0
    for message in messages:
        content = message.get("content") or ""
        text = content if isinstance(content, str) else json.dumps(content)
        content_chars += len(text)
        content_bytes += len(text.encode("utf-8"))
    n = len(messages)
    typical = math.ceil(content_chars / _TYPICAL_CHARS_PER_TOKEN) + 4 * n
    upper = content_bytes + _TEMPLATE_TOKENS_PER_MESSAGE * n + _TEMPLATE_TOKENS_PER_REQUEST
    return RowRequest(
        key=hashlib.sha256(body).hexdigest(), model=model, body=body,
        reserve_tokens=upper + max_tokens, typical_prompt_tokens=typical, max_tokens=max_tokens,
    )


def _render(template: str, fields: list[str], row: tuple, position: dict[str, int]) -> str:
    values = {name: _cell_text(row[position[name]], name) for name in fields}
    try:
        text = template.format_map(values)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidInputError(f"the template cannot be rendered for this row ({exc})") from None
    if not text.strip():
        raise InvalidInputError("the rendered prompt is empty")
    return text


def _cell_text(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise InvalidInputError(f"column '{column}' is null")
    if isinstance(value, str):
        text = value
    elif isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"column '{column}' holds bytes that are not UTF-8") from None
    elif isinstance(value, bool | int | float) or type(value).__module__ == "numpy":
        if _is_missing(value):
            raise InvalidInputError(f"column '{column}' is null")
        text = str(value)
    else:
        try:
            import pandas as pd

            if pd.isna(value) is True:
                raise InvalidInputError(f"column '{column}' is null")
        except (TypeError, ValueError):
            pass
        raise InvalidInputError(
            f"column '{column}' holds a {type(value).__name__}, not text"
        )
    if not text.strip():
        raise InvalidInputError(f"column '{column}' is empty")
    return text


def _is_missing(value: Any) -> bool:
    try:
        return bool(value != value)  # NaN and NaT are not equal to themselves
    except (TypeError, ValueError):
        return False


def _messages_from_cell(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidInputError("the messages cell is a string but not JSON") from None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInputError("the messages cell must be a non-empty list of {role, content}")
    messages = []
    for item in value:
        if not isinstance(item, Mapping) or "role" not in item or "content" not in item:
            raise InvalidInputError("each message needs 'role' and 'content'")
        content = item["content"]
        if content is None or (isinstance(content, str) and not content.strip()):
            raise InvalidInputError(f"a '{item['role']}' message has empty content")
        messages.append({"role": str(item["role"]), "content": content})
    return messages
