"""How a batch result line's reply becomes what the ledger keeps, per route.

A batch is collected (often by a sensor's run, with no call at hand) by the route its lines
went to, so the readers are found by route: the chat reader is here, and a task of another
route registers its own when its module is imported (every built-in task's is, with the
client).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import InferenceConfigError
from ...requests import Completion
from ..transport import CHAT_ROUTE, completion_from_payload

#: (the reply parsed from the line's JSON, endpoint=, latency_s=) -> the answer to keep
LineReader = Callable[..., Completion]

_READERS: dict[str, LineReader] = {CHAT_ROUTE: completion_from_payload}


def register_line_reader(route: str, reader: LineReader) -> None:
    _READERS[route] = reader


def line_reader(route: str, *, what: str = "a batch") -> LineReader:
    reader = _READERS.get(route)
    if reader is None:
        raise InferenceConfigError(
            f"{what} is of route {route!r}, which no job of this version reads "
            f"(routes read: {sorted(_READERS)})")
    return reader


def read_line_body(route: str, body: bytes, *, endpoint: str, latency_s: float) -> Any:
    """A reply body kept as text (a line of a book made before) read as the route says."""
    from ..transport import json_reply

    return line_reader(route)(json_reply(body, endpoint), endpoint=endpoint, latency_s=latency_s)


__all__ = ["LineReader", "line_reader", "read_line_body", "register_line_reader"]
