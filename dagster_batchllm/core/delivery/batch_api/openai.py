"""OpenAI's Files and Batches API as a :class:`~.protocol.BatchProtocol` (which Azure OpenAI,
Together, Groq and Mistral also speak), with the official ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ...errors import RowError
from ...redaction import Redactor, server_error
from ...settings import EndpointSpec
from ..transport import CHAT_ROUTE
from .lines import AnswerBlock, chat_answer_block, line_blocks, oversized_error
from .protocol import BatchStatus, LineResult, http_client

#: Metadata key under which a batch carries its submission id, so a run that crashed between
#: creating the batch and recording its id finds it again.
SUBMISSION_METADATA = "batchllm_submission"
_CHUNK_BYTES = 1 << 20  # read from the result file at once


class OpenAIBatchProtocol:
    """OpenAI's Files + Batches API through the official client."""

    provider = "openai"

    def __init__(self, endpoint: EndpointSpec, *, timeout_s: float = 600.0):
        import openai

        self.endpoint = endpoint
        self.redact = Redactor.of([endpoint])
        # No retries of the client's own: a create retried after a dropped connection could
        # make a second batch. Lost replies are recovered by :meth:`find` instead.
        self.client = openai.OpenAI(base_url=endpoint.base_url,
                                    api_key=endpoint.api_key or "not-needed",
                                    max_retries=0, timeout=timeout_s,
                                    http_client=http_client(openai))
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
            errors = self.redact("; ".join(
                f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "")
                for e in batch.errors.data[:5]))
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
        too_large = oversized_error(line, self.endpoint.name)
        if too_large is not None:
            return LineResult(key, None, too_large)
        response = line.get("response")
        if response is not None and response.get("status_code") == 200:
            return LineResult(key, response.get("body"), None)
        if response is not None:
            body = response.get("body")
            return LineResult(key, None, server_error(
                self.redact, int(response.get("status_code") or 500),
                body if isinstance(body, str) else json.dumps(body),
                endpoint=self.endpoint.name))
        error = line.get("error") or {}
        code = str(error.get("code") or "")
        message = str(error.get("message") or "the line has no response")
        expired = code == "batch_expired"
        exc = server_error(self.redact, 408 if expired else 500,
                           json.dumps({"error": {"message": message, "code": code}}),
                           endpoint=self.endpoint.name)
        return LineResult(key, None, exc, expired=expired)

    def cancel(self, batch_id: str) -> None:
        self.client.batches.cancel(batch_id)

    def api_error(self, exc: BaseException) -> RowError:
        """A failed upload or create as the row error of its lines."""
        from ...errors import EndpointError, ErrorType

        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            return server_error(self.redact, exc.status_code, exc.response.text,
                                endpoint=self.endpoint.name)
        if isinstance(exc, openai.APITimeoutError):
            return EndpointError(f"timeout submitting a batch to '{self.endpoint.name}'",
                                 error_type=ErrorType.TIMEOUT, retryable=True,
                                 endpoint=self.endpoint.name)
        if isinstance(exc, openai.APIConnectionError):
            return self.redact.error(EndpointError(
                f"cannot connect to '{self.endpoint.name}' at {self.endpoint.base_url} to "
                f"submit a batch: {exc}", error_type=ErrorType.CONNECTION_ERROR,
                retryable=True, endpoint=self.endpoint.name))
        return self.redact.error(EndpointError(
            f"submitting a batch to '{self.endpoint.name}' failed: {type(exc).__name__}: {exc}",
            error_type=ErrorType.SERVER_ERROR, retryable=True, endpoint=self.endpoint.name))


__all__ = ["SUBMISSION_METADATA", "OpenAIBatchProtocol"]
