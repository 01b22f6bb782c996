"""Reading an OpenAI batch result file: lines in blocks, the usual answers read in Arrow.

A result file holds one JSON line per request (``{"custom_id", "response": {"status_code",
"body"}, "error"}``). Parsing each with ``json.loads`` builds every dict of the reply only to
read four of its fields, most of a collect's CPU; :func:`chat_answer_block` parses a block
of lines with Arrow's JSON reader (in C++) and hands those fields on as columns (an
:class:`AnswerBlock`, no object per line). Where a line is not
the usual answer of a chat completion (another status, an error line, no text, or fields of
types that vary), that line is left to the per-line reader, which says why it is not an
answer; where Arrow cannot read the block at all, every line of it is.

A line is one reply, so it is bound as an online reply is (:mod:`..reply_size`): a line
longer than :data:`MAX_LINE_BYTES` is not kept; :func:`line_blocks` drops it while reading
and hands on a short line in its place, ``{"custom_id": ..., "batchllm_oversized": <bytes>}``,
which each protocol's per-line reader turns into that row's ``response_too_large``
(:func:`oversized_error`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ...errors import EndpointError, ErrorType
from ...usage import TOKEN_CEILING
from ..reply_size import CHAT_REPLY_CAP, ENVELOPE_BYTES

#: Lines parsed at once: a few MB of replies, so memory stays flat in the file's size.
BLOCK_LINES = 8192
#: The longest result line kept: the most a chat reply may be by default, and its wrapping
#: (an embeddings line holds one vector, far less).
MAX_LINE_BYTES = CHAT_REPLY_CAP + ENVELOPE_BYTES
#: Of a line too long, the head kept to find its custom_id in.
_HEAD_BYTES = 4096
_CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"([^"\\]{1,256})"')
OVERSIZED = "batchllm_oversized"


def line_blocks(chunks: Iterable[bytes], block_lines: int = BLOCK_LINES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[list[bytes]]:
    """The non-blank lines of a byte stream, ``block_lines`` at a time (the last block
    shorter); a final line without a newline is a line. A line longer than ``max_line_bytes``
    is dropped as it is read (never held whole) and its place taken by its oversized marker
    (see the module)."""
    block: list[bytes] = []
    pieces: list[bytes] = []  # the line not ended yet (joined once, where it ends)
    size = dropping = 0  # its bytes; those of the line being dropped (0: none is)
    head = b""  # the dropped line's start
    for chunk in chunks:
        if dropping:
            end = chunk.find(b"\n")
            if end < 0:
                dropping += len(chunk)
                continue
            block.append(_oversized(head, dropping + end))
            dropping, chunk = 0, chunk[end + 1:]
        if b"\n" not in chunk:
            pieces.append(chunk)
            size += len(chunk)
            if size > max_line_bytes:
                head, dropping, pieces, size = b"".join(pieces)[:_HEAD_BYTES], size, [], 0
            continue
        parts = (b"".join(pieces) + chunk if pieces else chunk).split(b"\n")
        rest = parts.pop()
        pieces, size = ([rest], len(rest)) if rest else ([], 0)
        block.extend(p if len(p) <= max_line_bytes else _oversized(p[:_HEAD_BYTES], len(p))
                     for p in parts if p.strip())
        if size > max_line_bytes:
            head, dropping, pieces, size = rest[:_HEAD_BYTES], size, [], 0
        while len(block) >= block_lines:
            yield block[:block_lines]
            block = block[block_lines:]
    rest = b"".join(pieces)
    if dropping:
        block.append(_oversized(head, dropping))
    elif rest.strip():
        block.append(rest)
    if block:
        yield block


def _oversized(head: bytes, size: int) -> bytes:
    """The line that stands for a dropped one: its custom_id (where its head has one) and
    its size."""
    found = _CUSTOM_ID.search(head)
    key = json.dumps(found.group(1).decode("utf-8", "replace")) if found else "null"
    return b'{"custom_id":%s,"%s":%d}' % (key.encode(), OVERSIZED.encode(), size)


def oversized_error(line: dict[str, Any], endpoint: str) -> EndpointError | None:
    """The row error of a line :func:`line_blocks` dropped for its size; None for another."""
    size = line.get(OVERSIZED)
    if size is None:
        return None
    return EndpointError(
        f"the batch result line of endpoint '{endpoint}' has {size:,} bytes, over the bound "
        f"of {MAX_LINE_BYTES:,} bytes a line (one reply) may have: not kept; check that the "
        "provider honours max_tokens", error_type=ErrorType.RESPONSE_TOO_LARGE,
        retryable=False, endpoint=endpoint)


class AnswerBlock(NamedTuple):
    """The chat answers Arrow read from a block of lines, as columns: one entry per answered
    line, its text, usage (0 where the reply reported none) and finish reason. A collect
    takes them as they are, with no object per line."""

    keys: list[str]
    contents: list[str]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    finish_reasons: list[str | None]
    #: Of prompt_tokens, those served from the provider's prompt cache (0 where none said).
    cached_tokens: list[int]


def chat_answer_block(lines: list[bytes]) -> tuple[AnswerBlock | None, list[int]]:
    """The block's lines that are a chat completion answered 200 with text, read as
    ``completion_from_payload`` reads one, and the positions of the other lines (every line,
    where Arrow cannot read the block as such), for the per-line reader."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    every = list(range(len(lines)))
    try:
        data = b"\n".join(lines)
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=len(data) + 1), parse_options=_parse_options())
        if table.num_rows != len(lines):
            return None, every
        keys = table.column("custom_id").combine_chunks()
        response = table.column("response").combine_chunks()
        status = _field(response, "status_code")
        body = _field(response, "body")
        choices = _field(body, "choices")
        usage = _field(body, "usage")
        if not (pa.types.is_string(keys.type) and pa.types.is_integer(status.type)
                and pa.types.is_list(choices.type)):
            return None, every
        items = choices.flatten()  # every line's choices, one after another
        if not len(items):
            return None, every
        # Each line's first choice; a line without any points at another's and is left out.
        starts = np.asarray(choices.offsets)
        first = items.take(pa.array(np.minimum(starts[:-1] - starts[0], len(items) - 1)))
        content = _field(_field(first, "message"), "content")
        finish = _field(first, "finish_reason")
        prompt = _field(usage, "prompt_tokens")
        completion = _field(usage, "completion_tokens")
        if not (pa.types.is_string(content.type) and _of(finish.type, pa.types.is_string)
                and _of(prompt.type, pa.types.is_integer)
                and _of(completion.type, pa.types.is_integer)):
            return None, every
        usable = pc.fill_null(pc.and_(pc.and_(
            pc.and_(pc.equal(status, 200),
                    pc.greater(pc.fill_null(pc.list_value_length(choices), 0), 0)),
            pc.and_(pc.is_valid(keys), pc.is_valid(content))),
            _token_counts(prompt, completion, _field(_field(usage, "prompt_tokens_details"),
                                                     "cached_tokens"))), False)
        mask = usable.to_numpy(zero_copy_only=False)
        columns = [pc.filter(keys, usable).to_pylist(),
                   pc.filter(content, usable).to_pylist(),
                   *_usage(prompt, completion, usable),
                   _few_values(pc.filter(finish, usable)),
                   _cached(usage, usable)]
    except (KeyError, ValueError, TypeError, IndexError, pa.ArrowException):
        # Not one shape Arrow can read (a field missing from every line, or of types that
        # vary): each line is read on its own.
        return None, every
    del table, response, body, choices, usage, items, first, content, finish, prompt, usable
    # Arrow's allocator keeps what a block freed for the next; given back, memory stays
    # that of one block's replies (a result file is read block after block).
    pa.default_memory_pool().release_unused()
    others = np.flatnonzero(~mask).tolist()
    blank = [i for i, text in enumerate(columns[1]) if not text.strip()]
    if blank:  # a reply without text: the per-line reader says so
        answered = np.flatnonzero(mask)
        others = sorted([*others, *(int(answered[i]) for i in blank)])
        drop = set(blank)
        columns = [[v for i, v in enumerate(column) if i not in drop] for column in columns]
    return AnswerBlock(*columns), others


