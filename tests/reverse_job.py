"""A toy fifth job for the tests: it reverses each row's text.

The task sends the text as a chat message to a model that reverses what it reads (a responder
of the simulated endpoint), and reads the reply back. tests/core/test_a_new_job.py runs it
online, through the batch API and as a dry run; tests/dagster/test_call_asset.py as an asset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dagster_batchllm.core.delivery.transport import CHAT_ROUTE, parse_completion
from dagster_batchllm.core.errors import InvalidInputError, RowError
from dagster_batchllm.core.requests import RowRequest, encode_body, keyed_request
from dagster_batchllm.core.tasks.base import CallBase, Task, register_task

MODEL = "reverser"


class Reverser:
    """The simulated model: it answers each message with its text reversed."""

    def models(self) -> list[str]:
        return [MODEL]

    def respond(self, model: str, messages: list[dict], params: dict) -> str:
        return messages[-1]["content"][::-1]


@dataclass(frozen=True)
class TextCall(CallBase):
    """The fields of a job over one text column (the call classes below share them)."""

    column: str = "text"
    model: str | None = MODEL
    output_column: str = "reversed"
    error_column: str | None = None

    def __post_init__(self) -> None:
        self._check_common()

    def columns_read(self) -> list[str]:
        return [self.column]


@dataclass(frozen=True)
class ReverseCall(TextCall):
    job = "reverse"
    sent_fields = ("column", "model")


@register_task(ReverseCall)
class ReverseTask(Task):
    route = CHAT_ROUTE
    parse_reply = staticmethod(parse_completion)

    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        model = self.call.model
        for (text,) in rows:
            if not isinstance(text, str) or not text:
                yield InvalidInputError("the cell holds no text to reverse")
                continue
            body = encode_body({"model": model, "max_tokens": 64,
                                "messages": [{"role": "user", "content": text}]})
            yield keyed_request(model, body, [text], max_tokens=64)

    def value(self, content: str) -> str:
        return content
