"""From table rows to requests: templates, messages, request keys and token estimates.

A request is serialized once, canonically (sorted keys, no whitespace); that byte string is both
the HTTP body and, hashed, the request key. So the key covers exactly what the server sees:
model, messages and every generation parameter. What to render comes from an
:class:`~dagster_batchllm.core.call.InferenceCall`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from .call import InferenceCall
from .errors import InvalidInputError, RowError
from .images import image_parts

# Reservations must never be below what the server will count. Byte-level BPE and SentencePiece
# with byte fallback emit at most one token per UTF-8 byte, plus a few chat-template tokens per
# message; so this bound holds for every tokenizer we know of, at the price of over-reserving
# while a request is in flight (the reservation is settled to the reply's usage afterwards).
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS_PER_REQUEST = 8
# For dry runs and cost estimates: the usual ~4 characters per token of English text.
_TYPICAL_CHARS_PER_TOKEN = 4
# The canonical form of a request body (its key is the hash of these bytes). One encoder for
# every request: json.dumps with options builds a new one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False)


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 2.5x, and one is made per row
class RowRequest:
    """One rendered request: its key, its body and what the budget needs to know. Treated
    as a value: nothing changes one once made."""

    key: str
    model: str
    body: bytes
    reserve_tokens: int
    typical_prompt_tokens: int
    max_tokens: int
    #: What a task that does not send ``body`` as it is needs of the row (an in-process model's
    #: feature values, an embedding input's text); None for a chat request.
    payload: Any = None


def row_tuples(frame: Any) -> Iterator[tuple]:
    """A DataFrame's rows as plain tuples, in column order. A frame without columns (a template
    that names none) still gives one empty tuple per row, which ``itertuples`` does not."""
    if len(frame.columns) == 0:
        return iter([()] * len(frame))
    return frame.itertuples(index=False, name=None)


def distinct_requests(items: Iterator[RowRequest | RowError],
                      usable: Callable[[RowRequest], bool] | None = None,
                      ) -> tuple[dict[str, RowRequest], int, int]:
    """What a dry run counts: the distinct requests by key (in order), the rows that cannot
    be sent (a row error, or not ``usable``), and the rows that repeat an earlier request."""
    distinct: dict[str, RowRequest] = {}
    invalid = duplicates = 0
    for item in items:
        if isinstance(item, RowError) or (usable is not None and not usable(item)):
            invalid += 1
        elif item.key in distinct:
            duplicates += 1
        else:
            distinct[item.key] = item
    return distinct, invalid, duplicates


def iter_row_requests(
    rows: Iterator[tuple], spec: InferenceCall, *, default_max_tokens: int
) -> Iterator[RowRequest | RowError]:
    """Render each row (a tuple in ``spec.input_columns()`` order) into a request or an error."""
    columns = spec.input_columns()
    position = {c: i for i, c in enumerate(columns)}
    fields = spec.template_fields()
    system_fields = spec.system_fields()
    params = spec.request_params
    if params.get("max_tokens") is None:
        # Always bound the completion: a budget can only be kept if every reply is bounded.
        params["max_tokens"] = default_max_tokens
    if spec.response_format is not None:
        params["response_format"] = spec.response_format
    max_tokens = int(params["max_tokens"])
    as_text = spec.cells_as_text
    image_columns = [(c, position[c]) for c in spec.images or ()]
    # Rows whose messages are rendered text (no messages column, no images): their bodies
    # are spliced from each model's skeleton, the bytes the canonical encoder would give.
    skeletons: dict[str, _Skeleton | None] | None = (
        {} if spec.messages_column is None and not image_columns else None)
    for row in rows:
        try:
            if spec.messages_column is not None:
                messages = _messages_from_cell(row[position[spec.messages_column]])
            else:
                if spec.prompt is not None:
                    text = _render(spec.prompt, fields, row, position, as_text)
                else:
                    text = _cell_text(row[position[spec.prompt_column]], spec.prompt_column,
                                      as_text)
                system = (_render(spec.system, system_fields, row, position, as_text)
                          if spec.system else None)
            model = spec.model if spec.model is not None else _cell_text(
                row[position[spec.model_column]], spec.model_column
            )
            if skeletons is not None:
                skeleton = skeletons.get(model, _NO_SKELETON)
                if skeleton is _NO_SKELETON:
                    skeleton = skeletons[model] = _Skeleton.of(model, params, spec.system)
                if skeleton is not None:
                    yield skeleton.request(text, system, max_tokens)
                    continue
            if spec.messages_column is None:
                messages = [{"role": "user", "content": text}]
                if system is not None:
                    messages.insert(0, {"role": "system", "content": system})
            if image_columns:
                yield _with_images(model, messages, row, image_columns, spec, params,
                                   max_tokens)
            else:
                yield make_request(model, messages, params, max_tokens)
        except RowError as error:
            yield error


def make_request(
    model: str, messages: list[dict[str, Any]], params: Mapping[str, Any], max_tokens: int
) -> RowRequest:
    body = _encode({"model": model, "messages": messages, **params})
    texts = []
    for message in messages:
        content = message.get("content") or ""
        texts.append(content if isinstance(content, str) else json.dumps(content))
    return _request(body, model, texts, max_tokens)


def _request(body: bytes, model: str, texts: Sequence[str], max_tokens: int) -> RowRequest:
    """The request of ``body``, its token bounds from its messages' texts."""
    chars = content_bytes = 0
    for text in texts:
        chars += len(text)
        # Bytes as UTF-8, without encoding: an ASCII text has as many as it has characters.
        content_bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
    n = len(texts)
    upper = content_bytes + _TEMPLATE_TOKENS_PER_MESSAGE * n + _TEMPLATE_TOKENS_PER_REQUEST
    # key, model, body, reserve_tokens, typical_prompt_tokens, max_tokens (positional: one per
    # row, and keywords cost a fifth of it)
    return RowRequest(hashlib.sha256(body).hexdigest(), model, body, upper + max_tokens,
                      math.ceil(chars / _TYPICAL_CHARS_PER_TOKEN) + 4 * n, max_tokens)


