"""What a run asks of a model: how rows become request items and replies become row values.

The engine runs any :class:`Task` over any delivery (see :mod:`.delivery`) without knowing
which, so a new kind of job is a new implementation here rather than branches through the run.
:class:`ChatTask` is one chat completion per row, its value the reply's text or (with
``response_format``) its parsed and validated JSON. A task whose requests carry several rows
(embeddings, a scoring model's ``/invocations``) is a :class:`~.grouping.GroupedTask`: its
``deliver`` puts a :class:`~.grouping.GroupingDelivery` in front of the delivery it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .call import InferenceCall
from ...errors import RowError, StructuredOutputError
from .outputs import ReplyParser, cut_off_hint
from ...run.prompts import RowRequest, iter_row_requests
from ...delivery.transport import CHAT_ROUTE, Completion, parse_completion

if TYPE_CHECKING:
    from ...delivery.online import Delivery


class Task(Protocol):
    #: The API route its requests go to, below an endpoint's base URL.
    route: str
    #: Most rows rendered at a time (None: the settings' chunk_rows). A rendered request holds
    #: its body, so a task whose bodies are large (images) renders fewer at once.
    max_chunk_rows: int | None

    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        """One request item per row (a tuple of the call's input columns), or the row's error."""
        ...

    def value(self, content: str) -> Any:
        """The row value of a stored reply; raises ``RowError`` when it is not usable."""
        ...

    def reply_value(self, completion: Completion, request: RowRequest) -> Any:
        """The row value of a fresh reply to ``request``; raises ``RowError`` when it is not
        usable (the error may say more than :meth:`value` can, e.g. that it was cut off)."""
        ...

    def parse_reply(self, raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
        """A 200 reply's body read into a Completion; raises ``MalformedResponseError``."""
        ...

    def deliver(self, delivery: Delivery) -> Delivery:
        """The delivery the run uses, given the one that sends one request as it is (a task
        that groups rows into requests wraps it; the others return it)."""
        ...


_IMAGE_CHUNK_ROWS = 256


class ChatTask:
    """One ``/chat/completions`` request per row (rows that render alike share one)."""

    route = CHAT_ROUTE

    def __init__(self, call: InferenceCall, *, default_max_tokens: int):
        self.call = call
        self.default_max_tokens = default_max_tokens
        # An image request holds its base64 body (~270 KB for a 200 KB page): 256 of them keep
        # memory flat in rows (bench/images.py: 0.3 KiB per extra row, 262 KiB at 4096).
        self.max_chunk_rows = _IMAGE_CHUNK_ROWS if call.images else None
        self._parser = ReplyParser(structured=call.structured, schema=call.schema)

    parse_reply = staticmethod(parse_completion)

    def deliver(self, delivery: Delivery) -> Delivery:
        return delivery

    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        return iter_row_requests(rows, self.call, default_max_tokens=self.default_max_tokens)

    def value(self, content: str) -> Any:
        return self._parser.parse(content)

    def reply_value(self, completion: Completion, request: RowRequest) -> Any:
        try:
            return self._parser.parse(completion.content)
        except StructuredOutputError as exc:
            raise cut_off_hint(exc, finish_reason=completion.finish_reason,
                               max_tokens=request.max_tokens) from None
