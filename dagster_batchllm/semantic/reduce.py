"""Hierarchical reduction: one answer per group, however many rows it has, never truncated.

Each group's rows are cut into chunks that fit the model's context with the instruction and
``max_tokens`` (:mod:`.chunking`); each chunk is one request whose reply is a partial answer;
a level's partial answers are cut and asked again, level by level, until a group has one.
Every level is one ordinary ``infer`` call per instruction, over the chunks of every group at
that level: the pool, limits, retries, ledger and budgets see plain rows, so a rerun is
answered from the ledger (nothing sent) and a grown group sends only its changed chunks and
the levels above them.

A group fails as a whole, with the reason: a row too long to fit a request on its own (never
cut), a chunk's request that failed (its error, and at which level), partial answers too long
to combine, or the budget running out (deferred: a rerun continues from the ledger).

Token counts are the estimate the core uses for prompts (4 characters a token, a few per
message: ``RowRequest.typical_prompt_tokens``, which the online delivery checks against each
endpoint's ``max_context_tokens``); a chunk fills at most ``CONTEXT_SHARE`` of what the context
leaves after ``max_tokens``, so a tokenizer that counts a little more still fits.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..ai_functions.aggregate_prompts import (
    PARTIALS,
    ROWS,
    header_chars,
    system_message,
    user_message,
)
from ..ai_functions.chunking import cut_chunks, item_cost
from ..core import (
    ContextLengthExceededError,
    InferenceConfigError,
    InferenceStats,
    literal_template,
)

# When no endpoint serving the model says its context (Endpoint(max_context_tokens=...)) and
# the call gives none (context_tokens=): a context every current chat model has.
DEFAULT_CONTEXT_TOKENS = 8192
# Of the tokens the context leaves after max_tokens, the share a chunk's prompt may fill.
CONTEXT_SHARE = 0.9
# The core's estimate of a prompt (core/run/prompts.py): characters a token, tokens a message.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


@dataclass
class GroupInput:
    """One group to reduce: its instruction and texts (NULLs already left out), or the
    reason it cannot be (then nothing is sent for it)."""

    instruction: str
    texts: list[str]
    error: str | None = None
    #: The texts are in an order of the caller's (kept, partial answers too), not to be sorted.
    ordered: bool = False


@dataclass(frozen=True)
class ReduceOptions:
    """What every level's requests share (checked by :func:`reduce_options`)."""

    model: str
    max_tokens: int
    context_tokens: int
    temperature: float | None = None
    token_budget: int | None = None
    budget_usd: float | None = None
    scope: str = ""
    partition_key: str = ""
    run_id: str | None = None
    logger: Any = None
    #: "online", or "batch_api": each level one provider batch (waited for), at its price.
    mode: str = "online"

    def room_chars(self, instruction: str, kind: str) -> int:
        """Characters of item lines one request of ``kind`` may hold."""
        prompt_tokens = math.floor((self.context_tokens - self.max_tokens) * CONTEXT_SHARE)
        prompt_tokens -= 2 * TOKENS_PER_MESSAGE  # the system and the user message
        return (prompt_tokens * CHARS_PER_TOKEN - len(system_message(instruction, kind))
                - header_chars(kind))


@dataclass
class ReduceFigures:
    """What a reduction did, per level (level 1 first)."""

    groups: int = 0
    #: Requests each level asked for (every group's chunks), answered from the ledger or sent.
    requests_per_level: list[int] = field(default_factory=list)
    #: Of those, the ones sent to an endpoint (0 everywhere on a rerun).
    sent_per_level: list[int] = field(default_factory=list)
    #: Rows in each level-1 request.
    rows_per_level1_request: list[int] = field(default_factory=list)
    stats_per_level: list[InferenceStats] = field(default_factory=list)

    @property
    def levels(self) -> int:
        return len(self.requests_per_level)

    @property
    def requests_sent(self) -> int:
        return sum(self.sent_per_level)

    @property
    def stats(self) -> InferenceStats:
        """Every level's figures added up."""
        return add_stats(self.stats_per_level)

    def summary(self) -> str:
        rows = self.rows_per_level1_request
        spread = f", {min(rows)}-{max(rows)} rows a level-1 request" if rows else ""
        groups = f"{self.groups} group" + ("" if self.groups == 1 else "s")
        return (f"{groups}, {self.levels} levels; requests per level "
                f"{self.requests_per_level}, sent {self.sent_per_level}{spread}")