# A text no prompt holds, which the canonical encoder writes as it is (``\\u0000``-escaped).
_PLACEHOLDER = "\x00batchllm-text\x00"
_NO_SKELETON = object()


class _Skeleton:
    """One model's canonical request body with its messages' texts left out: a row's body is
    the pieces joined with each text as the encoder writes a string (``encode_basestring``, as
    ``_CANONICAL`` does with ``ensure_ascii=False``), the same bytes as ``make_request``'s,
    without encoding the whole request per row. A test checks the two against each other."""

    __slots__ = ("model", "pieces", "system")

    def __init__(self, model: str, pieces: list[str], system: bool):
        self.model, self.pieces, self.system = model, pieces, system

    @staticmethod
    def of(model: str, params: Mapping[str, Any], system: str | None) -> _Skeleton | None:
        """None where the parameters cannot be split around the texts (a parameter holding
        the placeholder, or one JSON cannot hold): such rows take ``make_request``."""
        messages = [{"role": "user", "content": _PLACEHOLDER}]
        if system:
            messages.insert(0, {"role": "system", "content": _PLACEHOLDER})
        try:
            whole = _CANONICAL.encode({"model": model, "messages": messages, **params})
        except (ValueError, TypeError):
            return None
        pieces = whole.split(_CANONICAL.encode(_PLACEHOLDER))
        if len(pieces) != len(messages) + 1:
            return None
        return _Skeleton(model, pieces, bool(system))

    def request(self, text: str, system: str | None, max_tokens: int) -> RowRequest:
        pieces = self.pieces
        if self.system:
            body_text = (pieces[0] + encode_basestring(system) + pieces[1]
                         + encode_basestring(text) + pieces[2])
            texts = (system, text)
        else:
            body_text = pieces[0] + encode_basestring(text) + pieces[1]
            texts = (text,)
        try:
            body = body_text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(
                f"the prompt is not valid Unicode text ({exc.reason})") from None
        return _request(body, self.model, texts, max_tokens)


