"""A request and its completion as every layer sees them: a request's key, body and token
bounds; a completion's text and the server's figures.

The leaf the layers share: tasks make requests, the run budgets and claims them by key,
deliveries send their bodies. A body is serialized once, canonically (sorted keys, no
whitespace); that byte string is both what the server receives and, hashed, the request key,
so the key covers exactly what the server sees. :func:`keyed_request` is the one way a job
makes a request from a body, whatever the job.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError, RowError

# Reservations must never be below what the server will count. Byte-level BPE and SentencePiece
# with byte fallback emit at most one token per UTF-8 byte, plus a few chat-template tokens per
# message; so this bound holds for every tokenizer we know of, at the price of over-reserving
# while a request is in flight (the reservation is settled to the reply's usage afterwards).
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_PER_REQUEST = 8
# For dry runs and cost estimates: the usual ~4 characters per token of English text.
TYPICAL_CHARS_PER_TOKEN = 4
# A request's prefix key hashes this many leading bytes of its body (see prefix_key).
PREFIX_KEY_BYTES = 1024
# The canonical form of a request body (its key is the hash of these bytes). One encoder for
# every request: json.dumps with options builds a new one per call.
CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                             allow_nan=False)


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 2.5x, and one is made per row
class RowRequest:
    """One rendered request: its key, its body and what the budget needs to know. Treated
    as a value: nothing changes one once made. Jobs make them with :func:`keyed_request`."""

    key: str
    model: str
    body: bytes
    reserve_tokens: int
    typical_prompt_tokens: int
    max_tokens: int
    #: What a task that does not send ``body`` as it is needs of the row (an in-process model's
    #: feature values, an embedding input's text); None for a chat request.
    payload: Any = None
    #: Requests with equal keys share a long head (see :func:`prefix_key`): the pool sends
    #: them where the last one went, whose prefix cache holds it. None: no such head.
    prefix_key: int | None = None


@dataclass(slots=True)
class Completion:
    content: str
    prompt_tokens: int
    completion_tokens: int
    usage_reported: bool
    finish_reason: str | None
    latency_s: float
    #: The parsed reply, where a task reads more than the text (a grouped request's items).
    payload: Any = None
    #: Of ``prompt_tokens``, those the server answered from its prefix cache (OpenAI's and
    #: vLLM's ``usage.prompt_tokens_details.cached_tokens``; 0 where the reply says none):
    #: they cost the cached price.
    cached_tokens: int = 0
    #: What the server reported where its usage was no count or past the request's bound (the
    #: figures above are then corrected: see :mod:`dagster_batchllm.core.usage`); None: taken
    #: as reported.
    usage_corrected: str | None = None


def encode_body(payload: dict[str, Any]) -> bytes:
    """``payload`` in the canonical form; a row's error where it cannot be one."""
    try:
        return CANONICAL.encode(payload).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"the prompt is not valid Unicode text ({exc.reason})") from None
    except (ValueError, TypeError) as exc:  # NaN, or a cell object JSON cannot hold
        raise InvalidInputError(f"the request cannot be encoded as JSON ({exc})") from None


def keyed_request(model: str, body: bytes, texts: Sequence[str], max_tokens: int, *,
                  extra_prompt_tokens: int = 0, payload: Any = None) -> RowRequest:
    """The request that sends ``body``: keyed by its hash, its reservation bounded from above
    by the prompt's ``texts`` (one token per UTF-8 byte, plus the template's tokens per text)
    and ``max_tokens``. ``extra_prompt_tokens``: what the server counts beyond the texts (an
    image's tokens); ``payload``: what the job keeps of the row beside the body."""
    chars = content_bytes = 0
    for text in texts:
        chars += len(text)
        # Bytes as UTF-8, without encoding: an ASCII text has as many as it has characters.
        content_bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
    n = len(texts)
    upper = (content_bytes + extra_prompt_tokens + TEMPLATE_TOKENS_PER_MESSAGE * n
             + TEMPLATE_TOKENS_PER_REQUEST)
    typical = math.ceil(chars / TYPICAL_CHARS_PER_TOKEN) + 4 * n + extra_prompt_tokens
    # key, model, body, reserve_tokens, typical_prompt_tokens, max_tokens (positional: one per
    # row, and keywords cost a fifth of it)
    return RowRequest(hashlib.sha256(body).hexdigest(), model, body, upper + max_tokens,
                      typical, max_tokens, payload)


def prefix_key(body: bytes) -> int | None:
    """The prefix key of a request body: a hash of its first ``PREFIX_KEY_BYTES`` (1,024)
    bytes, None for a body no longer than that (a short prompt gains little from a cache).

    In the canonical body (sorted keys) those bytes are the few parameters that sort before
    ``messages`` and then the messages' text from the first on: about 250 tokens of the system
    message and the prompt. Rows that share an instruction of that length share the key, and
    those that differ in it get different keys. Python's ``hash``: the key only routes within
    this process, and a hash of 1 KB costs well under a microsecond."""
    return hash(body[:PREFIX_KEY_BYTES]) if len(body) > PREFIX_KEY_BYTES else None


def distinct_requests(items: Iterator[RowRequest | RowError],
                      usable: Callable[[RowRequest], bool] | None = None,
                      ) -> tuple[dict[str, RowRequest], int, int]:
    """What a dry run counts: the distinct requests by key (in order), the rows that cannot
    be sent (a row error, or not ``usable``), and the rows that repeat an earlier request."""
    distinct: dict[str, RowRequest] = {}
    invalid = duplicates = 0
    for item in items:
        if isinstance(item, RowError) or (usable is not None and not usable(item)):
            invalid += 1
        elif item.key in distinct:
            duplicates += 1
        else:
            distinct[item.key] = item
    return distinct, invalid, duplicates
