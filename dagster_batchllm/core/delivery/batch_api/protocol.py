"""A provider's batch protocol: how request lines are written, submitted, polled and read back.

:class:`BatchProtocol` is all that the batch delivery and its collector know of a provider, so
Anthropic's Message Batches (requests posted inline, results as JSONL, ``ended`` rather than
``completed``) would be a second implementation beside :class:`OpenAIBatchProtocol` (OpenAI's
Files and Batches API, which Azure OpenAI, Together, Groq and Mistral also speak). Every call is
blocking and few (one upload and one create per batch, one retrieve per poll): the delivery
runs them on a thread, with the official ``openai`` client.

Each line's ``custom_id`` is its request key, so the results tie back to table rows.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...errors import RowError, classify_http_error
from ...settings import EndpointSpec
from ..transport import CHAT_ROUTE
from .lines import AnswerBlock, chat_answer_block, line_blocks

#: Metadata key under which a batch carries its submission id, so a run that crashed between
#: creating the batch and recording its id finds it again.
SUBMISSION_METADATA = "batchllm_submission"
_CHUNK_BYTES = 1 << 20  # read from the result file at once


_TLS: list[Any] = []  # the process's TLS context for the clients, once made
_TLS_LOCK = threading.Lock()


def _http_client(openai: Any) -> Any:
    """The client's own HTTP client, on one TLS context per process. A new client makes a
    context, which loads the system's CA certificates: about 50 ms of CPU, that every batch
    call (a protocol per endpoint) and every batch sensor tick paid again. The context is
    made as the client's HTTP library makes its default one; None (the client's default)
    where that library offers no such call."""
    with _TLS_LOCK:
        if not _TLS:
            library = sys.modules.get(openai.DefaultHttpxClient.__mro__[1].__module__
                                      .partition(".")[0])
            make = getattr(library, "create_ssl_context", None)
            _TLS.append(make() if callable(make) else None)
    return openai.DefaultHttpxClient(verify=_TLS[0]) if _TLS[0] is not None else None


@dataclass(frozen=True, slots=True)
class BatchStatus:
    batch_id: str
    status: str  # the provider's word; see :data:`~.batch_book.ENDED`
    ended: bool
    request_counts: dict[str, int]
    output_file_id: str | None
    error_file_id: str | None
    errors: str | None  # why the batch as a whole failed, if it did


@dataclass(slots=True)  # not frozen: one is made per result line (see RowRequest)
class LineResult:
    """One result line: the request key, and the 200 reply or the error it got."""

    request_key: str
    reply: Any  # the reply body, parsed from the line's JSON, when answered 200
    error: RowError | None
    expired: bool = False


class BatchProtocol(Protocol):
    provider: str

    def line(self, key: str, route: str, body: bytes) -> bytes:
        """One request line (ending in a newline) for a request body already serialized."""
        ...

    def submit(self, path: Path, *, route: str, submission_id: str,
               metadata: dict[str, str]) -> tuple[str, str | None]:
        """Upload the file at ``path`` and create a batch over it: (batch id, input file id).
        The submission id goes into the batch's metadata."""
        ...

    def find(self, submission_id: str) -> str | None:
        """The id of the batch created for ``submission_id``, if the provider has one."""
        ...

    def poll(self, batch_id: str) -> BatchStatus: ...

    def results(self, status: BatchStatus, route: str
                ) -> Iterator[LineResult | AnswerBlock]:
        """The ended batch's result lines (output then errors), streamed: a line each, or
        the answers of many lines as columns where the protocol read ``route``'s replies
        itself (see :mod:`.batch_lines`)."""
        ...

    def cancel(self, batch_id: str) -> None: ...


