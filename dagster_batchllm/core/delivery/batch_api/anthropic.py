"""Anthropic's Message Batches API as a :class:`~.protocol.BatchProtocol`, with the official
``anthropic`` client.

Each line of a batch file is one request of the batch (``{"custom_id", "params"}``, its
params translated from the row's chat body when the line is written, :func:`messages_params`);
:meth:`AnthropicBatchProtocol.submit` posts the file as the create call's JSON body, streamed
from disk. The results are Messages, read back into the chat answers the ledger keeps
(:func:`message_answer`, :func:`chat_reply`).

Anthropic's batches carry no metadata, so the submission id travels in the custom ids: a
request key (64 hex digits) is sent as its 43 base64url characters and 20 characters of the
submission's hash (63 of the 64 allowed). :meth:`~AnthropicBatchProtocol.find` reads them in an
ended batch's results; a batch still processing shows no custom ids, so one is recognised by
its request count and creation time where this process made the create call, and otherwise
``find`` says it cannot tell yet (the collector asks again at its next poll) rather than
answer "never created", which would submit the rows a second time.

The translation: the library renders every chat row as an OpenAI chat-completions body (its
request key is the hash of those bytes), so each body is translated when its line is written,
and each Message of the results back into the text, usage and finish reason the ledger
keeps. What the Messages API cannot express fails the row with the reason
(:class:`CannotExpress`); nothing is silently dropped, since a dropped field (a seed, a penalty,
``detail="low"``) would be an answer to another request than the one the key names.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import (
    EndpointError,
    ErrorType,
    InferenceConfigError,
    RowError,
)
from ...redaction import Redactor, server_error
from ...settings import EndpointSpec
from ...usage import TOKEN_CEILING, token_figure
from ..transport import CHAT_ROUTE
from .lines import AnswerBlock, line_blocks, oversized_error
from .protocol import BatchStatus, LineResult, http_client

#: Anthropic's bounds on one batch (requests, bytes of the create call's body).
MAX_REQUESTS, MAX_BODY_BYTES = 100_000, 256_000_000
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_KEY = re.compile(r"[0-9a-f]{64}")
_TAG_CHARS = 20
_FIND_SCAN = 100  # the newest batches find() looks at
_CREATE_SKEW_S = 120.0  # a batch created this long before our create call is not ours
_CHUNK_BYTES = 1 << 20
#: An errored request's error type, as the HTTP status the same error answers online.
_STATUS = {"invalid_request_error": 400, "authentication_error": 401,
           "permission_error": 403, "billing_error": 402, "not_found_error": 404,
           "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
           "timeout_error": 504, "overloaded_error": 529}
_PREFIX = b'{"custom_id":"'
#: Anthropic's image media types; an image of another type cannot be sent.
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: Chat fields with a Messages counterpart (or none needed); any other field fails the row.
_KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "stop", "response_format", "user", "stream", "n"}
#: How a Message's stop_reason reads as an OpenAI finish_reason (what the tasks look at).
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}


class BatchNotYetKnown(RuntimeError):
    """Whether a submission's batch was created cannot be told until batches now processing
    end (their custom ids show only in their results)."""


def config_problem(endpoint: EndpointSpec, route: str) -> str | None:
    """Why a call on ``route`` cannot go through this endpoint's Message Batches, if so."""
    if route != CHAT_ROUTE:
        return (f"endpoint '{endpoint.name}' has batch_protocol='anthropic': Anthropic's "
                f"Message Batches answer chat messages only, not {route!r} (Anthropic has no "
                "embeddings); use another batch endpoint or mode='online'")
    if endpoint.max_requests_per_batch > MAX_REQUESTS:
        return (f"endpoint '{endpoint.name}': max_requests_per_batch="
                f"{endpoint.max_requests_per_batch}, above Anthropic's {MAX_REQUESTS:,} "
                "requests per batch")
    if endpoint.max_bytes_per_batch + endpoint.max_requests_per_batch + 64 > MAX_BODY_BYTES:
        return (f"endpoint '{endpoint.name}': max_bytes_per_batch="
                f"{endpoint.max_bytes_per_batch} does not fit Anthropic's 256 MB per batch "
                "with its separators; at most "
                f"{MAX_BODY_BYTES - endpoint.max_requests_per_batch - 64:,}")
    return None


