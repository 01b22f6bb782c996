"""A server's token counts, checked before anything trusts them.

A reply's ``usage`` is what the run charges the budget, prices each row at and writes to the
ledger, and it comes from a server the user may not control. Two steps keep a wrong figure
from doing harm:

* **Reading** (:func:`reported_usage`, where a reply's ``usage`` is parsed, with no request in
  hand): a figure that is no token count (negative, fractional, not a number) or above
  :data:`TOKEN_CEILING` reads as :data:`TOKEN_CEILING`, and the reply is flagged with what the
  server said. So no figure ever passes a database's integer column, nor goes negative.
* **Holding to the request's bound** (:func:`hold_to_bound`, where the reply meets its
  request): prompt tokens at most the prompt's strict bound (one token per UTF-8 byte plus the
  chat template's, what the budget reserved), completion tokens at most ``max_tokens``, cached
  tokens at most the prompt tokens. A flagged figure (the ceiling) so becomes the bound: the
  budget is charged the worst case, never less than the server may bill, never more than it
  reserved, and a cost is never negative.

Both steps are idempotent: a reply may pass either more than once (the online delivery holds
it to its bound for the rate limits, the run again for the budget and the ledger).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .requests import Completion, RowRequest

#: The most tokens one figure of one reply is read as: PostgreSQL's INTEGER (what the batch
#: book's columns are), far above any context window. A figure above it, negative or no count
#: at all reads as this, and is then held to its request's bound.
TOKEN_CEILING = 2**31 - 1
#: How long the note of what a server reported may get (it is kept on the ledger's row).
_NOTE_CHARS = 200
_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens")


class ReportedUsage(NamedTuple):
    """A reply's usage as read: its figures (0 where it reported none), whether it reported
    any, and what it reported where a figure had to be corrected (None: all were counts)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reported: bool
    corrected: str | None


_NOT_REPORTED = ReportedUsage(0, 0, 0, False, None)


def reported_usage(usage: Any) -> ReportedUsage:
    """A reply's OpenAI-style ``usage`` object read (``prompt_tokens``, ``completion_tokens``,
    ``prompt_tokens_details.cached_tokens``). No usage, or no ``prompt_tokens`` in it, is not
    reported (the budget then charges the request's bound); a missing ``completion_tokens``
    or cached count is 0, as servers without them mean."""
    if type(usage) is not dict:
        return _NOT_REPORTED
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        return _NOT_REPORTED
    completion = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    # One lookup where the server reports no details (most do not); "null" is none too.
    cached = details.get("cached_tokens") if type(details) is dict else None
    if (type(prompt) is int and 0 <= prompt <= TOKEN_CEILING
            and (completion is None or type(completion) is int
                 and 0 <= completion <= TOKEN_CEILING)
            and (cached is None or type(cached) is int and 0 <= cached <= TOKEN_CEILING)):
        return ReportedUsage(prompt, completion or 0, cached or 0, True, None)
    return _corrected(prompt, completion, cached)


def _corrected(prompt: Any, completion: Any, cached: Any) -> ReportedUsage:
    """:func:`reported_usage` where some figure is not a plain count in range: each read by
    :func:`token_figure` (a cached count that is none reads as 0: the prompt is then priced
    uncached), the reply flagged unless every figure was a whole number in range after all
    (``12.0``)."""
    figures = [token_figure(prompt), 0 if completion is None else token_figure(completion),
               0 if cached is None else token_figure(cached, default=0)]
    if cached is not None and figures[2] == 0 and cached != 0:
        wrong = True
    else:
        wrong = any(figure == TOKEN_CEILING for figure in figures)
    note = None
    if wrong:
        note = ", ".join(f"{name}={figure_in_words(value)}" for name, value in zip(
            _FIELDS, (prompt, completion, cached), strict=True)
            if value is not None)[:_NOTE_CHARS]
    return ReportedUsage(*figures, True, note)


