"""The chat job's task: one ``/chat/completions`` request per row, its reply the row's value.

The value is the reply's text or (with ``response_format``) its parsed and validated JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...delivery.transport import CHAT_ROUTE, completion_from_payload, parse_completion
from ...errors import RowError, StructuredOutputError
from ...file_policy import FilePolicy, under_policy
from ...requests import Completion, RowRequest
from ..base import Task, register_task
from .call import InferenceCall
from .outputs import ReplyParser, cut_off_hint
from .rendering import iter_row_requests

_IMAGE_CHUNK_ROWS = 256


@register_task(InferenceCall)
class ChatTask(Task):
    """One ``/chat/completions`` request per row (rows that render alike share one)."""

    route = CHAT_ROUTE

    def __init__(self, call: InferenceCall, *, default_max_tokens: int,
                 prefix_affinity: bool = False, file_policy: FilePolicy | None = None):
        super().__init__(call)
        # Which path cells of its images may be read (files_roots, resolved when the call
        # starts) and whether image URLs may be sent.
        self.file_policy = file_policy if file_policy is not None else FilePolicy.of()
        self.default_max_tokens = default_max_tokens
        # Each request's prefix key, by which the pool sends rows that share a long head to
        # one endpoint (its prefix cache then holds the head); without keys, least-loaded.
        self.prefix_affinity = prefix_affinity
        # An image request holds its base64 body (~270 KB for a 200 KB page): 256 of them keep
        # memory flat in rows (bench/images.py: 0.3 KiB per extra row, 262 KiB at 4096).
        self.max_chunk_rows = _IMAGE_CHUNK_ROWS if call.images else None
        self._parser = ReplyParser(structured=call.structured, schema=call.schema)

    @classmethod
    async def prepare(cls, call: InferenceCall, frame: Any, client: Any) -> ChatTask:
        settings = client.settings
        return cls(call, default_max_tokens=settings.default_max_tokens,
                   prefix_affinity=settings.prefix_affinity,
                   file_policy=FilePolicy.of(settings))

    parse_reply = staticmethod(parse_completion)
    read_line = staticmethod(completion_from_payload)

    def route_models(self, settings: Any) -> frozenset[str]:
        return settings.models

    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        items = iter_row_requests(rows, self.call, default_max_tokens=self.default_max_tokens,
                                  prefix_keys=self.prefix_affinity)
        # The renderer reads image cells without the settings: the call's policy is in force
        # while it renders them.
        return under_policy(self.file_policy, items) if self.call.images else items

    def value(self, content: str) -> Any:
        return self._parser.parse(content)

    def reply_value(self, completion: Completion, request: RowRequest) -> Any:
        try:
            return self._parser.parse(completion.content)
        except StructuredOutputError as exc:
            raise cut_off_hint(exc, finish_reason=completion.finish_reason,
                               max_tokens=request.max_tokens) from None
