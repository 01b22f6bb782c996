"""``InferenceCall``: one frozen description of the work, checked before a row is read.

The asset factory, ``infer()``, the SQL functions and the Spark tasks all build one of these;
the fields below are the one list of what a call can say (the Component's YAML attributes are
derived from it). Everything that can be checked without the data is checked when the call is
built; :meth:`InferenceCall.bind` checks it against a table and the configured endpoints.

Example::

    >>> call = InferenceCall(prompt="Summarize: {text}", model="llama-70b",
    ...                      output_column="summary", max_tokens=64)
    >>> call.input_columns(), call.error_column, call.request_params
    (['text'], 'summary_error', {'max_tokens': 64})
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import numbers
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InferenceConfigError, InvalidInputError
from ...settings import described
from ..base import CallBase, version_of
from .images import DEFAULT_MAX_IMAGE_BYTES, IMAGE_DETAILS, image_columns

# The OpenAI chat parameters a call may set besides max_tokens and temperature.
GENERATION_PARAMS = (
    "max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
    "frequency_penalty", "n", "logit_bias", "user", "logprobs", "top_logprobs",
)


@dataclass(frozen=True)
class InferenceCall(CallBase):
    """What to send for each row and where the answers go."""

    job, entry = "chat", "infer"

    prompt: str | None = described(
        "A prompt template over the input's columns, e.g. 'Summarize: {text}' "
        "(literal braces as {{ and }}).", None)
    prompt_column: str | None = described("A column holding each row's whole prompt.", None)
    messages_column: str | None = described(
        "A column holding each row's chat messages: a list of {role, content} or its JSON.", None)
    system: str | None = described(
        "A system prompt, a template over the input's columns like prompt.", None)
    model: str | None = described(
        "The model for every row; by default the resource's default_model.", None)
    model_column: str | None = described("A column naming each row's model.", None)
    output_column: str = described(
        "The column that receives the answers (errors go to <column>_error).", "output")
    error_column: str | None = described(
        "The error column; by default <output_column>_error.", None)
    max_tokens: int | None = described(
        "Most completion tokens per row; by default the resource's default_max_tokens.", None)
    temperature: float | None = described("Sampling temperature.", None)
    generation_params: Mapping[str, Any] = described(
        "Other OpenAI chat parameters: top_p, stop, seed, presence_penalty, "
        "frequency_penalty, ...", default_factory=dict)
    response_format: Mapping[str, Any] | None = described(
        "A JSON schema (or an OpenAI response_format): replies are parsed and validated "
        "per row.", None)
    cells_as_text: bool = described(
        "Render numbers, booleans, timestamps and UTF-8 bytes in prompt cells as text; "
        "by default such a cell is a per-row error (it is usually the wrong column).", False)
    images: str | list[str] | None = described(
        "A column (or list of columns; 'page' or '{page}') of images sent with each row's "
        "prompt: bytes, local file paths or http(s) URLs (a cell may hold a list of them, "
        "e.g. a document's pages). Bytes and files are sent as data: URIs (PNG, JPEG, WebP or "
        "GIF).", None)
    image_detail: str = described(
        "OpenAI's image detail: 'auto' (not sent; budgeted as 'high'), 'low' (85 "
        "tokens an image) or 'high' (85 + 170 per 512-pixel tile).", "auto")
    max_image_bytes: int = described(
        "Largest image a row may send, in bytes (OpenAI's limit, "
        "20 MiB, by default); a larger one is a per-row error.", DEFAULT_MAX_IMAGE_BYTES)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalized values are set once, here
        given = [n for n in ("prompt", "prompt_column", "messages_column")
                 if getattr(self, n) is not None]
        if len(given) != 1:
            raise InferenceConfigError(
                "pass exactly one of prompt= (a template such as 'Summarize: {text}'), "
                f"prompt_column= or messages_column=; got {given or 'none'}."
            )
        if self.model is not None and self.model_column is not None:
            raise InferenceConfigError(
                "pass model= or model_column=, not both (or neither, to use the resource's "
                "default_model)."
            )
        self._check_common()
        for text, what in ((self.prompt, "prompt template"), (self.system, "system template")):
            if text is not None:
                check_template(text, what)
        if self.max_tokens is not None:
            set_(self, "max_tokens", checked_param("max_tokens", self.max_tokens))
        if self.temperature is not None:
            set_(self, "temperature", checked_param("temperature", self.temperature))
        params = {k: v for k, v in dict(self.generation_params or {}).items() if v is not None}
        unknown = [k for k in params if k not in GENERATION_PARAMS and not k.startswith("extra_")]
        if unknown:
            raise InferenceConfigError(
                f"Unknown generation parameter(s) {unknown}; supported: {list(GENERATION_PARAMS)}."
            )
        set_(self, "generation_params", {k: checked_param(k, v) for k, v in params.items()})
        set_(self, "response_format", normalize_response_format(self.response_format))
        self._check_images()

    def _check_images(self) -> None:
        try:
            names = image_columns(self.images)
        except InvalidInputError as exc:
            raise InferenceConfigError(str(exc)) from None
        object.__setattr__(self, "images", list(names) or None)
        if names and self.messages_column is not None:
            raise InferenceConfigError(
                "images= adds image parts to the prompt's user message; a messages_column "
                "holds whole conversations, so put the image parts in its messages instead.")
        if self.image_detail not in IMAGE_DETAILS:
            raise InferenceConfigError(
                f"image_detail must be one of {list(IMAGE_DETAILS)}, got {self.image_detail!r}.")
        limit = self.max_image_bytes
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
            raise InferenceConfigError(
                f"max_image_bytes must be a positive whole number, got {limit!r}.")

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def of(cls, call: InferenceCall | None = None, /, **fields: Any) -> InferenceCall:
        """``call`` with ``fields`` changed, or a new call from ``fields``. Names that are not
        fields are generation parameters (``top_p=0.9``, ``seed=7``)."""
        names = cls.field_names()
        known = {k: v for k, v in fields.items() if k in names}
        extra = {k: v for k, v in fields.items() if k not in names}
        if extra:
            base = known.get("generation_params")
            if base is None:
                base = call.generation_params if call is not None else {}
            known["generation_params"] = {**base, **extra}
        if call is None:
            return cls(**known)
        return dataclasses.replace(call, **known) if known else call

    def bind(self, columns: Sequence[str], settings: Any) -> InferenceCall:
        """The call checked against a table's columns and the configured models (``settings``'
        ``models``), with the default model (``model_when_unnamed``) filled in; every mistake
        raises before a request is sent."""
        served_models, default_model = settings.models, settings.model_when_unnamed
        call = self
        if self.model is None and self.model_column is None:
            if default_model is None:
                raise InferenceConfigError(
                    "Pass exactly one of model= (one model for every row) "
                    "or model_column= (per-row models)."
                )
            call = dataclasses.replace(self, model=default_model)
        if call.model is not None and call.model not in served_models:
            raise InferenceConfigError(
                f"No configured endpoint serves model '{call.model}'. Served models: "
                f"{sorted(served_models)}. Add it to an Endpoint's models list or pick one of "
                "those."
            )
        call.check_columns(columns)
        return call

    # -- what the call implies -------------------------------------------------------------------
    @property
    def request_params(self) -> dict[str, Any]:
        """The generation parameters sent with every request (max_tokens filled in later)."""
        params = dict(self.generation_params)
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            params["temperature"] = self.temperature
        return params

    @property
    def code_version(self) -> str:
        """A short hash of everything in the call that goes into request keys (prompt, system,
        model, generation parameters, response format, image columns and detail): when it
        changes, every row's key changes and a rerun pays for every row again, so Dagster
        should call the asset stale. What the resource fills in where the call says nothing
        (its default model and max_tokens) counts in
        :meth:`~dagster_batchllm.core.tasks.base.CallBase.code_version_with` only. The image
        fields count only when images are sent, so a text-only call keeps the version it had
        before they existed."""
        sent = {name: getattr(self, name) for name in self.sent_fields}
        if self.images:
            sent.update({name: getattr(self, name) for name in _IMAGE_FIELDS})
        return version_of(sent)

    def as_sent_by(self, settings: Any) -> InferenceCall:
        """The call with the resource's model where it names none (``model_when_unnamed``;
        not where a column names each row's) and its ``default_max_tokens`` where it gives no
        max_tokens: what every request then carries."""
        changes: dict[str, Any] = {}
        if self.model is None and self.model_column is None and settings.model_when_unnamed:
            changes["model"] = settings.model_when_unnamed
        if self.max_tokens is None:
            changes["max_tokens"] = settings.default_max_tokens
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def schema(self) -> Mapping[str, Any] | None:
        if self.response_format and self.response_format.get("type") == "json_schema":
            return self.response_format["json_schema"].get("schema")
        return None

    @property
    def structured(self) -> bool:
        return bool(self.response_format) and self.response_format.get("type") != "text"

    def template_fields(self) -> list[str]:
        return template_fields(self.prompt) if self.prompt else []

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
        cols.extend(self.images or ())
        return list(dict.fromkeys(cols))

    def columns_read(self) -> list[str]:
        return self.input_columns()


# The fields that shape what is sent (the others say where answers go and what to spend).
InferenceCall.sent_fields = (
    "prompt", "prompt_column", "messages_column", "system", "model", "model_column",
    "max_tokens", "temperature", "generation_params", "response_format", "cells_as_text")
_IMAGE_FIELDS = ("images", "image_detail")


_INTEGER_PARAMS = frozenset({"max_tokens", "seed", "n"})
_REAL_PARAMS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})


def checked_param(name: str, value: Any) -> Any:
    """A generation parameter in the type the OpenAI API takes, or a clear error: no
    ``max_tokens="128"`` or ``12.7`` passing silently as something else."""
    if name in _INTEGER_PARAMS:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InferenceConfigError(
                f"{name} must be a whole number, got {type(value).__name__} {value!r}.")
        if name != "seed" and int(value) < 1:
            raise InferenceConfigError(f"{name} must be at least 1.")
        return int(value)
    if name in _REAL_PARAMS:
        # Decimal: SQL literals such as 0.7 arrive as DECIMAL from DuckDB and Spark.
        if isinstance(value, bool) or not isinstance(value, numbers.Real | decimal.Decimal):
            raise InferenceConfigError(
                f"{name} must be a number, got {type(value).__name__} {value!r}.")
        return float(value)
    if name == "stop" and not (isinstance(value, str) or (
            isinstance(value, list | tuple) and all(isinstance(s, str) for s in value))):
        raise InferenceConfigError(f"stop must be a string or a list of strings, got {value!r}.")
    if name == "user" and not isinstance(value, str):
        raise InferenceConfigError(f"user must be a string, got {type(value).__name__}.")
    if name == "logprobs" and not isinstance(value, bool):
        raise InferenceConfigError(f"logprobs must be true or false, got {value!r}.")
    if name == "top_logprobs" and (isinstance(value, bool) or not isinstance(
            value, numbers.Integral) or not 0 <= int(value) <= 20):
        raise InferenceConfigError(f"top_logprobs must be a whole number from 0 to 20, "
                                   f"got {value!r}.")
    if name == "logit_bias" and not isinstance(value, Mapping):
        raise InferenceConfigError("logit_bias must be a mapping of token ids to biases.")
    return list(value) if name == "stop" and not isinstance(value, str) else value


def literal_template(text: str) -> str:
    """A template that renders to ``text`` exactly (for system prompts given as plain text)."""
    return text.replace("{", "{{").replace("}", "}}")


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


def check_template(template: str, what: str) -> None:
    """Refuse, before anything is sent, a template that cannot render text cells."""
    fields = template_fields(template)
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if any(quote in name for quote in "\"'") or (spec and spec[:1].isspace()):
            # '{"label": x}' parses as a column named '"label"' with the format ' x': braces
            # meant literally, as in a JSON example inside a prompt.
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (
                f":{spec}" if spec else "") + "}"
            raise InferenceConfigError(
                f"The {what} has '{shown}', which reads as a column named {name!r}. If those "
                "braces are meant literally (say, JSON in the prompt), double them: {{ and }}. "
                "Columns are written {column}."
            )
        if "." in name or "[" in name:
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
