"""A group's texts cut into chunks that fit a model's context, with boundaries that stay put.

An aggregate's requests are keyed like any others (the hash of the body), so a rerun is free
only if it cuts the same chunks, and a grown group is cheap only if the new rows change few
chunks. So:

* **Order by content, not by arrival.** Items are sorted by a hash of their text: SQL engines
  and Spark hand a group's rows over in no fixed order, and the same rows must give the same
  chunks wherever they come from.
* **Content-defined boundaries.** An item starts a new chunk when a second hash of its text
  falls below ``cost / target`` (its share of a chunk's target size): the decision depends on
  that item alone, so a new row changes only the chunk it lands in (and, rarely, splits it),
  whatever else the group holds. Chunks come out about ``target`` characters long on average.
* **Or in the caller's order.** Rows given an order (``llm.aggregate(order_by=...)``, a
  timestamp say) keep it, and so do their partial answers: rows appended at the end then
  change only the last chunks of each level.
* **Never past the room.** A content-defined chunk larger than the room is cut greedily
  inside itself (a change there stays inside it too).
* **One request when all fits.** Items that fit one request together are one chunk (the
  last level), not cut at a boundary that would cost a level more.
* **Always progress.** Where every item would be its own chunk (few, large items: a level of
  partial answers), they are packed greedily instead, so each level has fewer items than the
  one before and the reduction ends.

An item's cost is the characters of its line in the request: its JSON string and a newline
(see :mod:`.aggregate_prompts`).

Example::

    >>> chunks = cut_chunks(["a", "b", "c"], room_chars=1000)
    >>> sorted(item for chunk in chunks for item in chunk)
    ['a', 'b', 'c']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

# A chunk's target size as a share of the room: boundaries fall on average this far apart, so
# most content-defined chunks fit whole (a larger one is cut inside itself).
TARGET_SHARE = 0.5
_UNIT = float(1 << 64)


def item_line(text: str) -> str:
    """How an item is written in a request: one JSON string (no raw newline in it)."""
    return json.dumps(text, ensure_ascii=False)


def item_cost(text: str) -> int:
    """The characters an item takes in a request: its line and the newline before it."""
    return len(item_line(text)) + 1


def content_order(texts: Sequence[str]) -> list[str]:
    """The texts sorted by a hash of their content (ties, equal texts, are equal anyway)."""
    return sorted(texts, key=_order_key)


def cut_chunks(texts: Sequence[str], room_chars: int, *, in_given_order: bool = False
               ) -> list[list[str]]:
    """``texts`` in content order (``in_given_order``: as given, for rows the caller ordered
    itself), cut into chunks of at most ``room_chars`` characters of item lines each. Every
    item must fit alone (the caller checks: one that does not is that group's error, never
    cut)."""
    ordered = list(texts) if in_given_order else content_order(texts)
    if not ordered:
        return []
    if sum(item_cost(t) for t in ordered) <= room_chars:  # all in one request: the last level
        return [ordered]
    target = max(1.0, room_chars * TARGET_SHARE)
    spans: list[list[str]] = []
    for text in ordered:
        if not spans or _starts_chunk(text, item_cost(text) / target):
            spans.append([text])
        else:
            spans[-1].append(text)
    chunks = [chunk for span in spans for chunk in _greedy(span, room_chars)]
    if len(chunks) >= len(ordered) > 1:  # no item shares a chunk: no progress, so pack them
        chunks = _greedy(ordered, room_chars)
    return chunks


def _greedy(items: list[str], room_chars: int) -> list[list[str]]:
    """Items in their order, each chunk filled until the next one would pass the room."""
    chunks: list[list[str]] = []
    used = 0
    for text in items:
        cost = item_cost(text)
        if chunks and used + cost <= room_chars:
            chunks[-1].append(text)
            used += cost
        else:
            chunks.append([text])
            used = cost
    return chunks


def _order_key(text: str) -> tuple[bytes, str]:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), text


def _starts_chunk(text: str, probability: float) -> bool:
    """Whether ``text`` opens a chunk: a hash of it (not the ordering one, whose values rise
    along the order) below ``probability``."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                             person=b"batchllm-cut").digest()
    return int.from_bytes(digest, "big") / _UNIT < probability
