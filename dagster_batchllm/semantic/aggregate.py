"""``llm.aggregate(df, instruction=..., column=..., by=[...])``: one answer per group of rows.

Snowflake's ``AI_AGG`` and BigQuery's ``AI.AGG`` as a DataFrame call: the rows of each group
(every row when ``by`` is empty) are answered together, however many they are: a group larger
than the model's context is reduced hierarchically (:mod:`.reduce`), never truncated, and every
request goes through the client's pool, ledger and budgets like any row (a rerun sends
nothing; a grown group re-sends only its changed chunks).

NULL and blank cells are left out, as SQL aggregates leave out NULLs; a group with no text
left gets NULL and no error. Failures are data: a group that cannot be answered gets NULL and
``<output>_error`` says why (a row too long for one request, a failed request, the budget).

Example::

    result = llm.aggregate(tickets, instruction="What do these customers complain about most?",
                           column="body", by=["product"], model="llama-70b", max_tokens=200)
    result.df            # product, answer, answer_error: one row per product
    result.figures.summary()   # groups, levels, requests per level (sent, from the ledger)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..core import InferenceConfigError, InferenceStats, RowError, cell_text, validate_identifier
from .reduce import GroupInput, ReduceFigures, reduce_groups, reduce_options


@dataclass
class AggregateResult:
    """``df``: one row per group (the ``by`` columns, in their sorted order, NULL keys as a
    group of their own), the answer and its error; ``figures``: levels, requests per level
    (asked, and sent), rows per level-1 request, each level's stats."""

    df: pd.DataFrame
    figures: ReduceFigures
    output_column: str
    error_column: str

    @property
    def stats(self) -> InferenceStats:
        """Every level's figures added up (``requests``: those sent)."""
        return self.figures.stats

    @property
    def failed_groups(self) -> pd.DataFrame:
        return self.df[self.df[self.error_column].notna()]


async def aggregate_frame(client: Any, df: Any, *, instruction: str | None = None,
                          column: str | None = None,
                          by: str | Sequence[str] = (), order_by: str | Sequence[str] = (),
                          model: str | None = None,
                          output_column: str = "answer", error_column: str | None = None,
                          max_tokens: int | None = None, temperature: float | None = None,
                          context_tokens: int | None = None, cells_as_text: bool = False,
                          token_budget: int | None = None, budget_usd: float | None = None,
                          scope: str = "", partition_key: str = "", run_id: str | None = None,
                          logger: Any = None, mode: str = "online", **unknown: Any
                          ) -> AggregateResult:
    """One answer per group of ``df``'s rows (see the module's docstring).

    ``instruction``: what to answer about each group's texts; ``column``: the text column;
    ``by``: the grouping column(s); ``order_by``: column(s) that order each group's rows (a
    timestamp: rows appended later then change only the last chunks; by default the rows are
    ordered by content, whatever order they come in); ``model``: a chat model (default: the
    settings' default);
    ``max_tokens``: of each reply, partial answers included; ``context_tokens``: the model's
    context (default: the smallest ``max_context_tokens`` of the endpoints serving it, else
    8,192); ``token_budget`` / ``budget_usd``: for all levels together; ``cells_as_text``:
    numbers and timestamps read as text (else such a cell fails its group); ``mode=
    "batch_api"``: each level one batch of a provider's offline batch API (an endpoint with
    ``batch_api=True``), waited for, at the batch price."""
    if unknown:
        raise InferenceConfigError(
            f"aggregate() got unknown argument(s) {sorted(unknown)}; it takes "
            f"{_arguments()}.")
    if not isinstance(column, str):
        raise InferenceConfigError("aggregate: pass column= (the column of text to aggregate).")
    by_columns = _checked_frame(df, column, by, output_column)
    order_columns = [order_by] if isinstance(order_by, str) else list(order_by or ())
    missing = [c for c in order_columns if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"aggregate: order_by column(s) {missing} are not in the input table; available "
            f"columns: {list(df.columns)[:50]}.")
    error_column = error_column or f"{output_column}_error"
    validate_identifier(error_column, "error column")
    if error_column in by_columns or error_column == output_column:
        raise InferenceConfigError(
            f"aggregate: error_column '{error_column}' clashes with another output column.")
    if not isinstance(instruction, str) or not instruction.strip():
        raise InferenceConfigError(
            "aggregate: pass instruction= (what to answer about each group, e.g. 'What do "
            "these customers complain about most?').")
    options = reduce_options(
        client.settings, model=model, max_tokens=max_tokens, context_tokens=context_tokens,
        instructions=[instruction], temperature=temperature, token_budget=token_budget,
        budget_usd=budget_usd, scope=scope or "", partition_key=partition_key or "",
        run_id=run_id, logger=logger, mode=mode)
    if order_columns:  # ties broken by the text, so the order never depends on arrival
        df = df.assign(__batchllm_order_text=df[column].astype(str)).sort_values(
            [*order_columns, "__batchllm_order_text"], kind="mergesort", na_position="last")
    keys, groups = _groups(df, column, by_columns, instruction, cells_as_text,
                           ordered=bool(order_columns))
    outcomes, figures = await reduce_groups(client, groups, options)
    out = pd.DataFrame(keys, columns=by_columns) if by_columns else pd.DataFrame(index=[0])
    out[output_column] = pd.Series([a for a, _ in outcomes], index=out.index, dtype=object)
    out[error_column] = pd.Series([e for _, e in outcomes], index=out.index, dtype=object)
    return AggregateResult(out, figures, output_column, error_column)