def reduce_options(settings: Any, *, model: str | None, max_tokens: Any = None,
                   context_tokens: Any = None, instructions: Sequence[str] = (),
                   **fields: Any) -> ReduceOptions:
    """The options checked against the settings: the model served, max_tokens and the context
    leaving room for two partial answers with each instruction. Raises InferenceConfigError
    (before anything is sent), saying what to change."""
    from ..core import checked_param

    model = model if model is not None else settings.model_when_unnamed
    if model is None:
        raise InferenceConfigError(
            "aggregate: pass model= (several chat models are served and no default_model is "
            f"set); served: {sorted(settings.models)}.")
    if model not in settings.models:
        raise InferenceConfigError(
            f"aggregate: no configured endpoint serves chat model '{model}'; served: "
            f"{sorted(settings.models)}.")
    max_tokens = checked_param("max_tokens", max_tokens if max_tokens is not None
                               else settings.default_max_tokens)
    if fields.get("mode", "online") not in ("online", "batch_api"):
        raise InferenceConfigError(
            f"aggregate: mode must be 'online' or 'batch_api', got {fields['mode']!r}.")
    if fields.get("temperature") is not None:
        fields["temperature"] = checked_param("temperature", fields["temperature"])
    options = ReduceOptions(model=model, max_tokens=max_tokens,
                            context_tokens=_context(settings, model, context_tokens), **fields)
    partial = CHARS_PER_TOKEN * max_tokens + 3  # the longest reply as a line: quotes, newline
    for instruction in dict.fromkeys(instructions):
        room = options.room_chars(instruction, PARTIALS)
        if room < 2 * partial:
            raise InferenceConfigError(
                f"aggregate: the {options.context_tokens}-token context of '{model}' leaves no "
                f"room to combine two partial answers of max_tokens={max_tokens} with the "
                f"instruction ({len(instruction)} characters): lower max_tokens, shorten the "
                "instruction, or pass context_tokens= (the model's real context; it defaults to "
                "the endpoints' max_context_tokens, else "
                f"{DEFAULT_CONTEXT_TOKENS}).")
    return options


def _context(settings: Any, model: str, context_tokens: Any) -> int:
    if context_tokens is not None:
        if (isinstance(context_tokens, bool) or not isinstance(context_tokens, numbers.Integral)
                or context_tokens < 1):
            raise InferenceConfigError(
                f"aggregate: context_tokens must be a positive whole number, got "
                f"{context_tokens!r}.")
        return int(context_tokens)
    # The smallest context of the endpoints serving the model: any of them may take a request.
    windows = [e.max_context_tokens for e in settings.endpoints
               if model in e.models and e.max_context_tokens]
    return min(windows) if windows else DEFAULT_CONTEXT_TOKENS


@dataclass
class _Group:
    instruction: str
    items: list[str]
    ordered: bool = False
    answer: str | None = None
    error: str | None = None
    done: bool = False


async def reduce_groups(client: Any, groups: Sequence[GroupInput], options: ReduceOptions
                        ) -> tuple[list[tuple[str | None, str | None]], ReduceFigures]:
    """Each group's (answer, error) in order, and the figures. A group without texts is
    (None, None): an aggregate over no rows is NULL."""
    state = [_Group(g.instruction, list(g.texts), g.ordered, error=g.error,
                    done=g.error is not None or not g.texts) for g in groups]
    for group in state:
        if not group.done:
            _check_rows(group, options)
    figures = ReduceFigures(groups=len(state))
    spent_tokens, spent_usd = 0, 0.0
    while active := [g for g in state if not g.done]:
        kind = ROWS if not figures.requests_per_level else PARTIALS
        asked: dict[str, list[tuple[_Group, list[str]]]] = {}
        for group in active:
            room = options.room_chars(group.instruction, kind)
            if kind == PARTIALS and any(item_cost(i) > room for i in group.items):
                group.error, group.done = _too_long_partials(options), True
                continue
            system = system_message(group.instruction, kind)
            asked.setdefault(system, []).extend(
                (group, chunk) for chunk in cut_chunks(group.items, room,
                                                       in_given_order=group.ordered))
        if not asked:
            break
        batches = [(system, [user_message(kind, c) for _, c in chunks])
                   for system, chunks in asked.items()]
        if options.token_budget is not None or options.budget_usd is not None:
            # One call at a time, each within what the calls before it left of the budget.
            answered = []
            for system, prompts in batches:
                answered.append(await _ask(client, system, prompts, options,
                                           spent_tokens, spent_usd))
                stats = answered[-1][2]
                spent_tokens += stats.prompt_tokens + stats.completion_tokens
                spent_usd += stats.cost_usd or 0.0
        else:
            answered = list(await asyncio.gather(*(
                _ask(client, system, prompts, options, 0, 0.0) for system, prompts in batches)))
        _settle_level(asked, answered, kind, figures)
    return [(g.answer, g.error) for g in state], figures


