"""The aggregate AI functions, ``ai_agg`` and ``ai_summarize_agg``, defined once for every engine.

Snowflake's ``AI_AGG(expr, instruction)`` and ``AI_SUMMARIZE_AGG(expr)``: one answer for the
rows of each group (``GROUP BY``; the whole table without one), however many they are. They
are reduced hierarchically by :mod:`dagster_batchllm.semantic.reduce` through the same client
as every other function (pool, ledger), so a rerun sends nothing and a grown group re-sends
only its changed chunks. NULL and blank values are left out, as SQL aggregates leave out
NULL; a group of none is NULL. Each also takes an optional ``endpoint`` (the model) after its
arguments, by position on every engine; without one, the default model. Every request asks for
the settings' ``default_max_tokens`` of reply.

A group that cannot be answered (a row too long for one request, a failed request) fails the
query, as the other AI functions' failed requests do, with the reason; answered chunks stay in
the ledger, so a rerun sends only what failed.

Example::

    >>> AGGREGATES["ai_summarize_agg"].instruction_of(None)[:24]
    'Summarize the rows in on'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import InferenceConfigError
from .aggregate_prompts import SUMMARY_INSTRUCTION


@dataclass(frozen=True)
class AggregateFunction:
    name: str
    #: The SQL parameters in order: the text, then (ai_agg) the instruction, then the endpoint.
    params: tuple[str, ...]
    summary: str

    @property
    def takes_instruction(self) -> bool:
        return "instruction" in self.params

    def instruction_of(self, given: Any) -> str:
        """The instruction a group is answered with; ai_agg's must be a non-empty text."""
        if not self.takes_instruction:
            return SUMMARY_INSTRUCTION
        if not isinstance(given, str) or not given.strip():
            raise InferenceConfigError(
                f"{self.name}: argument 'instruction' must be a non-empty STRING, such as "
                f"'What do these customers complain about most?'; got {given!r}. "
                f"Signature: {self.signature()}.")
        return given

    def signature(self) -> str:
        shown = (p if p != "endpoint" else "[endpoint]" for p in self.params)
        return f"{self.name}({', '.join(shown)})"


AI_AGG = AggregateFunction("ai_agg", ("expr", "instruction", "endpoint"),
                           "One answer to the instruction over the group's texts.")
AI_SUMMARIZE_AGG = AggregateFunction("ai_summarize_agg", ("expr", "endpoint"),
                                     "One summary of the group's texts.")
AGGREGATES: dict[str, AggregateFunction] = {f.name: f for f in (AI_AGG, AI_SUMMARIZE_AGG)}


def one_instruction(function: AggregateFunction, lowest: Any, highest: Any) -> str:
    """A group's instruction, from its least and greatest value: they must be the same (an
    aggregate answers one instruction per group; a constant, as a rule)."""
    if function.takes_instruction and lowest != highest:
        raise InferenceConfigError(
            f"{function.name}: the instruction differs between rows of one group ({lowest!r} "
            f"and {highest!r}); pass one instruction per group (a constant, as a rule).")
    return function.instruction_of(lowest)


def group_failure(function: AggregateFunction, errors: list[str], groups: int) -> Exception:
    """The error a query fails with when groups of an aggregate could not be answered."""
    from .outcomes import AIQueryError

    return AIQueryError(
        f"{function.name} failed for {len(errors)} of the {groups} groups it was asked for; "
        f"first error: {errors[0].rstrip('.')}. {function.name} has no failOnError argument: "
        "a group that cannot be answered fails the query. Answered chunks are kept in the "
        "ledger, so a rerun sends only what failed.")
