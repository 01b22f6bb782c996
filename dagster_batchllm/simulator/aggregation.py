"""Aggregate requests answered by the simulator, so that a test can count every row.

The simulator is no LLM: to an aggregate request (the format of
:mod:`dagster_batchllm.ai_functions.aggregate_prompts`) it replies with what it can check,
``"Answer over <n> rows [digest <16 hex>]"``. At level 1, ``n`` is the rows in the request and
the digest the sum (mod 2**64) of each row's :func:`row_digest` (a hash of its exact text); at
a higher level, the sums over the partial answers it combines. So a group's final answer says
how many rows reached a level-1 request and, through the digest, that each arrived whole:
a dropped, repeated or cut row changes it (``rows_digest`` of the input gives the expected
value).

:class:`AggregatingResponder` is the echo responder that answers aggregate requests so and
tallies them (requests and rows per level, and each row text seen at level 1); other requests
get the echo. Use it in thread mode: ``SimulatedEndpoint(responder=AggregatingResponder(...))``.

Example::

    >>> from dagster_batchllm.ai_functions.aggregate_prompts import ROWS, user_message
    >>> reply = aggregate_reply([{"role": "user", "content": user_message(ROWS, ["a", "b"])}])
    >>> reply == f"Answer over 2 rows [digest {rows_digest(['a', 'b']):016x}]"
    True
"""

from __future__ import annotations

import re
import threading
from collections import Counter

from ..ai_functions.aggregate_prompts import ROWS, read_request
from .responders import EchoResponder, stable_hash

_MASK = (1 << 64) - 1
_ANSWER = re.compile(r"Answer over (\d+) rows \[digest ([0-9a-f]{16})\]")


def row_digest(text: str) -> int:
    return stable_hash(text)


def rows_digest(texts) -> int:
    """The digest an aggregate over ``texts`` ends with, if every row arrived whole once."""
    return sum(row_digest(t) for t in texts) & _MASK


def answer_text(rows: int, digest: int) -> str:
    return f"Answer over {rows} rows [digest {digest:016x}]"


def read_answer(text: str) -> tuple[int, int] | None:
    """(rows, digest) of a simulated aggregate answer, or None."""
    found = _ANSWER.fullmatch(text.strip()) if isinstance(text, str) else None
    return (int(found.group(1)), int(found.group(2), 16)) if found else None


def aggregate_reply(messages: list[dict]) -> str | None:
    """The reply to an aggregate request, or None for any other request."""
    request = read_request(messages)
    if request is None:
        return None
    kind, items = request
    if kind == ROWS:
        return answer_text(len(items), rows_digest(items))
    rows = digest = 0
    for item in items:
        found = read_answer(item)
        if found is None:  # not an answer of ours: a row of its own, so the count shows it
            found = (1, row_digest(item))
        rows, digest = rows + found[0], (digest + found[1]) & _MASK
    return answer_text(rows, digest)


class AggregatingResponder(EchoResponder):
    """The echo responder, answering aggregate requests as :func:`aggregate_reply` does and
    counting them: ``requests_per_level`` (1: rows; 2: any level of partial answers),
    ``rows_at_level1`` and ``rows_seen`` (a Counter of the exact row texts of level-1 requests).
    """

    def __init__(self, models: tuple[str, ...] | list[str] = ("sim-model",)):
        super().__init__(models)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests_per_level: Counter[int] = Counter()
        self.rows_at_level1 = 0
        self.rows_seen: Counter[str] = Counter()

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        request = read_request(messages)
        if request is None:
            return super().respond(model, messages, params)
        kind, items = request
        with self._lock:
            if kind == ROWS:
                self.requests_per_level[1] += 1
                self.rows_at_level1 += len(items)
                self.rows_seen.update(items)
            else:
                self.requests_per_level[2] += 1
        return aggregate_reply(messages) or ""