def api_root(base_url: str) -> str:
    """The client's base URL: the SDK adds ``/v1/messages/batches`` itself, and an endpoint's
    base_url (shared with its OpenAI-compatible chat route) usually ends in /v1."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1") if root.endswith("/v1") else root


def submission_tag(submission_id: str) -> str:
    return hashlib.sha256(submission_id.encode()).hexdigest()[:_TAG_CHARS]


def custom_id(key: str, tag: str) -> str:
    """A request key (64 hex digits) and the submission's tag in one custom id."""
    if not _KEY.fullmatch(key):
        return key  # (no key of this library's; sent as it is, with no tag)
    return base64.urlsafe_b64encode(bytes.fromhex(key)).rstrip(b"=").decode() + tag


def key_of(sent: str) -> tuple[str, str | None]:
    """The request key and submission tag a custom id carries."""
    if len(sent) == 43 + _TAG_CHARS:
        try:
            return base64.urlsafe_b64decode(sent[:43] + "=").hex(), sent[43:]
        except (binascii.Error, ValueError):
            pass
    return sent, None


class AnthropicBatchProtocol:
    provider = "anthropic"

    def __init__(self, endpoint: EndpointSpec, *, timeout_s: float = 600.0):
        try:
            import anthropic
        except ImportError as exc:  # an optional extra: say which, before anything is sent
            raise InferenceConfigError(
                f"endpoint '{endpoint.name}' has batch_protocol='anthropic', which needs the "
                "anthropic package: pip install 'dagster-batchllm[anthropic]'") from exc

        self.endpoint = endpoint
        self.redact = Redactor.of([endpoint])
        # No retries of the client's own: a create retried after a dropped connection could
        # make a second batch (see find).
        self.client = anthropic.Anthropic(
            base_url=api_root(endpoint.base_url), api_key=endpoint.api_key or "not-needed",
            max_retries=0, timeout=timeout_s, http_client=http_client(anthropic))
        self._anthropic = anthropic
        #: submission id -> (requests, time of the create call) of creates made here
        self._creates: dict[str, tuple[int, float]] = {}

    def close(self) -> None:
        self.client.close()

    def line(self, key: str, route: str, body: bytes) -> bytes | RowError:
        problem = config_problem(self.endpoint, route)
        if problem is not None:
            return RowError(problem, error_type=ErrorType.BAD_REQUEST)
        if not CUSTOM_ID.fullmatch(key):
            return RowError(f"request key {key[:80]!r} cannot be an Anthropic custom_id "
                            "(^[a-zA-Z0-9_-]{1,64}$)", error_type=ErrorType.INTERNAL)
        try:
            params = messages_params(json.loads(body))
        except (CannotExpress, ValueError) as exc:
            return RowError(f"this request cannot be sent to Anthropic's Message Batches "
                            f"(endpoint '{self.endpoint.name}'): {exc}",
                            error_type=ErrorType.BAD_REQUEST)
        return b'%s%s","params":%s}\n' % (_PREFIX, key.encode(), json.dumps(
            params, ensure_ascii=False, separators=(",", ":")).encode())

    def submit(self, path: Path, *, route: str, submission_id: str,
               metadata: dict[str, str]) -> tuple[str, str | None]:
        # (metadata: Anthropic's batches have none; the submission travels in the custom ids)
        from anthropic.types.messages import MessageBatch

        tag = submission_tag(submission_id)
        with open(path, "rb") as handle:
            requests = sum(1 for line in handle if line.strip())
        self._creates[submission_id] = (requests, time.time())
        with open(path, "rb") as handle:
            batch = self.client.post(
                "/v1/messages/batches", cast_to=MessageBatch, content=_request_body(handle, tag),
                options={"headers": {"Content-Type": "application/json"}})
        self._creates.pop(submission_id, None)
        return batch.id, None

    def find(self, submission_id: str) -> str | None:
        tag, ours = submission_tag(submission_id), self._creates.get(submission_id)
        candidates, unknown = [], 0
        for batch in self.client.messages.batches.list(limit=_FIND_SCAN).data:  # one page
            if batch.processing_status == "ended":
                if batch.archived_at is None and self._first_tag(batch.id) == tag:
                    return batch.id
            elif ours is not None:
                requests, started = ours
                if (batch.request_counts.processing == requests
                        and batch.created_at.timestamp() >= started - _CREATE_SKEW_S):
                    candidates.append(batch.id)
            else:
                unknown += 1
        if len(candidates) == 1:
            return candidates[0]
        if candidates or unknown:
            raise BatchNotYetKnown(
                f"{len(candidates) or unknown} batches on '{self.endpoint.name}' are still "
                f"processing; whether one of them is submission {submission_id}'s shows once "
                "they end (Anthropic's batches carry no metadata)")
        return None

    def _first_tag(self, batch_id: str) -> str | None:
        with self.client.messages.batches.with_streaming_response.results(batch_id) as reply:
            for raw in reply.iter_lines():
                if raw.strip():
                    return key_of(json.loads(raw).get("custom_id") or "")[1]
        return None

    def poll(self, batch_id: str) -> BatchStatus:
        batch = self.client.messages.batches.retrieve(batch_id)
        counts = batch.request_counts
        ended = batch.processing_status == "ended"
        # In the book's words (see book.ENDED), which the sensors and the collector read.
        if not ended:
            status = "cancelling" if batch.processing_status == "canceling" else "in_progress"
        elif batch.cancel_initiated_at is not None:
            status = "cancelled"
        else:
            status = "expired" if counts.expired else "completed"
        total = (counts.processing + counts.succeeded + counts.errored + counts.canceled
                 + counts.expired)
        return BatchStatus(
            batch_id=batch.id, status=status, ended=ended,
            request_counts={"total": total, "completed": counts.succeeded,
                            "failed": counts.errored, "expired": counts.expired,
                            "canceled": counts.canceled},
            output_file_id=batch.id if ended else None, error_file_id=None, errors=None)

    def results(self, status: BatchStatus, route: str
                ) -> Iterator[LineResult | AnswerBlock]:
        if not status.output_file_id:
            return
        with self.client.messages.batches.with_streaming_response.results(
                status.batch_id) as reply:
            for block in line_blocks(reply.iter_bytes(_CHUNK_BYTES)):
                answers = AnswerBlock([], [], [], [], [], [])
                others = []
                for raw in block:
                    line = json.loads(raw)
                    key, _tag = key_of(str(line.get("custom_id") or ""))
                    too_large = oversized_error(line, self.endpoint.name)
                    if too_large is not None:
                        others.append(LineResult(key, None, too_large))
                        continue
                    result = line.get("result") or {}
                    if result.get("type") == "succeeded":
                        message = result.get("message")
                        text, prompt, completion, reason = message_answer(message)
                        if text.strip():
                            for column, value in zip(answers, (
                                    key, text, prompt, completion, reason,
                                    cache_read_tokens(message)), strict=True):
                                column.append(value)
                            continue
                        # (no text: the chat reader says why that is no answer)
                        others.append(LineResult(key, chat_reply(result.get("message")), None))
                    else:
                        others.append(self._failed(key, result))
                if answers.keys:
                    yield answers
                yield from others

    def _failed(self, key: str, result: dict[str, Any]) -> LineResult:
        kind = result.get("type")
        if kind in ("expired", "canceled"):  # never processed, not billed: "missing"
            message = ("the batch expired before this request was processed" if kind ==
                       "expired" else "the batch was canceled before this request was processed")
            error = server_error(self.redact, 408, json.dumps({"error": {"message": message}}),
                                 endpoint=self.endpoint.name)
            return LineResult(key, None, error, expired=True)
        if kind != "errored":
            return LineResult(key, None, RowError(
                self.redact(f"batch result of unknown type {kind!r}"[:300]),
                error_type=ErrorType.MALFORMED_RESPONSE))
        body = result.get("error") if isinstance(result.get("error"), dict) else {}
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        status = _STATUS.get(str(inner.get("type")), 500)
        return LineResult(key, None, server_error(
            self.redact, status, json.dumps({"error": {
                "message": str(inner.get("message") or kind), "code": inner.get("type")}}),
            endpoint=self.endpoint.name))

    def cancel(self, batch_id: str) -> None:
        self.client.messages.batches.cancel(batch_id)

    def api_error(self, exc: BaseException) -> RowError:
        """A failed create as the row error of its lines."""
        anthropic, name = self._anthropic, self.endpoint.name
        if isinstance(exc, anthropic.APIStatusError):
            return server_error(self.redact, exc.status_code, exc.response.text, endpoint=name)
        if isinstance(exc, anthropic.APITimeoutError):
            return EndpointError(f"timeout submitting a batch to '{name}'",
                                 error_type=ErrorType.TIMEOUT, retryable=True, endpoint=name)
        if isinstance(exc, anthropic.APIConnectionError):
            return self.redact.error(EndpointError(
                f"cannot connect to '{name}' at {self.endpoint.base_url} to submit a batch: "
                f"{exc}", error_type=ErrorType.CONNECTION_ERROR, retryable=True, endpoint=name))
        return self.redact.error(EndpointError(
            f"submitting a batch to '{name}' failed: {type(exc).__name__}: {exc}",
            error_type=ErrorType.SERVER_ERROR, retryable=True, endpoint=name))