def _encode(payload: dict[str, Any]) -> bytes:
    try:
        return _CANONICAL.encode(payload).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"the prompt is not valid Unicode text ({exc.reason})") from None
    except (ValueError, TypeError) as exc:  # NaN, or a cell object JSON cannot hold
        raise InvalidInputError(f"the request cannot be encoded as JSON ({exc})") from None


def _with_images(model: str, messages: list[dict[str, Any]], row: tuple,
                 image_columns: list[tuple[str, int]], spec: InferenceCall,
                 params: Mapping[str, Any], max_tokens: int) -> RowRequest:
    """The request with the row's images as parts of its user message (after the text).

    The key is still the hash of the body, so it covers the image bytes. The token bounds
    count the text as ``make_request`` does (not the base64, which the server does not count
    as text) plus each image's cost (:func:`~.images.image_tokens`)."""
    parts = [part for column, i in image_columns
             for part in image_parts(row[i], column, spec.image_detail, spec.max_image_bytes)]
    text = messages[-1]["content"]
    messages[-1] = {"role": "user",
                    "content": [{"type": "text", "text": text}, *(p.part for p in parts)]}
    body = _encode({"model": model, "messages": messages, **params})
    texts = [m["content"] for m in messages[:-1]] + [text]
    chars = sum(len(t) for t in texts)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    image_tokens = sum(p.tokens for p in parts)
    n = len(messages)
    typical = math.ceil(chars / _TYPICAL_CHARS_PER_TOKEN) + 4 * n + image_tokens
    upper = (text_bytes + image_tokens + _TEMPLATE_TOKENS_PER_MESSAGE * n
             + _TEMPLATE_TOKENS_PER_REQUEST)
    return RowRequest(
        key=hashlib.sha256(body).hexdigest(), model=model, body=body,
        reserve_tokens=upper + max_tokens, typical_prompt_tokens=typical, max_tokens=max_tokens,
    )


def _render(template: str, fields: list[str], row: tuple, position: dict[str, int],
            as_text: bool) -> str:
    values = {name: _cell_text(row[position[name]], name, as_text) for name in fields}
    try:
        text = template.format_map(values)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidInputError(f"the template cannot be rendered for this row ({exc})") from None
    if not text or text.isspace():
        raise InvalidInputError("the rendered prompt is empty")
    return text


def _cell_text(value: Any, column: str, as_text: bool = False) -> str:
    """A cell as prompt text. Only text is text unless the call says ``cells_as_text``: a
    number or a byte string where a prompt expected text is usually the wrong column."""
    if type(value) is str and value and not value.isspace():  # the usual cell, first (per row)
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise InvalidInputError(f"column '{column}' is null")
    if isinstance(value, str):
        text = value
    elif _is_missing(value) or _is_na(value):
        raise InvalidInputError(f"column '{column}' is null")
    elif not _has_text_form(value):
        raise InvalidInputError(f"column '{column}' holds a {type(value).__name__}, not text")
    elif not as_text:
        raise InvalidInputError(
            f"column '{column}' holds {_kind_of(value)}, not text; convert the column "
            f"(df['{column}'].astype(str)) or pass cells_as_text=True")
    elif isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"column '{column}' holds bytes that are not UTF-8") from None
    else:
        text = str(value)
    if not text.strip():
        raise InvalidInputError(f"column '{column}' is empty")
    return text


def _has_text_form(value: Any) -> bool:
    """Numbers, booleans, timestamps and bytes, which ``cells_as_text`` may render."""
    return (isinstance(value, bytes | bytearray | bool | int | float)
            or type(value).__module__ == "numpy" or hasattr(value, "isoformat"))


def _kind_of(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "bytes"
    return f"a {type(value).__name__}"


def _is_na(value: Any) -> bool:
    try:
        import pandas as pd

        return pd.isna(value) is True
    except (TypeError, ValueError):
        return False


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


# For the other tasks that render rows into text the same way (embeddings' inputs).
render_template = _render
cell_text = _cell_text
