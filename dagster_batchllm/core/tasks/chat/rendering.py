"""From table rows to chat requests: templates, messages and images rendered into bodies.

What to render comes from an :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`;
each body is keyed and bounded as every request is (:mod:`dagster_batchllm.core.requests`).
The usual call (a template over text cells) is rendered a block of rows at a time
(:class:`TextBlocks`); anything else row by row.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import string
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from json.encoder import encode_basestring
from typing import Any

from ...errors import InvalidInputError, RowError
from ...requests import (
    CANONICAL,
    PREFIX_KEY_BYTES,
    TEMPLATE_TOKENS_PER_MESSAGE,
    TEMPLATE_TOKENS_PER_REQUEST,
    TYPICAL_CHARS_PER_TOKEN,
    RowRequest,
    encode_body,
    keyed_request,
    prefix_key,
)
from ..cells import cell_text, messages_from_cell
from .call import InferenceCall
from .images import image_parts

# Rows rendered at once on the usual call's path (see TextBlocks).
_BLOCK_ROWS = 1024


def row_tuples(frame: Any) -> Iterator[tuple]:
    """A DataFrame's rows as plain tuples, in column order. A frame without columns (a template
    that names none) still gives one empty tuple per row, which ``itertuples`` does not."""
    if len(frame.columns) == 0:
        return iter([()] * len(frame))
    return frame.itertuples(index=False, name=None)


def iter_row_requests(
    rows: Iterable[tuple], spec: InferenceCall, *, default_max_tokens: int,
    prefix_keys: bool = False,
) -> Iterator[RowRequest | RowError]:
    """Render each row (a tuple in ``spec.input_columns()`` order) into a request or an error;
    ``prefix_keys``: with each request's :func:`prefix_key`."""
    blocks = TextBlocks.of(spec, default_max_tokens, prefix_keys)
    if blocks is None:
        made = _row_by_row(rows, spec, default_max_tokens=default_max_tokens)
        yield from _with_prefix_keys(made) if prefix_keys else made
        return
    rows = iter(rows)
    while block := list(islice(rows, _BLOCK_ROWS)):
        made = blocks.requests(block)
        if made is None:  # a row off the usual case: each as the general path renders it
            made = _row_by_row(block, spec, default_max_tokens=default_max_tokens)
            yield from _with_prefix_keys(made) if prefix_keys else made
        else:
            yield from made


def _with_prefix_keys(items: Iterator[RowRequest | RowError]) -> Iterator[RowRequest | RowError]:
    for item in items:
        if type(item) is RowRequest:
            item.prefix_key = prefix_key(item.body)
        yield item


def _request_params(spec: InferenceCall, default_max_tokens: int) -> dict[str, Any]:
    params = spec.request_params
    if params.get("max_tokens") is None:
        # Always bound the completion: a budget can only be kept if every reply is bounded.
        params["max_tokens"] = default_max_tokens
    if spec.response_format is not None:
        params["response_format"] = spec.response_format
    return params