def token_figure(value: Any, *, default: int = TOKEN_CEILING) -> int:
    """One figure of a server's usage as a token count: a whole number from 0 to
    :data:`TOKEN_CEILING` (``12.0`` is 12), else ``default`` (the ceiling: the request's
    bound, once held to it). ``True`` is no count."""
    if type(value) is int:
        return value if 0 <= value <= TOKEN_CEILING else default
    if type(value) is float and math.isfinite(value) and value.is_integer() \
            and 0 <= value <= TOKEN_CEILING:
        return int(value)
    return default


def figure_in_words(value: Any) -> str:
    """What a server reported as a figure, in words: a number as it is (at most 40
    characters), anything else by its kind only (a server's text is not kept)."""
    if type(value) in (int, float):
        text = repr(value)
        return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"
    return f"({type(value).__name__}, not a number)"


def prompt_bound(request: RowRequest) -> int:
    """The most prompt tokens ``request`` can be counted: the strict bound its reservation
    holds (``reserve_tokens`` less ``max_tokens``)."""
    return max(0, request.reserve_tokens - request.max_tokens)


def within_bound(completion: Completion, request: RowRequest) -> bool:
    """Whether ``completion``'s figures are within ``request``'s bound (the usual case: one
    look, no call, on the run's hot path)."""
    max_tokens = request.max_tokens
    prompt = completion.prompt_tokens
    return (0 <= completion.completion_tokens <= max_tokens
            and 0 <= prompt <= request.reserve_tokens - max_tokens
            and 0 <= completion.cached_tokens <= prompt)


def hold_to_bound(completion: Completion, request: RowRequest) -> bool:
    """Hold ``completion``'s figures to ``request``'s bound, in place: prompt tokens to the
    prompt's strict bound, completion tokens to ``max_tokens`` (a negative figure to the bound
    too: the worst case), cached tokens to the prompt tokens. Sets ``usage_corrected`` to what
    the server reported where it was not set yet; returns whether the reply's usage was
    corrected (now or before)."""
    if within_bound(completion, request):
        return completion.usage_corrected is not None
    prompt_most, completion_most = prompt_bound(request), request.max_tokens
    reported = (completion.prompt_tokens, completion.completion_tokens,
                completion.cached_tokens)
    prompt, completed, cached = reported
    prompt = prompt if 0 <= prompt <= prompt_most else prompt_most
    completed = completed if 0 <= completed <= completion_most else completion_most
    cached = cached if 0 <= cached <= prompt else (prompt if cached > 0 else 0)
    completion.prompt_tokens, completion.completion_tokens = prompt, completed
    completion.cached_tokens = cached
    if completion.usage_corrected is None:
        # (a figure at the ceiling was read as no count: a batch line's, whose words are gone)
        said = [f"{name}={'not a count' if value >= TOKEN_CEILING else value}"
                for name, value in zip(_FIELDS, reported, strict=True)]
        completion.usage_corrected = ", ".join(said if reported[2] else said[:2])
    return True


def correction_warning(endpoint: str | None, completion: Completion,
                       request: RowRequest) -> str:
    """The log line of a run's first corrected reply: the endpoint, what it reported, what
    was counted instead."""
    return (f"batchllm: endpoint '{endpoint}' reported usage {completion.usage_corrected} for "
            f"a request of at most {prompt_bound(request):,} prompt and "
            f"{request.max_tokens:,} completion tokens (negative, not a whole number, or past "
            f"that bound); counted as {completion.prompt_tokens:,} prompt and "
            f"{completion.completion_tokens:,} completion tokens, the bound the budget "
            "reserved. Further corrections in this call are counted in "
            "stats.usage_corrected and on each ledger row (usage_corrected), not logged.")


__all__ = ["TOKEN_CEILING", "ReportedUsage", "correction_warning", "hold_to_bound",
           "prompt_bound", "reported_usage", "token_figure", "within_bound"]
