"""What an aggregate's requests say: the instruction, and the rows or partial answers.

Each request has a system message (the user's instruction and what the items are) and a user
message (a header line, then one JSON string per line: unambiguous, whatever a row holds, and
easy for a model to read). A level-1 request carries rows of the group; a higher level carries
partial answers, each the answer for a part of the same rows. Nothing in a request depends on
the group's size or on how many levels it takes, so a chunk that did not change is the same
request, the same key, on every run.

:func:`read_request` takes a request apart again; the simulator answers aggregates with it.

Example::

    >>> text = user_message(ROWS, ["refund for order 12", "where is my parcel"])
    >>> read_request([{"role": "user", "content": text}])
    ('rows', ['refund for order 12', 'where is my parcel'])
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .chunking import item_line

ROWS, PARTIALS = "rows", "partials"
HEADERS = {
    ROWS: "Rows of the group, one JSON string per line:",
    PARTIALS: "Partial answers, each for a part of the group's rows, one JSON string per line:",
}
# The instruction of ai_summarize_agg (and of llm.aggregate's default): one summary.
SUMMARY_INSTRUCTION = ("Summarize the rows in one paragraph: the main themes, what they have "
                       "in common and what stands out.")


def system_message(instruction: str, kind: str) -> str:
    """The system message of a level's requests (``kind``: ROWS or PARTIALS)."""
    if kind == ROWS:
        return (f"{instruction.strip()}\n\nThe user sends rows of a table: all the rows of a "
                "group, or a part of them (your answer is then combined with the answers for "
                "the other parts). Answer the instruction for the rows sent. Reply with the "
                "answer only.")
    return (f"{instruction.strip()}\n\nThe user sends partial answers to that instruction, "
            "each for a part of the same group of rows. Combine them into one answer for all "
            "of those rows, as if you had read them all. Reply with the answer only.")


def user_message(kind: str, items: Sequence[str]) -> str:
    """The user message: the header, then each item's line."""
    return HEADERS[kind] + "\n" + "\n".join(item_line(text) for text in items)


def header_chars(kind: str) -> int:
    """Characters of the user message besides the items' lines (each with its newline)."""
    return len(HEADERS[kind])


def read_request(messages: Sequence[dict]) -> tuple[str, list[str]] | None:
    """(ROWS or PARTIALS, the items) of an aggregate request, else None: what a server that
    knows the format reads from the last user message."""
    users = [m for m in messages if m.get("role", "user") == "user"]
    content = users[-1].get("content") if users else None
    if not isinstance(content, str):
        return None
    head, _, rest = content.partition("\n")
    kind = next((k for k, header in HEADERS.items() if header == head), None)
    if kind is None:
        return None
    items = []
    for line in rest.split("\n"):
        try:
            item = json.loads(line)
        except ValueError:
            return None
        if not isinstance(item, str):
            return None
        items.append(item)
    return kind, items
