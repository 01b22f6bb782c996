"""Anthropic's Message Batches API, simulated: what ``anthropic.Anthropic().messages.batches``
calls.

``POST /v1/messages/batches`` takes the requests inline; each one's Messages params are written
as a chat-completions line of an ordinary batch input file, and the batch is a record of the
shared `BatchStore` that `BatchRunner` moves through its lifecycle. So a request is answered by
the chat route's own code (an answer equals the online answer to the same messages), and the
stage times, ``advance_batches`` / ``complete_batches`` / ``expire_batches``, the line script
and ``batch_line_error_rate`` steer these batches as they steer OpenAI's. The routes present a
record as Anthropic does: ``processing_status`` in_progress / canceling / ended, request counts
that stay "processing" until the batch ends, and results as JSONL of ``succeeded`` (a Message),
``errored``, ``expired`` and ``canceled`` lines, in Anthropic's error envelope. Every call needs
the key (when the server has one) in ``x-api-key``, or as a bearer token, which is how the
``anthropic`` client 2.x sends an ``api_key``, and takes its outcome from the
``batch_api`` script, as the Files and Batches routes do (:mod:`.batch_routes`).

Unlike Anthropic, a batch holds requests of one model (the runner's validation, OpenAI's rule);
the library cuts its batches per model anyway.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from ..openai_server.protocol import Reject
from .batch_routes import BatchRoutes, Handler
from .batch_runner import CANCELLABLE, BatchRunner
from .state import SimState

MAX_REQUESTS = 100_000
MAX_BODY_BYTES = 256_000_000
PREFIX = "msgbatch_"
_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CHAT_URL = "/v1/chat/completions"
#: HTTP status -> Anthropic's error type (the envelope's error.type)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 409: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               504: "timeout_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "content_filter": "refusal"}
_LINES_PER_WRITE = 2000


class AnthropicReject(Reject):
    """A refusal in Anthropic's error envelope."""

    def body(self) -> dict:
        return error_envelope(self.status, self.message)


def error_envelope(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message},
            "request_id": f"req_sim{uuid.uuid4().hex[:16]}"}