def _request_body(handle: Any, tag: str) -> Iterator[bytes]:
    """The create call's JSON body from the file's lines, each custom id carrying ``tag``:
    streamed, so a 256 MB batch is never whole in memory."""
    yield b'{"requests":['
    first = True
    for raw in handle:
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        if line.startswith(_PREFIX):  # (always: line() writes them so)
            end = line.index(b'"', len(_PREFIX))
            key = line[len(_PREFIX):end].decode()
            line = _PREFIX + custom_id(key, tag).encode() + line[end:]
        yield line if first else b"," + line
        first = False
    yield b"]}"


# -- a chat-completions body as Messages parameters, and a Message as what it answered ------
class CannotExpress(ValueError):
    """The body holds something the Messages API has no way to say."""


def messages_params(body: Any) -> dict[str, Any]:
    """The Messages API parameters that ask what the chat-completions ``body`` asks."""
    if not isinstance(body, dict):
        raise CannotExpress("the request body is not a JSON object")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise CannotExpress(f"{', '.join(map(repr, unknown))} "
                            f"{'has' if len(unknown) == 1 else 'have'} no Messages API "
                            "counterpart; leave them out for this endpoint")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise CannotExpress("the request names no model")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if type(max_tokens) is not int or max_tokens < 1:
        raise CannotExpress("the Messages API needs max_tokens, a positive integer")
    system, messages = _conversation(body.get("messages"))
    params: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if system is not None:
        params["system"] = system
    params["messages"] = messages
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1:
            raise CannotExpress(f"temperature {temperature!r}: Anthropic takes 0 to 1 "
                                "(OpenAI's 0 to 2 is another scale)")
        params["temperature"] = temperature
    if body.get("top_p") is not None:
        params["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop is not None:
        sequences = [stop] if isinstance(stop, str) else stop
        if not (isinstance(sequences, list) and all(isinstance(s, str) for s in sequences)):
            raise CannotExpress(f"stop {stop!r} is neither a string nor a list of strings")
        if sequences:
            params["stop_sequences"] = sequences
    output = _output_config(body.get("response_format"))
    if output is not None:
        params["output_config"] = output
    if body.get("user") is not None:
        params["metadata"] = {"user_id": str(body["user"])}
    if body.get("stream"):
        raise CannotExpress("stream=True: a batch request is answered whole")
    if body.get("n") not in (None, 1):
        raise CannotExpress(f"n={body['n']!r}: the Messages API answers one choice")
    return params


def _conversation(messages: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """System messages (only before the conversation: Anthropic has one system prompt) as
    the top-level ``system``, and the user and assistant turns."""
    if not isinstance(messages, list) or not messages:
        raise CannotExpress("the request has no messages")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise CannotExpress(f"messages[{i}] is not an object")
        role = message.get("role")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise CannotExpress(f"messages[{i}] has {', '.join(map(repr, extra))}, which "
                                "the Messages API cannot carry")
        if role in ("system", "developer"):
            if turns:
                raise CannotExpress(f"messages[{i}] is a system message after the "
                                    "conversation began; Anthropic takes one system prompt")
            system.append(_system_text(message.get("content"), i))
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": _content(message.get("content"), i, role)})
        else:
            raise CannotExpress(f"messages[{i}] has role {role!r}; the Messages API takes "
                                "user and assistant turns (tool results are not translated)")
    if not turns:
        raise CannotExpress("the request has a system message but no user message")
    return ("\n\n".join(system) if system else None), turns


def _system_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise CannotExpress(f"messages[{i}]: a system message of anything but text")


def _content(content: Any, i: int, role: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CannotExpress(f"messages[{i}] has no text content")
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str) and set(part) <= {"type",
                                                                                  "text"}:
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and role == "user":
            blocks.append(_image(part, f"messages[{i}].content[{j}]"))
        else:
            raise CannotExpress(f"messages[{i}].content[{j}] is a {kind!r} part, which is "
                                "not translated to the Messages API")
    return blocks


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image_url`` part as an image block: a data URL's bytes, or an http(s) URL."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or set(part) != {"type", "image_url"} or (
            set(image) - {"url", "detail"}):
        raise CannotExpress(f"{where}: an image part other than {{url, detail}}")
    if image.get("detail") not in (None, "auto", "high"):
        # Anthropic always reads an image at its full resolution (up to its own bound).
        raise CannotExpress(f"{where}: detail={image['detail']!r} has no Anthropic "
                            "counterpart; use 'auto' or 'high'")
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    head, comma, data = url.partition(",")
    media_type = head.removeprefix("data:").removesuffix(";base64")
    if not (comma and head.startswith("data:") and head.endswith(";base64")):
        raise CannotExpress(f"{where}: an image URL that is neither http(s) nor base64 data")
    if media_type not in IMAGE_TYPES:
        raise CannotExpress(f"{where}: an image of type {media_type!r}; Anthropic takes "
                            f"{', '.join(IMAGE_TYPES)}")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": data}}


def _output_config(response_format: Any) -> dict[str, Any] | None:
    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        # Anthropic's structured outputs hold to the schema, as strict=True does.
        return {"format": {"type": "json_schema", "schema": spec["schema"]}}
    raise CannotExpress(f"response_format {response_format!r}: Anthropic takes a JSON schema "
                        "(response_format={'type': 'json_schema', 'json_schema': {'schema': "
                        "...}}), not JSON mode")


def message_answer(message: Any) -> tuple[str, int, int, str | None]:
    """A Message's text, prompt tokens (cache reads and writes included, as OpenAI's
    prompt_tokens includes cached tokens), completion tokens and finish reason."""
    if not isinstance(message, dict):
        return "", 0, 0, None
    blocks = message.get("content")
    text = "".join(block.get("text") or "" for block in blocks
                   if isinstance(block, dict) and block.get("type") == "text"
                   ) if isinstance(blocks, list) else ""
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
    # A figure that is no token count reads as the ceiling, which the run holds to the
    # request's bound (core/usage.py): the worst case, never a crash or a negative cost.
    prompt = min(TOKEN_CEILING, sum(_figure(usage, name) for name in (
        "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")))
    reason = message.get("stop_reason")
    return (text, prompt, _figure(usage, "output_tokens"), FINISH_REASONS.get(reason, reason))


def _figure(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return 0 if value is None else token_figure(value)


def cache_read_tokens(message: Any) -> int:
    """A Message's prompt tokens read from Anthropic's prompt cache (``cache_read_input_tokens``,
    OpenAI's ``cached_tokens``): they cost the cached price."""
    usage = message.get("usage") if isinstance(message, dict) else None
    cached = usage.get("cache_read_input_tokens") if isinstance(usage, dict) else None
    return 0 if cached is None else token_figure(cached, default=0)


def chat_reply(message: Any) -> dict[str, Any]:
    """A Message as the chat completion the chat route's reader reads."""
    text, prompt, completion, reason = message_answer(message)
    model = message.get("model") if isinstance(message, dict) else None
    return {"object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": reason,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cache_read_tokens(message)}}}


__all__ = ["FINISH_REASONS", "IMAGE_TYPES", "MAX_BODY_BYTES", "MAX_REQUESTS",
           "AnthropicBatchProtocol", "BatchNotYetKnown", "CannotExpress", "api_root",
           "cache_read_tokens", "chat_reply", "config_problem", "custom_id", "key_of",
           "message_answer", "messages_params", "submission_tag"]
