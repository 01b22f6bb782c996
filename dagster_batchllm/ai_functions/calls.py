"""A bound call: one AI function with its constant arguments checked and resolved.

Both engines turn the arguments of ``ai_query(...)`` or ``ai_classify(...)`` into the same
:class:`BoundCall`: the system prompt, generation parameters and response format every row of
the call sends, the SQL type of the result and how to read a reply into it. Argument mistakes
raise :class:`~dagster_batchllm.core.errors.InferenceConfigError` naming the function and argument,
before anything is sent.

Example::

    >>> from dagster_batchllm.ai_functions.calls import model_parameters, response_format
    >>> model_parameters("ai_query", {"max_tokens": 64, "temperature": 0})
    {'max_tokens': 64, 'temperature': 0}
    >>> fmt, sql_type = response_format("ai_query", "STRUCT<risk: STRING>")
    >>> sql_type.ddl()
    'STRUCT<risk: STRING>'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from ..core import (
    GENERATION_PARAMS,
    ErrorType,
    InferenceCall,
    InferenceConfigError,
    RowError,
    literal_template,
    normalize_response_format,
)
from .schemas import to_json_schema, type_from_schema
from .types import STRING, SQLType, parse_type, struct

Reader = Callable[[Any], Any]


@dataclass(frozen=True, eq=False)
class BoundCall:
    """What every row of one SQL call sends, and what its result is.

    ``request_id`` identifies the request apart from model and row text: two calls with equal
    ids send identical requests for identical rows, so their answers are shared.
    Identity equality on purpose: the engines cache one instance per distinct argument list.
    """

    function: str
    system: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    response_format: Mapping[str, Any] | None = None
    result_type: SQLType = STRING
    fail_on_error: bool = True
    reader: Reader | None = None  # engine output -> SQL value; raises RowError to fail the row
    # A reply that cannot be read as the result (not JSON, not the schema, a label not offered)
    # is NULL rather than a row error: Databricks' ai_classify and ai_analyze_sentiment return
    # NULL when they cannot classify. Errors of the request itself still fail the row.
    null_when_unreadable: bool = False
    # ``response_format`` is ai_query's returnType asked of a chat model (schemas.
    # return_type_format): an embedding or custom model, which answers in its own type, has no
    # use for it, and an explicit responseFormat is refused there.
    format_from_return_type: bool = False
    # A ``dagster_batchllm.semantic.Cascade``: the call's rows go to its proxy, the unsure ones
    # to its oracle (see semantic/cascade.py), all of the call's rows at once.
    cascade: Any = None

    @cached_property
    def request_id(self) -> str:
        cascade = None if self.cascade is None else self.cascade.as_dict()
        return json.dumps([self.system, self.params, self.response_format, cascade],
                          sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def sql_type(self) -> SQLType:
        """The type the SQL expression has: the result, or ``result``/``errorMessage``."""
        return self.result_type if self.fail_on_error else result_struct(self.result_type)

    def inference_call(self, base: InferenceCall | None = None, /, **fields: Any
                       ) -> InferenceCall:
        """The :class:`InferenceCall` that sends this call's requests: ``base`` (or a call of
        ``fields``) with this call's system prompt (literal text, not a template), response
        format and generation parameters (on top of the base's)."""
        system = literal_template(self.system) if self.system is not None else None
        return InferenceCall.of(base, system=system, response_format=self.response_format,
                                **fields, **self.params)


def result_struct(result_type: SQLType) -> SQLType:
    """Databricks' ``failOnError => false`` shape: ``STRUCT<result: T, errorMessage: STRING>``."""
    return struct(result=result_type, errorMessage=STRING)


# -- argument checks ---------------------------------------------------------------------------
def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


def as_bool(function: str, name: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # SQLite has no boolean type
        return bool(value)
    raise InferenceConfigError(
        f"{function}: argument '{name}' must be a BOOLEAN (true or false), got {_describe(value)}.")


def as_int(function: str, name: str, value: Any, default: int, minimum: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InferenceConfigError(
                f"{function}: argument '{name}' must be an INTEGER, got {_describe(value)}.")
    if value < minimum:
        raise InferenceConfigError(
            f"{function}: argument '{name}' must be at least {minimum}, got {value}.")
    return value


def as_text(function: str, name: str, value: Any, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InferenceConfigError(
            f"{function}: argument '{name}' must be a non-empty STRING, got {_describe(value)}.")
    return value


def _json_text(function: str, name: str, value: Any, expected: str) -> Any:
    """SQL engines without arrays or structs pass JSON text; read it."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise InferenceConfigError(
            f"{function}: argument '{name}' must be {expected}; got a STRING that is not JSON: "
            f"{value[:60]!r}.") from None


def as_labels(function: str, name: str, value: Any, *, minimum: int = 1) -> tuple[str, ...]:
    expected = "an ARRAY<STRING> (SQLite: JSON text such as json_array('a', 'b'))"
    value = _json_text(function, name, value, expected)
    if (not isinstance(value, list | tuple)
            or not all(isinstance(v, str) and v.strip() for v in value)):
        raise InferenceConfigError(
            f"{function}: argument '{name}' must be {expected} of non-empty strings, "
            f"got {_describe(value)}.")
    if len(value) < minimum:
        raise InferenceConfigError(
            f"{function}: argument '{name}' needs at least {minimum} labels, got {len(value)}.")
    if len(set(value)) != len(value):
        raise InferenceConfigError(f"{function}: argument '{name}' repeats a label: {value}.")
    return tuple(value)


def model_parameters(function: str, value: Any) -> dict[str, Any]:
    """``modelParameters`` (a struct, map or JSON object) -> generation parameters."""
    name = "modelParameters"
    if value is None:
        return {}
    value = _json_text(function, name, value, "a STRUCT or JSON object")
    if not isinstance(value, Mapping):
        raise InferenceConfigError(
            f"{function}: argument '{name}' must be a STRUCT or JSON object such as "
            f"{{'max_tokens': 100, 'temperature': 0.0}}, got {_describe(value)}.")
    params = {str(k): v for k, v in value.items() if v is not None}
    unknown = sorted(k for k in params if k not in GENERATION_PARAMS
                     and not k.startswith("extra_"))
    if unknown:
        raise InferenceConfigError(
            f"{function}: argument '{name}' has unknown parameter(s) {unknown}; "
            f"supported: {list(GENERATION_PARAMS)}.")
    if "max_tokens" in params:
        params["max_tokens"] = as_int(function, f"{name}.max_tokens", params["max_tokens"], 0, 1)
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if key in params and (isinstance(params[key], bool)
                              or not isinstance(params[key], int | float)):
            raise InferenceConfigError(
                f"{function}: argument '{name}.{key}' must be a number, "
                f"got {_describe(params[key])}.")
    return params


def response_format(function: str, text: Any) -> tuple[dict[str, Any] | None, SQLType | None]:
    """``responseFormat`` -> (the OpenAI ``response_format`` to send, the SQL result type).

    Accepts a Databricks type string (``'STRUCT<risk: STRING>'``), a JSON schema, or an OpenAI
    ``response_format`` object (``json_schema``, ``json_object`` or ``text``) as JSON text.
    """
    if text is None:
        return None, None
    if not isinstance(text, str) or not text.strip():
        raise InferenceConfigError(
            f"{function}: argument 'responseFormat' must be a STRING holding a JSON schema or a "
            f"type such as 'STRUCT<risk: STRING>', got {_describe(text)}.")
    return _response_format(function, text)


@lru_cache(maxsize=256)
def _response_format(function: str, text: str) -> tuple[dict[str, Any] | None, SQLType | None]:
    name = "responseFormat"
    if not text.lstrip().startswith("{"):
        sql_type = _parse(function, text, name)
        if sql_type.name != "STRUCT":
            raise InferenceConfigError(
                f"{function}: argument '{name}' must be a STRUCT<...> type (a model answers a "
                f"JSON object), got {sql_type.ddl()}; for a single value use returnType.")
        return to_json_schema(sql_type), sql_type
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise InferenceConfigError(
            f"{function}: argument '{name}' starts with '{{' but is not valid JSON ({exc})."
        ) from None
    try:
        normalized = normalize_response_format(parsed)
    except InferenceConfigError as exc:
        raise InferenceConfigError(f"{function}: argument '{name}': {exc}") from None
    kind = normalized["type"]
    if kind == "text":
        return None, None
    if kind == "json_object":
        return normalized, type_from_schema({})
    return normalized, type_from_schema(normalized["json_schema"]["schema"])


def return_type(function: str, text: Any) -> SQLType | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise InferenceConfigError(
            f"{function}: argument 'returnType' must be a STRING such as 'INT' or "
            f"'ARRAY<STRING>', got {_describe(text)}.")
    return _parse(function, text, "returnType")


@lru_cache(maxsize=256)
def _parse(function: str, text: str, name: str) -> SQLType:
    try:
        return parse_type(text, name)
    except InferenceConfigError as exc:
        raise InferenceConfigError(f"{function}: {exc}") from None


_UNREADABLE = f"{ErrorType.STRUCTURED_OUTPUT.value}:"


def read_outcome(call: BoundCall, raw: tuple[Any, str | None]) -> tuple[Any, str | None]:
    """A row's (value, error) as SQL sees it: the reader takes the value out of the parsed
    reply; a reply it cannot read becomes the row's error, or NULL for a call whose
    ``null_when_unreadable`` is set (see :class:`BoundCall`)."""
    value, error = _read(call, raw)
    if error is not None and call.null_when_unreadable and error.startswith(_UNREADABLE):
        return None, None
    return value, error


def _read(call: BoundCall, raw: tuple[Any, str | None]) -> tuple[Any, str | None]:
    output, error = raw
    if error is not None or output is None or call.reader is None:
        return output, error
    try:
        return call.reader(output), None
    except RowError as exc:
        return None, exc.as_cell()
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"{_UNREADABLE} {type(exc).__name__}: {exc}"


def sendable(text: Any) -> bool:
    """Whether a row's text is sent: SQL NULL and text that is empty or only whitespace are
    not (the row's result is NULL), as Databricks documents NULL in, NULL out; a model has
    nothing to answer in a blank request, which the endpoint would refuse."""
    if isinstance(text, str):
        return bool(text.strip())
    return text is not None and text == text  # pandas' NaN, not equal to itself, is NULL
