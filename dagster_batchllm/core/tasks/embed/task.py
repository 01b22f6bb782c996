"""Embeddings: each row's text becomes one float32 vector, many inputs per ``/embeddings`` request.

:class:`EmbedTask` is a :class:`~.tasks.base.Task` and a :class:`~.grouping.GroupedTask`: the engine
keys, deduplicates, looks up, budgets and records every input on its own, and the grouping
delivery puts up to ``inputs_per_request`` of them in one request (a request refused because
of one input is split until only that input fails).

A request key is the SHA-256 of (model, dimensions, stored encoding, text): the same text is
embedded once per model and size, whichever table, template or run it comes from. Requests ask
for ``encoding_format="base64"`` (OpenAI, vLLM and TEI support it): the little-endian float32
bytes, base64-encoded. That string is what the ledger keeps for the input, as it came (no
re-encoding; 4/3 of the raw bytes, not JSON numbers), and what :meth:`EmbedTask.value` decodes
with numpy. A server that refuses base64 is asked for floats for the rest of the run (per
model), and its vectors are stored in the same form.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...delivery.base import DelegatingDelivery, Delivery
from ...delivery.batch_api.readers import register_line_reader
from ...delivery.grouping import GroupingDelivery
from ...delivery.transport import EMBEDDINGS_ROUTE, json_reply
from ...errors import (
    ContextLengthExceededError,
    EndpointError,
    ErrorType,
    InvalidInputError,
    MalformedResponseError,
    RowError,
)
from ...ledger.journal import JsonSafeText
from ...requests import Completion, RowRequest
from ...usage import reported_usage
from ..base import Task, register_task
from ..cells import cell_text
from ..chat.rendering import render_template
from .call import EmbedCall

# What one input adds to a request's token bound besides its bytes (a BOS/EOS pair or so).
_TOKENS_PER_INPUT = 4
_TYPICAL_CHARS_PER_TOKEN = 4
# The stored form of every vector; part of the key, so a change of form is a new key.
STORED_ENCODING = "float32-base64"
_STORED_DTYPE = np.dtype("<f4")


# A grouped reply settles a request's worth of rows at once: the writer's room (how many
# unwritten answers pause sending) holds what every request in flight may answer, or the workers
# would stall (and all wake) at each write. The journal keeps those answers safe from a kill
# meanwhile; 8,192 base64 vectors of 384 dimensions are ~20 MB.
_MAX_ROOM = 8192


@register_task(EmbedCall)
class EmbedTask(Task):
    """One vector per row, from ``/embeddings``; several rows per request."""

    route = EMBEDDINGS_ROUTE

    def __init__(self, call: EmbedCall):
        if call.model is None:
            raise ValueError("EmbedTask needs a bound call (its model filled in)")
        super().__init__(call)
        self.items_per_request = call.inputs_per_request
        self.max_request_tokens = call.max_request_tokens
        # The key's prefix: model, size and stored form as JSON (which escapes NULs), then NUL.
        self._key_prefix = ("embedding\x00" + json.dumps(
            [call.model, call.dimensions, STORED_ENCODING], separators=(",", ":"))
            + "\x00").encode("utf-8")
        self._float_models: set[str] = set()  # models whose endpoints refused base64
        self._sizes: dict[str, int] = {}  # model -> vector size seen first (no dimensions=)
        self._arena = VectorArena()  # where the run's vectors live (see VectorArena)

    # -- rows into requests ------------------------------------------------------------------
    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        call = self.call
        columns = call.input_columns()
        position = {c: i for i, c in enumerate(columns)}
        template, as_text = call.input, call.cells_as_text
        column = call.input_column
        model, prefix, sha256 = call.model, self._key_prefix, hashlib.sha256
        limit = call.max_input_tokens
        for row in rows:
            try:
                if template is not None:
                    text = render_template(template, columns, row, position, as_text)
                else:
                    text = cell_text(row[0], column, as_text)
                try:
                    data = text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InvalidInputError(
                        f"the input is not valid Unicode text ({exc.reason})") from None
                typical = math.ceil(len(text) / _TYPICAL_CHARS_PER_TOKEN)
                if limit is not None and typical > limit:
                    raise ContextLengthExceededError(
                        f"the input (~{typical} tokens) is longer than max_input_tokens "
                        f"({limit}); shorten or split it")
                yield RowRequest(key=sha256(prefix + data).hexdigest(), model=model, body=b"",
                                 reserve_tokens=len(data) + _TOKENS_PER_INPUT,
                                 typical_prompt_tokens=typical, max_tokens=0, payload=text)
            except RowError as error:
                yield error

    def group_request(self, items: list[RowRequest]) -> RowRequest:
        model = items[0].model
        body: dict[str, Any] = {
            "model": model, "input": [item.payload for item in items],
            "encoding_format": "float" if model in self._float_models else "base64"}
        if self.call.dimensions is not None:
            body["dimensions"] = self.call.dimensions
        return RowRequest(
            key="", model=model,
            body=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
            reserve_tokens=sum(item.reserve_tokens for item in items),
            typical_prompt_tokens=sum(item.typical_prompt_tokens for item in items),
            max_tokens=0, payload=items)

    def deliver(self, delivery: Delivery) -> GroupingDelivery:
        return GroupingDelivery(FloatFallback(delivery, self), self)

    def batch_line(self, delivery: Delivery) -> Delivery:
        return OneInputPerLine(delivery, self)

    def route_models(self, settings: Any) -> frozenset[str]:
        return settings.embedding_models

    def run_settings(self, settings: Any, capacity: int) -> Any:
        in_flight = capacity * self.call.inputs_per_request
        room = max(settings.ledger_flush_rows, min(_MAX_ROOM, 2 * in_flight))
        return settings if room == settings.ledger_flush_rows else settings.replace(
            ledger_flush_rows=room)

    @property
    def label(self) -> str:
        return f"embeddings of '{self.call.model}'"

    # -- replies into vectors ----------------------------------------------------------------
    @staticmethod
    def parse_reply(raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
        """A 200 reply of ``/embeddings``: its vectors (base64 strings or lists of numbers) in
        input order, as the Completion's payload, and its usage."""
        payload = json_reply(raw, endpoint)
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            keys = sorted(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
            raise MalformedResponseError(
                f"endpoint '{endpoint}' answered 200 without a 'data' list of embeddings "
                f"(got {keys})")
        indexes = [d.get("index") for d in data]
        in_order = list(range(len(data)))
        # The indexes say the order; a server that sends none answers in input order.
        if indexes != in_order and indexes != [None] * len(data):
            if not all(type(i) is int for i in indexes) or sorted(indexes) != in_order:
                raise MalformedResponseError(
                    f"endpoint '{endpoint}' answered embeddings whose indexes are not "
                    f"0..{len(data) - 1}")
            data = sorted(data, key=lambda d: d["index"])
        usage = reported_usage(payload.get("usage"))
        return Completion(content="", prompt_tokens=usage.prompt_tokens, completion_tokens=0,
                          usage_reported=usage.reported, finish_reason=None,
                          latency_s=latency_s, payload=[d.get("embedding") for d in data],
                          usage_corrected=usage.corrected)

    def split_reply(self, reply: Completion, items: list[RowRequest]
                    ) -> list[Completion | RowError]:
        vectors = reply.payload
        if len(vectors) != len(items):
            raise MalformedResponseError(
                f"the reply holds {len(vectors)} vectors for {len(items)} inputs")
        shares = _token_shares(reply.prompt_tokens, [i.typical_prompt_tokens for i in items])
        expected = self.call.dimensions
        model = items[0].model
        parts: list[Completion | RowError] = []
        for vector, tokens in zip(vectors, shares, strict=True):
            try:
                content, size = _stored_form(vector)
                want = expected or self._sizes.setdefault(model, size)
                if size != want:
                    raise MalformedResponseError(
                        f"the vector has {size} components where "
                        + (f"dimensions={want} was asked for" if expected else
                           f"this model's other vectors have {want}"))
            except RowError as error:
                parts.append(error)
                continue
            parts.append(Completion(content=content, prompt_tokens=tokens, completion_tokens=0,
                                    usage_reported=reply.usage_reported, finish_reason=None,
                                    latency_s=reply.latency_s,
                                    usage_corrected=reply.usage_corrected))
        _decode_together([p for p in parts if not isinstance(p, RowError)], self._arena)
        return parts

    def value(self, content: str) -> np.ndarray:
        """The float32 vector of a stored (base64) form: its own, writable array."""
        try:
            raw = binascii.a2b_base64(content)  # base64.b64decode's own call, minus a copy
        except (binascii.Error, ValueError, TypeError):
            raise MalformedResponseError("the stored vector is not base64") from None
        if not raw or len(raw) % 4:
            raise MalformedResponseError(
                f"the vector is {len(raw)} bytes, not a whole number of float32 components")
        vector = np.frombuffer(raw, dtype=_STORED_DTYPE).astype(np.float32)  # the row's own copy
        if not np.isfinite(vector).all():
            raise MalformedResponseError("the vector holds NaN or infinite components")
        return vector

    def reply_value(self, completion: Completion, request: RowRequest) -> np.ndarray:
        if completion.payload is not None:  # decoded with the rest of its reply
            return completion.payload
        return self.value(completion.content)

    def use_floats(self, model: str) -> bool:
        """Ask for floats from now on for ``model``; False if it did already."""
        if model in self._float_models:
            return False
        self._float_models.add(model)
        return True


def read_embedding_line(payload: Any, *, endpoint: str, latency_s: float) -> Completion:
    """A batch line's ``/embeddings`` reply of one input (see :class:`OneInputPerLine`) read
    into what the ledger keeps for the row: its vector's stored form, and its usage."""
    reply = EmbedTask.parse_reply(json.dumps(payload).encode(), endpoint=endpoint,
                                  latency_s=latency_s)
    if len(reply.payload) != 1:
        raise MalformedResponseError(
            f"a batch line of one input was answered with {len(reply.payload)} vectors")
    content, _size = _stored_form(reply.payload[0])
    return Completion(content=content, prompt_tokens=reply.prompt_tokens, completion_tokens=0,
                      usage_reported=reply.usage_reported, finish_reason=None,
                      latency_s=latency_s, usage_corrected=reply.usage_corrected)


register_line_reader(EMBEDDINGS_ROUTE, read_embedding_line)


class OneInputPerLine(DelegatingDelivery):
    """Embeddings through a provider's batch API: each row's input is a line of its own (a
    line's answer is then the row's, keyed and kept as the row's request), its body the
    request of that one input."""

    def __init__(self, inner: Delivery, task: EmbedTask):
        super().__init__(inner)
        self.task = task

    @property
    def items_per_send(self) -> int:  # type: ignore[override]
        return self.inner.items_per_send

    async def send_many(self, requests: list[RowRequest], attempts: list[Any]
                        ) -> list[Completion | RowError]:
        group = self.task.group_request
        lines = [dataclasses.replace(request, body=group([request]).body) for request in requests]
        return await self.inner.send_many(lines, attempts)

    async def send(self, request: RowRequest, attempts: Any) -> Completion:
        return await Delivery.send(self, request, attempts)


class FloatFallback(DelegatingDelivery):
    """The delivery of one grouped request, asking again with ``encoding_format="float"``
    when an endpoint refuses base64 (rather than failing, or splitting, the group)."""

    def __init__(self, inner: Delivery, task: EmbedTask):
        super().__init__(inner)
        self.task = task

    async def send(self, request: RowRequest, attempts: Any) -> Completion:
        try:
            return await self.inner.send(request, attempts)
        except EndpointError as exc:
            if _too_many_inputs(exc) and len(request.payload) > 1:
                # The server takes fewer inputs per request (TEI's default is 32): later
                # groups are smaller, and this one is split (the grouping does that).
                self.task.items_per_request = min(self.task.items_per_request,
                                                  max(1, len(request.payload) // 2))
                raise
            if not _refuses_base64(exc, request):
                raise
            self.task.use_floats(request.model)
        return await self.inner.send(self.task.group_request(request.payload), attempts)


# How servers say a request holds more inputs than they take (the simulator, OpenAI's limit of
# 2048, TEI's client batch size).
_TOO_MANY_INPUTS = re.compile(r"too many inputs|batch size|must have less than|at most \d+ "
                              r"(?:inputs|elements)", re.I)


def _too_many_inputs(exc: EndpointError) -> bool:
    return exc.error_type == ErrorType.BAD_REQUEST and bool(_TOO_MANY_INPUTS.search(exc.message))


def _refuses_base64(exc: EndpointError, request: RowRequest) -> bool:
    if exc.error_type != ErrorType.BAD_REQUEST or b'"encoding_format":"base64"' not in request.body:
        return False
    message = exc.message.lower()
    return "base64" in message or "encoding_format" in message


def _stored_form(vector: Any) -> tuple[str, int]:
    """(what the ledger keeps: base64 of little-endian float32, number of components)."""
    if isinstance(vector, str):
        length = len(vector)
        padding = 2 if vector.endswith("==") else 1 if vector.endswith("=") else 0
        size_bytes = length // 4 * 3 - padding
        if length == 0 or length % 4 or size_bytes % 4:
            raise MalformedResponseError(
                f"the vector is not base64 of whole float32 components ({length} characters)")
        return vector, size_bytes // 4
    if isinstance(vector, list) and vector:
        try:
            array = np.asarray(vector, dtype="<f4")
        except (TypeError, ValueError):
            raise MalformedResponseError("the vector holds something other than numbers") from None
        if array.ndim != 1:
            raise MalformedResponseError("the vector is not a flat list of numbers")
        return base64.b64encode(array.tobytes()).decode("ascii"), array.size
    raise MalformedResponseError(
        f"the reply's embedding is {type(vector).__name__}, not a list of numbers or base64")


class VectorArena:
    """Blocks of float32 rows that a run's vectors are copied into, each row handed out as a
    writable view of its own (never shared with another row's).

    Vectors live as long as the result; the JSON text and records they are decoded from live
    a moment. Allocated one by one, a vector's 1.5 KB sits on the heap between short-lived
    strings, and the heap cannot give that memory back; a block of ``rows_per_block`` vectors
    is one allocation of megabytes, which the allocator maps on its own. Peak memory then
    grows by a vector and its view per row, not by that and the fragments around it."""

    def __init__(self, rows_per_block: int = 4096):
        self.rows_per_block = rows_per_block
        self._block: np.ndarray | None = None
        self._used = 0

    def take(self, rows: int, size: int) -> np.ndarray:
        """``rows`` fresh rows of ``size`` components (uninitialised)."""
        block = self._block
        if block is None or block.shape[1] != size or self._used + rows > len(block):
            block = self._block = np.empty((max(rows, self.rows_per_block), size), np.float32)
            self._used = 0
        start, self._used = self._used, self._used + rows
        return block[start:self._used]


def _decode_together(parts: list[Completion], arena: VectorArena) -> None:
    """Decode a reply's vectors in one go: one base64 decode, one copy into the run's arena,
    one finite check; each part's payload becomes its row there. Parts whose vector is not
    finite, and replies whose base64 has padding (which cannot be joined), are left to
    ``value``."""
    if len(parts) < 2 or any(p.content.endswith("=") for p in parts):
        return
    joined = "".join(p.content for p in parts)
    try:  # strict: only the base64 alphabet, so the texts need no escaping in the journal
        raw = binascii.a2b_base64(joined, strict_mode=True)
        safe = True
    except (binascii.Error, ValueError):
        try:
            raw = binascii.a2b_base64(joined)
        except (binascii.Error, ValueError):
            return  # value() says which vector is broken
        safe = False
    size = len(raw) // (4 * len(parts))
    if size * 4 * len(parts) != len(raw):
        return
    matrix = arena.take(len(parts), size)
    matrix[:] = np.frombuffer(raw, dtype=_STORED_DTYPE).reshape(len(parts), size)
    finite = np.isfinite(matrix).all(axis=1)
    for part, row, ok in zip(parts, matrix, finite, strict=True):
        if ok:
            part.payload = row
            if safe:
                part.content = JsonSafeText(part.content)


def _token_shares(total: int, weights: list[int]) -> list[int]:
    """``total`` split over the items in proportion to ``weights``, summing to ``total``."""
    weight_sum = sum(weights)
    if total <= 0 or weight_sum <= 0:
        return [0] * len(weights)
    shares = [total * w // weight_sum for w in weights]
    shares[-1] += total - sum(shares)
    return shares