def _token_counts(*figures: Any) -> Any:
    """Where every one of a line's usage figures is a token count in range (or absent): a
    line with a figure past it is left to the per-line reader, which corrects and flags it
    as every reply's usage is (``core/usage.py``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fine = None
    for figure in figures:
        if pa.types.is_null(figure.type):
            continue
        within = pc.fill_null(pc.and_(pc.greater_equal(figure, 0),
                                      pc.less_equal(figure, TOKEN_CEILING)), True)
        fine = within if fine is None else pc.and_(fine, within)
    return fine if fine is not None else pa.array([True] * len(figures[0]))


def _usage(prompt: Any, completion: Any, usable: Any) -> tuple[list[int], list[int]]:
    """The usable lines' token counts, as completion_from_payload reads them: both 0 where
    the reply has no prompt count, a missing completion count 0."""
    import pyarrow as pa
    import pyarrow.compute as pc

    prompt, completion = (pc.cast(c, pa.int64()) for c in (prompt, completion))  # (all-null)
    return (pc.filter(pc.fill_null(prompt, 0), usable).to_pylist(),
            pc.filter(pc.if_else(pc.is_valid(prompt), pc.fill_null(completion, 0), 0),
                      usable).to_pylist())


def _cached(usage: Any, usable: Any) -> list[int]:
    """The usable lines' ``usage.prompt_tokens_details.cached_tokens``, 0 where a reply has
    none (most replies of servers without a prompt cache have no such field at all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = int(pc.sum(pc.cast(usable, pa.int64())).as_py() or 0)
    try:
        cached = _field(_field(usage, "prompt_tokens_details"), "cached_tokens")
    except (KeyError, TypeError, pa.ArrowException):
        return [0] * count
    if not _of(cached.type, pa.types.is_integer):
        return [0] * count
    return pc.filter(pc.fill_null(pc.cast(cached, pa.int64()), 0), usable).to_pylist()


def _few_values(array: Any) -> list[Any]:
    """A column of a few distinct strings (finish reasons) as a list that shares one object
    per value: ``to_pylist`` makes a string per line, 50 bytes each of the answers a collect
    holds (and a little faster)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(array.type):
        return [None] * len(array)
    encoded = array.dictionary_encode()
    values = np.array([*encoded.dictionary.to_pylist(), None], dtype=object)
    return values[pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy()].tolist()


def _parse_options() -> Any:
    """Only the fields read are built into columns (the rest of each reply is skipped), and
    a field of another type than these fails the block, which the per-line reader then reads:
    a third less than letting Arrow infer every field's type."""
    global _OPTIONS
    if _OPTIONS is None:
        import pyarrow as pa
        import pyarrow.json as pj

        details = pa.struct([("cached_tokens", pa.int64())])
        tokens = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
                            ("prompt_tokens_details", details)])
        choice = pa.struct([("message", pa.struct([("content", pa.string())])),
                            ("finish_reason", pa.string())])
        body = pa.struct([("choices", pa.list_(choice)), ("usage", tokens)])
        _OPTIONS = pj.ParseOptions(explicit_schema=pa.schema([
            ("custom_id", pa.string()),
            ("response", pa.struct([("status_code", pa.int64()), ("body", body)]))]),
            unexpected_field_behavior="ignore")
    return _OPTIONS


_OPTIONS: Any = None


def _field(array: Any, name: str) -> Any:
    """A struct column's field, null where the struct is; all nulls where no line has it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_struct(kind) and kind.get_field_index(name) >= 0:
        return pc.struct_field(array, name)
    return pa.nulls(len(array))


def _of(kind: object, check: object) -> bool:
    """A column of the kind ``check`` tests, or of nulls only (no line has the field)."""
    import pyarrow as pa

    return check(kind) or pa.types.is_null(kind)  # type: ignore[operator]