class AnthropicBatches(BatchRoutes):
    Rejection = AnthropicReject

    def __init__(self, state: SimState, api_key: str | None, runner: BatchRunner):
        super().__init__(state, runner)
        self.api_key = api_key

    def routes(self) -> Iterable[tuple[str, str, Handler]]:
        return (
            ("POST", "/v1/messages/batches", self.create),
            ("GET", "/v1/messages/batches", self.list),
            ("GET", "/v1/messages/batches/{batch_id}", self.retrieve),
            ("GET", "/v1/messages/batches/{batch_id}/results", self.results),
            ("POST", "/v1/messages/batches/{batch_id}/cancel", self.cancel),
        )

    def authorized(self, request: web.Request) -> bool:
        return not self.api_key or self.api_key in (
            request.headers.get("x-api-key"),
            request.headers.get("Authorization", "").removeprefix("Bearer "))

    def unauthorized(self) -> Reject:
        return AnthropicReject(401, "invalid x-api-key")

    # -- routes ----------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            raise AnthropicReject(400, "request body is not valid JSON") from exc
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            raise AnthropicReject(400, "requests: a non-empty list is required")
        limit = min(MAX_REQUESTS, self.state.config["batch_max_lines"] or MAX_REQUESTS)
        if len(requests) > limit:
            raise AnthropicReject(413, f"a batch holds at most {limit} requests, not "
                                       f"{len(requests)}")
        seen: set[str] = set()
        lines = []
        for i, item in enumerate(requests):
            custom = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom, str) or not _CUSTOM_ID.fullmatch(custom):
                raise AnthropicReject(400, f"requests.{i}.custom_id: must match "
                                           "^[a-zA-Z0-9_-]{1,64}$")
            if custom in seen:
                raise AnthropicReject(400, f"requests.{i}.custom_id: duplicate {custom!r}")
            seen.add(custom)
            params = item.get("params")
            if not (isinstance(params, dict) and isinstance(params.get("model"), str)
                    and type(params.get("max_tokens")) is int
                    and isinstance(params.get("messages"), list)):
                raise AnthropicReject(400, f"requests.{i}.params: model, max_tokens and "
                                           "messages are required")
            lines.append({"custom_id": custom, "method": "POST", "url": _CHAT_URL,
                          "body": chat_body(params)})
        partial = self.store.path(f"anthropic-{uuid.uuid4().hex}.part")
        with open(partial, "wb") as out:
            out.write("".join(json.dumps(line, ensure_ascii=False) + "\n"
                              for line in lines).encode())
        source = self.store.add_file(partial, "message_batch_requests.jsonl", "batch")
        record = self.store.add_batch(source["id"], _CHAT_URL, None)
        # Anthropic's ids, and its request count from the start (the runner counts lines as
        # it validates them).
        del self.store.batches[record["id"]]
        record["id"] = PREFIX + record["id"].removeprefix("batch_")
        record["_sim"]["anthropic"] = {"requests": len(lines)}
        self.store.batches[record["id"]] = record
        return web.json_response(self._public(record, request))

    async def list(self, request: web.Request) -> web.Response:
        records = [r for r in reversed(self.store.batches.values()) if _ours(r)]
        after = request.query.get("after_id")
        if after:
            ids = [r["id"] for r in records]
            records = records[ids.index(after) + 1:] if after in ids else []
        limit = max(1, min(1000, int(request.query.get("limit", 20))))
        page = records[:limit]
        return web.json_response({
            "data": [self._public(r, request) for r in page],
            "has_more": len(records) > len(page),
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None})

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self._public(self._batch(request), request))

    async def cancel(self, request: web.Request) -> web.Response:
        record = self._batch(request)
        self.store.cancel_requests += 1
        if record["status"] in CANCELLABLE:
            self.runner.cancel(record)
        elif record["status"] != "cancelling":
            raise AnthropicReject(409, f"batch {record['id']} has ended; it cannot be "
                                       "canceled")
        return web.json_response(self._public(record, request))

    async def results(self, request: web.Request) -> web.StreamResponse:
        record = self._batch(request)
        if _processing_status(record) != "ended":
            raise AnthropicReject(400, f"batch {record['id']} is still processing; its "
                                       "results are available once it has ended")
        response = web.StreamResponse(headers={"Content-Type": "application/binary"})
        await response.prepare(request)
        chunk: list[str] = []
        for line in result_lines(record, self.store.files):
            chunk.append(json.dumps(line, ensure_ascii=False) + "\n")
            if len(chunk) >= _LINES_PER_WRITE:
                await response.write("".join(chunk).encode())
                chunk = []
        if chunk:
            await response.write("".join(chunk).encode())
        await response.write_eof()
        return response

    def _batch(self, request: web.Request) -> dict:
        batch_id = request.match_info["batch_id"]
        record = self.store.batches.get(batch_id)
        if record is None or not _ours(record):
            raise AnthropicReject(404, f"no message batch with id {batch_id!r}")
        return record

    def _public(self, record: dict, request: web.Request) -> dict:
        """The record as a MessageBatch object."""
        status = _processing_status(record)
        total = record["_sim"]["anthropic"]["requests"]
        counts = {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0,
                  "expired": 0}
        if status == "ended":
            done = record["request_counts"]
            failed = record["status"] == "failed"
            counts.update(processing=0, succeeded=done["completed"],
                          errored=total - done["completed"] if failed else done["failed"])
            rest = total - counts["succeeded"] - counts["errored"]
            if rest:
                counts["expired" if record["status"] == "expired" else "canceled"] = rest
        ended_at = next((record.get(f"{s}_at") for s in ("completed", "expired", "cancelled",
                                                          "failed") if record.get(f"{s}_at")),
                        None)
        return {
            "id": record["id"], "type": "message_batch", "processing_status": status,
            "request_counts": counts, "created_at": _when(record["created_at"]),
            "expires_at": _when(record["expires_at"]), "archived_at": None,
            "ended_at": _when(ended_at) if status == "ended" else None,
            "cancel_initiated_at": _when(record.get("cancelling_at")),
            "results_url": (f"{request.url.origin()}/v1/messages/batches/{record['id']}/results"
                            if status == "ended" else None)}


