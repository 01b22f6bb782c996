"""Reading an OpenAI batch result file: lines in blocks, the usual answers read in Arrow.

A result file holds one JSON line per request (``{"custom_id", "response": {"status_code",
"body"}, "error"}``). Parsing each with ``json.loads`` builds every dict of the reply only to
read four of its fields, most of a collect's CPU; :func:`chat_answers` parses a block of
lines with Arrow's JSON reader (in C++) and takes those fields as columns. Where a line is not
the usual answer of a chat completion (another status, an error line, no text, or fields of
types that vary), that line is left to the per-line reader, which says why it is not an
answer; where Arrow cannot read the block at all, every line of it is.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Any

from .transport import Completion

#: Lines parsed at once: a few MB of replies, so memory stays flat in the file's size.
BLOCK_LINES = 8192


def line_blocks(chunks: Iterable[bytes], block_lines: int = BLOCK_LINES
                ) -> Iterator[list[bytes]]:
    """The non-blank lines of a byte stream, ``block_lines`` at a time (the last block
    shorter); a final line without a newline is a line."""
    block: list[bytes] = []
    rest = b""
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        block.extend(p for p in parts if p.strip())
        while len(block) >= block_lines:
            yield block[:block_lines]
            block = block[block_lines:]
    if rest.strip():
        block.append(rest)
    if block:
        yield block


def chat_answers(lines: list[bytes]) -> list[tuple[str, Completion] | None]:
    """For each line, (its custom_id, its answer) when it is a chat completion answered 200
    with text, read as ``completion_from_payload`` reads one; None for every other line (and
    for every line of a block Arrow cannot read as such)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    none: list[tuple[str, Completion] | None] = [None] * len(lines)
    try:
        data = b"\n".join(lines)
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=len(data) + 1), parse_options=_parse_options())
        if table.num_rows != len(lines):
            return none
        keys = table.column("custom_id").combine_chunks()
        response = table.column("response").combine_chunks()
        status = _field(response, "status_code")
        body = _field(response, "body")
        choices = _field(body, "choices")
        usage = _field(body, "usage")
        if not (pa.types.is_string(keys.type) and pa.types.is_integer(status.type)
                and pa.types.is_list(choices.type)):
            return none
        items = choices.flatten()  # every line's choices, one after another
        if not len(items):
            return none
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
            return none
        usable = pc.and_(pc.equal(status, 200),
                         pc.greater(pc.fill_null(pc.list_value_length(choices), 0), 0))
    except (KeyError, ValueError, TypeError, IndexError, pa.ArrowException):
        # Not one shape Arrow can read (a field missing from every line, or of types that
        # vary): each line is read on its own.
        return none
    columns = (keys.to_pylist(), usable.to_pylist(), content.to_pylist(), finish.to_pylist(),
               prompt.to_pylist(), completion.to_pylist())
    del table, response, body, choices, usage, items, first, content, finish, prompt
    # Arrow's allocator keeps what a block freed for the next; given back, memory stays
    # that of one block's replies (a result file is read block after block).
    pa.default_memory_pool().release_unused()
    answers: list[tuple[str, Completion] | None] = []
    for key, ok, text, reason, used, given in zip(*columns, strict=True):
        if not ok or key is None or text is None or not text.strip():
            answers.append(None)  # the per-line reader says what it is
            continue
        reported = used is not None  # as completion_from_payload: prompt_tokens an int
        answers.append((key, Completion(
            text, used if reported else 0, (given or 0) if reported else 0, reported, reason,
            0.0)))
    return answers


def _parse_options() -> Any:
    """Only the fields read are built into columns (the rest of each reply is skipped), and
    a field of another type than these fails the block, which the per-line reader then reads:
    a third less than letting Arrow infer every field's type."""
    global _OPTIONS
    if _OPTIONS is None:
        import pyarrow as pa
        import pyarrow.json as pj

        tokens = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())])
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