def _check_rows(group: _Group, options: ReduceOptions) -> None:
    """A row that does not fit a level-1 request alone fails its group: it is never cut."""
    room = options.room_chars(group.instruction, ROWS)
    for text in group.items:
        if item_cost(text) > room:
            group.error = ContextLengthExceededError(
                f"a row of this group ({len(text):,} characters, ~{len(text) // 4:,} tokens, "
                f"starting {text[:40]!r}) does not fit in one request to "
                f"'{options.model}' with the instruction and max_tokens={options.max_tokens} "
                f"(a {options.context_tokens}-token context; a request holds at most "
                f"{room:,} characters of rows). Rows are never cut: shorten that row, or use "
                "a model with a longer context (context_tokens=).").as_cell()
            group.done = True
            return


def _too_long_partials(options: ReduceOptions) -> str:
    return ContextLengthExceededError(
        f"the partial answers of this group are too long to combine within the "
        f"{options.context_tokens}-token context of '{options.model}' (a reply may be longer "
        "than 4 characters a token); lower max_tokens").as_cell()


def _settle_level(asked: dict[str, list[tuple[_Group, list[str]]]], answered: list,
                  kind: str, figures: ReduceFigures) -> None:
    level = len(figures.requests_per_level) + 1
    replies: dict[int, list[str]] = {}
    requests = 0
    for (_system, chunks), (values, errors, _stats) in zip(asked.items(), answered,
                                                           strict=True):
        requests += len(chunks)
        for (group, chunk), value, error in zip(chunks, values, errors, strict=True):
            if kind == ROWS:
                figures.rows_per_level1_request.append(len(chunk))
            if group.done:
                continue
            if error is not None:
                group.error = (f"{error} (a level-{level} request of this group, over "
                               f"{len(chunk)} {'rows' if kind == ROWS else 'partial answers'})")
                group.done = True
                continue
            replies.setdefault(id(group), []).append("" if value is None else str(value))
    stats = add_stats([a[2] for a in answered])
    figures.requests_per_level.append(requests)
    figures.sent_per_level.append(stats.requests)
    figures.stats_per_level.append(stats)
    for chunks in asked.values():
        for group, _ in chunks:
            if group.done or id(group) not in replies:
                continue
            parts = replies.pop(id(group))
            if len(parts) == 1:
                group.answer, group.done = parts[0], True
            else:
                group.items = parts


async def _ask(client: Any, system: str, prompts: list[str], options: ReduceOptions,
               spent_tokens: int, spent_usd: float) -> tuple[list, list, InferenceStats]:
    """One level's requests with one instruction: an ordinary infer() call, one row each."""
    budget = (None if options.token_budget is None
              else max(0, options.token_budget - spent_tokens))
    budget_usd = (None if options.budget_usd is None
                  else max(0.0, options.budget_usd - spent_usd))
    params = {} if options.temperature is None else {"temperature": options.temperature}
    result = await client.ainfer(
        pd.DataFrame({"prompt": prompts}), prompt_column="prompt",
        system=literal_template(system), model=options.model, output_column="answer",
        error_column="error", max_tokens=options.max_tokens, token_budget=budget,
        budget_usd=budget_usd, scope=options.scope, partition_key=options.partition_key,
        run_id=options.run_id, logger=options.logger, mode=options.mode, wait=True, **params)
    return result.df["answer"].tolist(), result.df["error"].tolist(), result.stats


def add_stats(parts: Sequence[InferenceStats]) -> InferenceStats:
    """Figures of several calls added up (latency percentiles are not kept)."""
    total = InferenceStats(mode=parts[0].mode if parts else "online")
    for stats in parts:
        total.add(stats)
    return total