class OpenAIBatchProtocol:
    """OpenAI's Files + Batches API through the official client."""

    provider = "openai"

    def __init__(self, endpoint: EndpointSpec, *, timeout_s: float = 600.0):
        import openai

        self.endpoint = endpoint
        # No retries of the client's own: a create retried after a dropped connection could
        # make a second batch. Lost replies are recovered by :meth:`find` instead.
        self.client = openai.OpenAI(base_url=endpoint.base_url,
                                    api_key=endpoint.api_key or "not-needed",
                                    max_retries=0, timeout=timeout_s,
                                    http_client=_http_client(openai))
        self._openai = openai

    def close(self) -> None:
        self.client.close()

    def line(self, key: str, route: str, body: bytes) -> bytes:
        # The body is already canonical JSON: splice it in rather than parse and re-encode it.
        return b'{"custom_id":"%s","method":"POST","url":"/v1%s","body":%s}\n' % (
            key.encode(), route.encode(), body)

    def submit(self, path: Path, *, route: str, submission_id: str,
               metadata: dict[str, str]) -> tuple[str, str | None]:
        with open(path, "rb") as handle:  # a file object: httpx streams it, never whole
            uploaded = self.client.files.create(
                file=(f"{submission_id}.jsonl", handle, "application/jsonl"), purpose="batch")
        batch = self.client.batches.create(
            input_file_id=uploaded.id, endpoint=f"/v1{route}", completion_window="24h",
            metadata={**metadata, SUBMISSION_METADATA: submission_id})
        return batch.id, uploaded.id

    def find(self, submission_id: str) -> str | None:
        for batch in self.client.batches.list(limit=100):
            if (batch.metadata or {}).get(SUBMISSION_METADATA) == submission_id:
                return batch.id
        return None

    def poll(self, batch_id: str) -> BatchStatus:
        batch = self.client.batches.retrieve(batch_id)
        counts = batch.request_counts
        errors = None
        if batch.errors is not None and batch.errors.data:
            errors = "; ".join(f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "")
                               for e in batch.errors.data[:5])
        return BatchStatus(
            batch_id=batch.id, status=batch.status,
            ended=batch.status in ("completed", "expired", "cancelled", "failed"),
            request_counts={"total": counts.total, "completed": counts.completed,
                            "failed": counts.failed} if counts else {},
            output_file_id=batch.output_file_id, error_file_id=batch.error_file_id,
            errors=errors)

    def results(self, status: BatchStatus, route: str
                ) -> Iterator[LineResult | AnswerBlock]:
        chat = route == CHAT_ROUTE
        for file_id in (status.output_file_id, status.error_file_id):
            if not file_id:
                continue
            with self.client.files.with_streaming_response.content(file_id) as response:
                for block in line_blocks(response.iter_bytes(_CHUNK_BYTES)):
                    answers, others = (chat_answer_block(block) if chat
                                       else (None, range(len(block))))
                    if answers is not None and answers.keys:
                        yield answers
                    for i in others:
                        yield self._read_line(block[i])

    def _read_line(self, raw: bytes | str) -> LineResult:
        line = json.loads(raw)
        key = line["custom_id"]
        response = line.get("response")
        if response is not None and response.get("status_code") == 200:
            return LineResult(key, response.get("body"), None)
        if response is not None:
            body = response.get("body")
            return LineResult(key, None, classify_http_error(
                int(response.get("status_code") or 500),
                body if isinstance(body, str) else json.dumps(body),
                retry_after_s=None, endpoint=self.endpoint.name))
        error = line.get("error") or {}
        code = str(error.get("code") or "")
        message = str(error.get("message") or "the line has no response")
        expired = code == "batch_expired"
        exc = classify_http_error(408 if expired else 500,
                                  json.dumps({"error": {"message": message, "code": code}}),
                                  retry_after_s=None, endpoint=self.endpoint.name)
        return LineResult(key, None, exc, expired=expired)

    def cancel(self, batch_id: str) -> None:
        self.client.batches.cancel(batch_id)

    def api_error(self, exc: BaseException) -> RowError:
        """A failed upload or create as the row error of its lines."""
        from ...errors import EndpointError, ErrorType

        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            return classify_http_error(exc.status_code, exc.response.text, retry_after_s=None,
                                       endpoint=self.endpoint.name)
        if isinstance(exc, openai.APITimeoutError):
            return EndpointError(f"timeout submitting a batch to '{self.endpoint.name}'",
                                 error_type=ErrorType.TIMEOUT, retryable=True,
                                 endpoint=self.endpoint.name)
        if isinstance(exc, openai.APIConnectionError):
            return EndpointError(
                f"cannot connect to '{self.endpoint.name}' at {self.endpoint.base_url} to "
                f"submit a batch: {exc}", error_type=ErrorType.CONNECTION_ERROR,
                retryable=True, endpoint=self.endpoint.name)
        return EndpointError(f"submitting a batch to '{self.endpoint.name}' failed: "
                             f"{type(exc).__name__}: {exc}", error_type=ErrorType.SERVER_ERROR,
                             retryable=True, endpoint=self.endpoint.name)


def protocol_for(endpoint: EndpointSpec) -> OpenAIBatchProtocol:
    """The batch protocol an endpoint speaks (OpenAI's, for every OpenAI-compatible one)."""
    return OpenAIBatchProtocol(endpoint)