def _row_by_row(rows: Iterable[tuple], spec: InferenceCall, *, default_max_tokens: int
                ) -> Iterator[RowRequest | RowError]:
    columns = spec.input_columns()
    position = {c: i for i, c in enumerate(columns)}
    fields = spec.template_fields()
    system_fields = spec.system_fields()
    params = _request_params(spec, default_max_tokens)
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
                messages = messages_from_cell(row[position[spec.messages_column]])
            else:
                if spec.prompt is not None:
                    text = _render(spec.prompt, fields, row, position, as_text)
                else:
                    text = cell_text(row[position[spec.prompt_column]], spec.prompt_column,
                                      as_text)
                system = (_render(spec.system, system_fields, row, position, as_text)
                          if spec.system else None)
            model = spec.model if spec.model is not None else cell_text(
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
    body = encode_body({"model": model, "messages": messages, **params})
    texts = []
    for message in messages:
        content = message.get("content") or ""
        texts.append(content if isinstance(content, str) else json.dumps(content))
    return keyed_request(model, body, texts, max_tokens)


# A text no prompt holds, which the canonical encoder writes as it is (``\\u0000``-escaped).
_PLACEHOLDER = "\x00batchllm-text\x00"
_NO_SKELETON = object()


class _Skeleton:
    """One model's canonical request body with its messages' texts left out: a row's body is
    the pieces joined with each text as the encoder writes a string (``encode_basestring``, as
    ``CANONICAL`` does with ``ensure_ascii=False``), the same bytes as ``make_request``'s,
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
            whole = CANONICAL.encode({"model": model, "messages": messages, **params})
        except (ValueError, TypeError):
            return None
        pieces = whole.split(CANONICAL.encode(_PLACEHOLDER))
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
        return keyed_request(self.model, body, texts, max_tokens)


class TextBlocks:
    """The usual call's rows a block at a time: one model, a prompt template over plain column
    names, a system prompt with no fields (or none), no images. Each row's request is the one
    :func:`_row_by_row` makes of it (a test checks the two against each other), made in a few
    list-wide steps rather than a generator step, a dict and several calls per row (a batch
    call renders every row of its table twice, once to submit and once to collect). A block
    with a row off that case (a cell that is no text, or blank; text that is no valid Unicode)
    is left whole to :func:`_row_by_row`, which says why for each of its rows."""

    __slots__ = ("fields", "distinct", "literals", "positional", "prefix", "suffix", "model",
                 "max_tokens", "fixed_chars", "fixed_bytes", "messages", "prefix_key",
                 "key_per_row")

    def __init__(self, fields: list[int], literals: list[str], skeleton: _Skeleton,
                 system: str | None, max_tokens: int, prefix_keys: bool = False):
        self.fields, self.literals = fields, literals
        self.distinct = list(dict.fromkeys(fields))  # the cells to check, once each
        # "{0}"-style, for templates of several fields; literal braces doubled back.
        self.positional = "".join(
            literal.replace("{", "{{").replace("}", "}}") + (f"{{{j}}}" if j < len(fields) else "")
            for j, literal in enumerate(literals))
        pieces = skeleton.pieces
        if system is None:
            self.prefix, self.suffix = pieces[0], pieces[1]
            self.fixed_chars = self.fixed_bytes = 0
        else:
            self.prefix, self.suffix = pieces[0] + encode_basestring(system) + pieces[1], pieces[2]
            self.fixed_chars, self.fixed_bytes = len(system), len(system.encode("utf-8"))
        self.model, self.max_tokens = skeleton.model, max_tokens
        self.messages = 1 if system is None else 2
        # Every row's body starts with the system message and the template's text before its
        # first field: where those are PREFIX_KEY_BYTES long, every row has the same prefix key,
        # hashed once here; otherwise each row's is its own body's, if asked for.
        self.prefix_key, self.key_per_row = None, False
        if prefix_keys:
            head = self.prefix + encode_basestring(literals[0])[:-1]  # without the closing quote
            head_bytes = head.encode("utf-8", "surrogatepass")
            if len(head_bytes) >= PREFIX_KEY_BYTES:
                self.prefix_key = hash(head_bytes[:PREFIX_KEY_BYTES])
            else:
                self.key_per_row = True

    @staticmethod
    def of(spec: InferenceCall, default_max_tokens: int, prefix_keys: bool = False
           ) -> TextBlocks | None:
        """None where the call is not the usual case."""
        if (spec.prompt is None or spec.messages_column is not None or spec.images
                or spec.model is None or spec.system_fields()):
            return None
        system = None
        if spec.system:
            try:
                system = spec.system.format_map({})  # no fields: its literal text
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                return None
            if not system or system.isspace():
                return None
        position = {c: i for i, c in enumerate(spec.input_columns())}
        fields, literals = [], [""]  # literals[j] comes before field j, the last after all
        for literal, name, format_spec, conversion in string.Formatter().parse(spec.prompt):
            literals[-1] += literal
            if name is None:
                continue
            if format_spec or conversion or name not in position:  # "{a!r}", "{a:>9}"
                return None
            fields.append(position[name])
            literals.append("")
        if not fields:
            return None
        params = _request_params(spec, default_max_tokens)
        skeleton = _Skeleton.of(spec.model, params, spec.system)
        if skeleton is None:
            return None
        return TextBlocks(fields, literals, skeleton, system, int(params["max_tokens"]),
                          prefix_keys)

    def requests(self, rows: list[tuple]) -> list[RowRequest] | None:
        """The rows' requests, or None if any row is not the usual case."""
        for i in self.distinct:
            for row in rows:
                value = row[i]
                if type(value) is not str or not value or value.isspace():
                    return None
        fields, literals = self.fields, self.literals
        if len(fields) == 1:
            i, before, after = fields[0], literals[0], literals[1]
            texts = [before + row[i] + after for row in rows]
        else:
            cells, template = operator.itemgetter(*fields), self.positional
            texts = [template.format(*cells(row)) for row in rows]
        prefix, suffix, model, max_tokens = self.prefix, self.suffix, self.model, self.max_tokens
        fixed_chars, n = self.fixed_chars, self.messages
        # _request's bounds: UTF-8 bytes, the chat template's tokens per message and request
        fixed_bytes = self.fixed_bytes + TEMPLATE_TOKENS_PER_MESSAGE * n + \
            TEMPLATE_TOKENS_PER_REQUEST + max_tokens
        typical = 4 * n
        sha256, key = hashlib.sha256, self.prefix_key
        made = []
        try:
            for text in texts:
                body = (prefix + encode_basestring(text) + suffix).encode("utf-8")
                chars = fixed_chars + len(text)
                made.append(RowRequest(
                    sha256(body).hexdigest(), model, body,
                    (len(text) if text.isascii() else len(text.encode("utf-8"))) + fixed_bytes,
                    math.ceil(chars / TYPICAL_CHARS_PER_TOKEN) + typical, max_tokens, None, key))
        except UnicodeEncodeError:  # a lone surrogate: the general path says so, for its row
            return None
        if self.key_per_row:
            for request in made:
                request.prefix_key = prefix_key(request.body)
        return made


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
    body = encode_body({"model": model, "messages": messages, **params})
    texts = [m["content"] for m in messages[:-1]] + [text]
    return keyed_request(model, body, texts, max_tokens,
                         extra_prompt_tokens=sum(p.tokens for p in parts))


def _render(template: str, fields: list[str], row: tuple, position: dict[str, int],
            as_text: bool) -> str:
    values = {name: cell_text(row[position[name]], name, as_text) for name in fields}
    try:
        text = template.format_map(values)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidInputError(f"the template cannot be rendered for this row ({exc})") from None
    if not text or text.isspace():
        raise InvalidInputError("the rendered prompt is empty")
    return text


# For the other tasks that render rows into text the same way (embeddings' inputs).
render_template = _render
