"""Materialization metadata of an inference asset, under Dagster's standard keys where one exists.

The figures come in families, named apart so that nobody reads one for another:

* the rows of the table (of the partition, in a backfill): ``dagster/row_count``,
  ``dagster/column_schema``, ``batchllm/rows_*``, ``batchllm/errors_by_type`` (what failed, and
  whether a retry can fix it) and ``batchllm/failed_rows`` (which rows, and why);
* ``batchllm/run/...``: what this run sent and paid (requests, retries, tokens, cost, latency,
  speed). A rerun answered from the ledger pays nothing, and says so;
* ``batchllm/answers/...``: what the answers the table now holds cost when they were paid for,
  read from the ledger: the same after any number of reruns served from it. Per model they are
  also ``batchllm/<model>/prompt_tokens``, ``completion_tokens`` and ``cost_usd``, the series the
  UI plots over time;
* ``batchllm/deadline/...``: a run through a batch API with a deadline (``deadline=``): its
  rows answered by batch and online, what it paid against the same tokens all online, when it
  finished against the deadline, and the rows a batch answered after they went online.

Cost needs the resource's ``prices``; a model without one gets ``batchllm/cost_note`` saying how
to set it. ``batchllm/requests`` is ``batchllm/run/requests`` under its first name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from ..core import ErrorType, InferenceResult, InferenceStats
from .error_kinds import describe_errors, kind_of, unretryable_rows

# model -> (USD per 1M prompt tokens, USD per 1M completion tokens), None when not priced
PriceFor = Callable[[str], "tuple[float, float] | None"]
FAILED_ROWS_SHOWN = 20


# -- cost -------------------------------------------------------------------------------------


def cost_usd(tokens: Mapping[str, int], price: tuple[float, float] | None) -> float | None:
    """Tokens at a price (USD per 1M prompt and completion tokens)."""
    if price is None:
        return None
    return round((tokens.get("prompt_tokens", 0) * price[0]
                  + tokens.get("completion_tokens", 0) * price[1]) / 1e6, 6)


def model_cost(tokens: Mapping[str, Any], price: tuple[float, float] | None) -> float | None:
    """What a model's answers cost: the sum of the per-row costs the ledger keeps
    (``cost_usd``: each row at the price of the endpoint that answered it, cached tokens and
    batch lines at theirs), plus, for rows kept without one (answered before costs were kept;
    the ``uncosted_`` tokens of :meth:`~dagster_batchllm.core.ledger.table.Ledger.answer_tokens`),
    their tokens at ``price``. Figures without a kept cost are priced by their tokens."""
    kept = tokens.get("cost_usd")
    if kept is None:
        return cost_usd(tokens, price)
    rest = {"prompt_tokens": tokens.get("uncosted_prompt_tokens", 0),
            "completion_tokens": tokens.get("uncosted_completion_tokens", 0)}
    # (rounded to the nano-dollar first: see core.run.figures.add_paid)
    if not (rest["prompt_tokens"] or rest["completion_tokens"]):
        return round(round(kept, 9), 6)
    priced = cost_usd(rest, price)
    return None if priced is None else round(round(kept, 9) + priced, 6)


def _by_model(tokens_by_model: Mapping[str, Mapping[str, int]], price_for: PriceFor | None,
              counted: str | None) -> tuple[dg.TableMetadataValue, float | None, list[str]]:
    """A table of tokens and cost per model, the total cost (None when no model is priced)
    and the models without a price."""
    columns = [dg.TableColumn("model", "string")]
    if counted:
        columns.append(dg.TableColumn(counted, "int"))
    columns += [dg.TableColumn("prompt_tokens", "int"), dg.TableColumn("completion_tokens", "int"),
                dg.TableColumn("cost_usd", "float", description="Null where no price is set.")]
    # Nothing sent costs nothing, priced or not.
    records, total, unpriced = [], (None if tokens_by_model else 0.0), []
    for model, tokens in sorted(tokens_by_model.items()):
        cost = model_cost(tokens, price_for(model) if price_for else None)
        if cost is None:
            unpriced.append(model)
        else:
            total = round((total or 0.0) + cost, 6)
        row = {"model": model, "prompt_tokens": int(tokens.get("prompt_tokens", 0)),
               "completion_tokens": int(tokens.get("completion_tokens", 0)), "cost_usd": cost}
        if counted:
            row[counted] = int(tokens.get(counted, 0))
        records.append(dg.TableRecord(row))
    return (dg.MetadataValue.table(records, dg.TableSchema(columns=columns)), total, unpriced)


def _cost_note(unpriced: Sequence[str]) -> str:
    return (f"No price for {', '.join(sorted(set(unpriced)))}: set prices={{model: Price("
            "input_per_mtok=..., output_per_mtok=...)} on the resource (every endpoint) or on "
            "an endpoint (Endpoint(prices=...)), to see the cost.")


# -- the families -----------------------------------------------------------------------------


def row_figures(stats: InferenceStats) -> dict[str, Any]:
    """How the rows ended, what failed and whether a retry can fix it."""
    errors = dict(stats.errors_by_type)
    metadata: dict[str, Any] = {
        "batchllm/rows_succeeded": stats.succeeded,
        "batchllm/rows_failed": stats.failed,
        "batchllm/rows_deferred": stats.deferred,
        "batchllm/rows_cached": stats.cached,
        "batchllm/failure_rate": round(stats.failure_rate, 6),
        # What the retry sensor reads: failed rows no retry can fix (input errors).
        "batchllm/rows_failed_unretryable": sum(unretryable_rows(errors).values()),
    }
    if stats.deferred:
        errors[ErrorType.DEFERRED.value] = stats.deferred
    if errors:
        metadata["batchllm/errors_by_type"] = errors_table(errors)
    return metadata


def errors_table(errors_by_type: Mapping[str, int]) -> dg.TableMetadataValue:
    """Rows per error type, whether a retry can fix them and what to do."""
    schema = dg.TableSchema(columns=[
        dg.TableColumn("error_type", "string", description="The stable error code."),
        dg.TableColumn("rows", "int"),
        dg.TableColumn("retryable", "bool",
                       description="Whether running the partition again can fix these rows."),
        dg.TableColumn("what_to_do", "string"),
    ])
    records = [
        dg.TableRecord({"error_type": error_type, "rows": int(rows),
                        "retryable": kind_of(error_type).retryable,
                        "what_to_do": kind_of(error_type).advice})
        for error_type, rows in sorted(errors_by_type.items(), key=lambda i: (-i[1], i[0]))
    ]
    return dg.MetadataValue.table(records, schema)


def batch_figures(stats: InferenceStats) -> dict[str, Any]:
    """For a run through a batch API: what the same tokens cost online, and the saving
    (``batchllm/run/cost_usd`` is at the batch price)."""
    if stats.mode != "batch_api":
        return {}
    metadata: dict[str, Any] = {"batchllm/run/mode": stats.mode}
    if stats.online_cost_usd is not None:
        metadata["batchllm/run/online_cost_usd"] = stats.online_cost_usd
        if stats.estimated_cost_usd is not None:
            metadata["batchllm/run/batch_saving_usd"] = round(
                stats.online_cost_usd - stats.estimated_cost_usd, 6)
    return metadata


def deadline_figures(stats: InferenceStats) -> dict[str, Any]:
    """For a batch-API run with a deadline (``stats.deadline``): ``rows_by_batch`` and
    ``rows_online`` (this run's answers), ``cost_usd`` (what it paid, batch and online
    prices mixed) against ``all_online_cost_usd`` and the ``saving_share``, the deadline
    (``at``) against ``finished_at`` and ``status``: met, missed, or pending while rows wait
    for batches and the deadline is ahead; when the rows went online (``switched_online_at``)
    or will (``switch_planned_at``, with wait=False); the partition's ``duplicate_rows`` and
    their ``duplicate_cost_usd`` (answered by a batch after they went online)."""
    figures = stats.deadline
    if not figures:
        return {}
    metadata: dict[str, Any] = {}
    for name, key in (("deadline", "at"), ("finished_at", "finished_at"),
                      ("switched_online_at", "switched_online_at"),
                      ("switch_planned_at", "switch_planned_at")):
        if figures.get(name) is not None:
            metadata[f"batchllm/deadline/{key}"] = dg.MetadataValue.timestamp(
                dt.datetime.fromisoformat(figures[name]))
    metadata["batchllm/deadline/met"] = bool(figures["met"])
    metadata["batchllm/deadline/status"] = figures["status"]  # met, pending or missed
    for name in ("rows_by_batch", "rows_online", "duplicate_rows"):
        metadata[f"batchllm/deadline/{name}"] = int(figures[name])
    metadata["batchllm/deadline/duplicate_cost_usd"] = round(figures["duplicate_cost_usd"], 6)
    metadata["batchllm/deadline/online_requests_per_s"] = figures["online_requests_per_s"]
    paid = stats.cost_usd if stats.cost_usd is not None else stats.estimated_cost_usd
    if paid is not None:
        metadata["batchllm/deadline/cost_usd"] = round(paid, 6)
    if stats.online_cost_usd is not None:
        metadata["batchllm/deadline/all_online_cost_usd"] = round(stats.online_cost_usd, 6)
        if paid is not None and stats.online_cost_usd > 0:
            metadata["batchllm/deadline/saving_share"] = round(
                1.0 - paid / stats.online_cost_usd, 4)
    return metadata


def run_figures(stats: InferenceStats, price_for: PriceFor | None = None) -> dict[str, Any]:
    """What this run sent and paid."""
    metadata: dict[str, Any] = {
        "batchllm/run/requests": stats.requests,
        # The same figure under its first name, which readers of older metadata use.
        "batchllm/requests": stats.requests,
        "batchllm/run/retries": stats.retries,
        "batchllm/run/prompt_tokens": stats.prompt_tokens,
        "batchllm/run/completion_tokens": stats.completion_tokens,
        "batchllm/run/cached_tokens": stats.cached_tokens,
    }
    by_model, total, unpriced = _by_model(stats.tokens_by_model, price_for, None)
    if stats.cost_usd is not None:
        total = round(stats.cost_usd, 6)  # the sum of the costs of the rows it paid for
    elif price_for is None and stats.estimated_cost_usd is not None:
        total = round(stats.estimated_cost_usd, 6)  # priced by the client, not here
    if total is not None:
        metadata["batchllm/run/cost_usd"] = total
    if stats.tokens_by_model:
        metadata["batchllm/run/by_model"] = by_model
    metadata["batchllm/run/rows_per_s"] = round(stats.rows_per_s, 2)
    metadata["batchllm/run/elapsed_s"] = round(stats.elapsed_s, 3)
    if stats.latency_p50_s is not None:
        metadata["batchllm/run/latency_p50_s"] = stats.latency_p50_s
        metadata["batchllm/run/latency_p95_s"] = stats.latency_p95_s
    if unpriced and price_for is not None:
        metadata["batchllm/cost_note"] = _cost_note(unpriced)
    if stats.usage_corrected:  # replies whose usage a server got wrong, counted at the bound
        metadata["batchllm/run/usage_corrected"] = stats.usage_corrected
    metadata["batchllm/run/stats"] = dg.MetadataValue.json(dataclasses.asdict(stats))
    return metadata


def answer_figures(tokens_by_model: Mapping[str, Mapping[str, int]],
                   price_for: PriceFor | None = None) -> dict[str, Any]:
    """What the answers the table holds cost when they were paid for (from
    :meth:`~dagster_batchllm.core.ledger.table.Ledger.answer_tokens`)."""
    by_model, total, unpriced = _by_model(tokens_by_model, price_for, "answers")
    metadata: dict[str, Any] = {
        "batchllm/answers/count": sum(t.get("answers", 0) for t in tokens_by_model.values()),
        "batchllm/answers/prompt_tokens":
            sum(t.get("prompt_tokens", 0) for t in tokens_by_model.values()),
        "batchllm/answers/completion_tokens":
            sum(t.get("completion_tokens", 0) for t in tokens_by_model.values()),
    }
    if total is not None:
        metadata["batchllm/answers/cost_usd"] = total
    if tokens_by_model:
        metadata["batchllm/answers/by_model"] = by_model
    for model, tokens in sorted(tokens_by_model.items()):
        metadata[f"batchllm/{model}/prompt_tokens"] = int(tokens.get("prompt_tokens", 0))
        metadata[f"batchllm/{model}/completion_tokens"] = int(tokens.get("completion_tokens", 0))
        cost = model_cost(tokens, price_for(model) if price_for else None)
        if cost is not None:
            metadata[f"batchllm/{model}/cost_usd"] = cost
    if unpriced:
        metadata["batchllm/cost_note"] = _cost_note(unpriced)
    return metadata


# -- failed rows ------------------------------------------------------------------------------


def failed_rows_table(result: InferenceResult, key_columns: Sequence[str] = (),
                      limit: int = FAILED_ROWS_SHOWN) -> dg.TableMetadataValue | None:
    """Up to ``limit`` rows that failed or were deferred: their key columns (by default their
    position in the input), error type, whether a retry can fix them, and the reason."""
    errors = result.df[result.error_column]
    failed = errors.notna().to_numpy()
    if not failed.any():
        return None
    keys = list(key_columns) or ["row"]
    positions = [i for i, is_failed in enumerate(failed) if is_failed][:limit]
    error_types = result.error_types.to_numpy()
    statuses = result.statuses.to_numpy()
    records = []
    for position in positions:
        error_type = error_types[position] or "unknown"
        reason = str(errors.iloc[position])
        prefix = f"{error_type}: "
        row = {key: (position if key == "row" and not key_columns
                     else _cell(result.df[key].iloc[position])) for key in keys}
        row.update(status=str(statuses[position]), error_type=error_type,
                   retryable=kind_of(error_type).retryable,
                   reason=reason[len(prefix):] if reason.startswith(prefix) else reason)
        records.append(dg.TableRecord(row))
    columns = [dg.TableColumn(key, "int" if key == "row" and not key_columns else "string",
                              description="Position of the row in the input."
                              if key == "row" and not key_columns else "Key column.")
               for key in keys]
    columns += [
        dg.TableColumn("status", "string", description="failed, or deferred (not sent)."),
        dg.TableColumn("error_type", "string"),
        dg.TableColumn("retryable", "bool",
                       description="Whether running the partition again can fix the row."),
        dg.TableColumn("reason", "string"),
    ]
    return dg.MetadataValue.table(records, dg.TableSchema(columns=columns))


def _cell(value: Any) -> str | int | float | bool | None:
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, str | int | float | bool) else str(value)


# -- in words ---------------------------------------------------------------------------------


def summary_line(asset: str, partition: str | None, stats: InferenceStats,
                 answers: Mapping[str, Mapping[str, int]], price_for: PriceFor | None, *,
                 models_named: str) -> str:
    """The last log line of a partition's inference: partition, model(s), rows, tokens, cost
    (``models_named``: what to say when no figure names a model)."""
    models = ", ".join(sorted(set(stats.tokens_by_model) | set(answers))) or models_named
    where = f"{asset} partition {partition}" if partition is not None else asset
    held = sum(t.get("prompt_tokens", 0) + t.get("completion_tokens", 0)
               for t in answers.values())
    line = (f"{where}, model {models}: {stats.rows:,} rows, {stats.succeeded:,} ok "
            f"({stats.cached:,} from the ledger), {stats.failed:,} failed, {stats.deferred:,} "
            f"deferred. This run: {stats.requests:,} requests, "
            f"{stats.prompt_tokens + stats.completion_tokens:,} tokens, "
            f"{_money(stats.tokens_by_model, price_for)}. The answers held: {held:,} tokens, "
            f"{_money(answers, price_for)}.")
    if stats.failed:
        line += f" Failed rows: {describe_errors(stats.errors_by_type)}."
    return line


def _money(tokens_by_model: Mapping[str, Mapping[str, int]], price_for: PriceFor | None) -> str:
    costs = [model_cost(tokens, price_for(model) if price_for else None)
             for model, tokens in tokens_by_model.items()]
    if any(c is None for c in costs):
        return "cost unknown (no price set)"
    return f"${sum(costs):.6f}"


# -- the table --------------------------------------------------------------------------------


def column_type(series: Any) -> str:
    """A column's type in Dagster's words: string, int, float, bool, timestamp, date, json."""
    import pandas as pd

    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "timestamp"
    inferred = pd.api.types.infer_dtype(series, skipna=True)
    return {"string": "string", "integer": "int", "floating": "float", "mixed-integer-float":
            "float", "decimal": "float", "boolean": "bool", "datetime": "timestamp",
            "datetime64": "timestamp", "date": "date", "empty": "string"}.get(
        inferred, "json" if _holds_json(series) else "string")


def _holds_json(series: Any) -> bool:
    return any(isinstance(v, dict | list) for v in series.head(100))


def column_schema(df: Any, descriptions: Mapping[str, str] | None = None,
                  types: Mapping[str, str] | None = None) -> dg.TableSchema:
    """The table's columns with their types (``types`` wins over what the values say, e.g.
    ``json`` for a column of JSON text) and ``descriptions``."""
    descriptions, types = descriptions or {}, types or {}
    return dg.TableSchema(columns=[
        dg.TableColumn(name=str(name), type=types.get(str(name)) or column_type(df[name]),
                       description=descriptions.get(str(name)))
        for name in df.columns
    ])


def markdown_preview(df: Any, rows: int = 5, max_chars: int = 120) -> str:
    head = df.head(rows).copy()
    for column in head.columns:
        head[column] = head[column].map(lambda v: _short(v, max_chars))
    return head.to_markdown(index=False)


def _short(value: Any, limit: int) -> str:
    text = "" if value is None else str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table_figures(df: Any, preview_rows: int = 5, *, schema: dg.TableSchema | None = None
                  ) -> dict[str, Any]:
    """Row count, column schema and a preview of the table written."""
    metadata: dict[str, Any] = {"dagster/row_count": len(df),
                                "dagster/column_schema": schema or column_schema(df)}
    if preview_rows:
        metadata["preview"] = dg.MetadataValue.md(markdown_preview(df, preview_rows))
    return metadata


def stats_metadata(stats: InferenceStats, df: Any | None = None, preview_rows: int = 5, *,
                   price_for: PriceFor | None = None) -> dict[str, Any]:
    """Metadata for a materialization from a call's figures: its rows and what the run paid
    (``price_for``: a model's prices, e.g. ``llm.client.settings.price_for``, for the cost
    per model; without it the total the client priced)."""
    metadata = {**row_figures(stats), **run_figures(stats, price_for), **batch_figures(stats)}
    if df is not None:
        metadata.update(table_figures(df, preview_rows))
    return metadata