def chat_body(params: dict) -> dict:
    """A request's Messages params as the chat-completions body the runner answers."""
    messages = []
    system = params.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(
            block.get("text", "") for block in system if isinstance(block, dict))
        messages.append({"role": "system", "content": text})
    for message in params["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [_chat_part(block) for block in content]
        messages.append({"role": message.get("role") if isinstance(message, dict) else None,
                         "content": content})
    body = {"model": params["model"], "messages": messages, "max_tokens": params["max_tokens"]}
    for name in ("temperature", "top_p"):
        if params.get(name) is not None:
            body[name] = params[name]
    if params.get("stop_sequences"):
        body["stop"] = params["stop_sequences"]
    output = (params.get("output_config") or {}).get("format")
    if isinstance(output, dict) and output.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": output.get("schema"), "strict": True}}
    return body


def _chat_part(block: dict) -> dict:
    if not isinstance(block, dict) or block.get("type") != "image":
        return block  # text blocks read the same in both APIs
    source = block.get("source") or {}
    url = (source.get("url") if source.get("type") == "url"
           else f"data:{source.get('media_type')};base64,{source.get('data')}")
    return {"type": "image_url", "image_url": {"url": url}}


def result_lines(record: dict, files: dict) -> Iterator[dict]:
    """The batch's results: its output and error files in Anthropic's shape, then a line for
    each request they do not list (canceled, or errored where the batch failed)."""
    listed: set[str] = set()
    for field_name in ("output_file_id", "error_file_id"):
        source = files.get(record.get(field_name) or "")
        if source is None:
            continue
        with open(source["_path"], "rb") as handle:
            for raw in handle:
                if raw.strip():
                    line = json.loads(raw)
                    listed.add(line["custom_id"])
                    yield {"custom_id": line["custom_id"], "result": _result(line)}
    if record["status"] not in ("cancelled", "failed"):
        return
    errors = (record.get("errors") or {}).get("data") or []
    reason = "; ".join(str(e.get("message")) for e in errors[:3]) or "the batch failed"
    source = files.get(record["input_file_id"])
    with open(Path(source["_path"]), "rb") as handle:
        for raw in handle:
            if raw.strip():
                custom = json.loads(raw)["custom_id"]
                if custom not in listed:
                    yield {"custom_id": custom, "result": (
                        {"type": "canceled"} if record["status"] == "cancelled" else
                        {"type": "errored", "error": error_envelope(400, reason)})}


def _result(line: dict) -> dict:
    response = line.get("response")
    if response is None:  # (the runner's batch_expired lines)
        return {"type": "expired"}
    status, body = response["status_code"], response.get("body") or {}
    if status != 200:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(body)
        return {"type": "errored", "error": error_envelope(status, str(message))}
    return {"type": "succeeded", "message": message_of(body)}


def message_of(completion: dict) -> dict:
    """A chat completion as the Message that answers the same request."""
    choice = (completion.get("choices") or [{}])[0]
    usage = completion.get("usage") or {}
    text = (choice.get("message") or {}).get("content") or ""
    return {"id": "msg_" + str(completion.get("id", uuid.uuid4().hex)).removeprefix("chatcmpl-"),
            "type": "message", "role": "assistant", "model": completion.get("model"),
            "content": [{"type": "text", "text": text}],
            "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def _processing_status(record: dict) -> str:
    status = record["status"]
    if status == "cancelling":
        return "canceling"
    return "in_progress" if status in CANCELLABLE else "ended"


def _ours(record: dict) -> bool:
    return "anthropic" in record["_sim"]


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


__all__ = ["MAX_BODY_BYTES", "AnthropicBatches", "chat_body", "message_of", "result_lines"]