def _arguments() -> list[str]:
    """The keyword arguments aggregate() takes, for an error message."""
    import inspect

    taken = inspect.signature(aggregate_frame).parameters
    return sorted(n for n, p in taken.items() if p.kind is p.KEYWORD_ONLY)


def _checked_frame(df: Any, column: str, by: str | Sequence[str], output_column: str
                   ) -> list[str]:
    if not isinstance(df, pd.DataFrame):
        raise InferenceConfigError(f"aggregate() takes a pandas DataFrame, got "
                                   f"{type(df).__name__}.")
    by_columns = [by] if isinstance(by, str) else list(by or ())
    wanted = [column, *by_columns]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"aggregate: column(s) {missing} are not in the input table; available columns: "
            f"{list(df.columns)[:50]}.")
    if column in by_columns:
        raise InferenceConfigError(
            f"aggregate: '{column}' is both the text column and a grouping column (by=).")
    if len(set(by_columns)) != len(by_columns):
        raise InferenceConfigError(f"aggregate: by= names a column twice: {by_columns}.")
    validate_identifier(output_column, "output column")
    if output_column in by_columns:
        raise InferenceConfigError(
            f"aggregate: output_column '{output_column}' is a grouping column; choose another.")
    return by_columns


def _groups(df: pd.DataFrame, column: str, by_columns: list[str], instruction: str,
            cells_as_text: bool, ordered: bool) -> tuple[list[tuple], list[GroupInput]]:
    """The group keys (sorted; NULL keys a group of their own) and each group's texts, in
    ``df``'s order where ``ordered``."""
    if not by_columns:
        return [()], [_group_input(df[column], column, instruction, cells_as_text, ordered)]
    keys, groups = [], []
    for key, part in df.groupby(by_columns, sort=True, dropna=False, observed=True)[column]:
        keys.append(key if isinstance(key, tuple) else (key,))
        groups.append(_group_input(part, column, instruction, cells_as_text, ordered))
    return keys, groups


def _group_input(cells: pd.Series, column: str, instruction: str, cells_as_text: bool,
                 ordered: bool) -> GroupInput:
    texts: list[str] = []
    for label, value in cells.items():
        if _left_out(value):
            continue
        try:
            texts.append(cell_text(value, column, cells_as_text))
        except RowError as exc:  # the group cannot be answered as asked: say which row
            return GroupInput(instruction, [], error=type(exc)(
                f"row {label!r}: {exc.message}").as_cell())
    return GroupInput(instruction, texts, ordered=ordered)


def _left_out(value: Any) -> bool:
    """NULL, NaN and blank text: not part of the aggregate (as SQL aggregates skip NULL)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
