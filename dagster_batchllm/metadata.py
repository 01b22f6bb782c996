"""Materialization metadata from a run's figures, under Dagster's standard keys where one exists.

Per-model token counts go under ``batchllm/<model>/<kind>_tokens`` so the UI plots each one over
time; the whole stats dict is kept as JSON for anything not broken out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dagster as dg

from .core.results import InferenceStats


def merge_stats(parts: list[InferenceStats]) -> InferenceStats:
    """Add up the figures of several calls (one per partition in a single-run backfill)."""
    if len(parts) == 1:
        return parts[0]
    total = InferenceStats()
    for part in parts:
        for field in ("rows", "succeeded", "failed", "deferred", "cached", "deduplicated",
                      "requests", "retries", "prompt_tokens", "completion_tokens", "elapsed_s"):
            setattr(total, field, getattr(total, field) + getattr(part, field))
        for name, counts in part.endpoints.items():
            merged = total.endpoints.setdefault(name, {})
            for key, value in counts.items():
                if isinstance(value, bool):
                    merged[key] = merged.get(key, False) or value
                else:
                    merged[key] = merged.get(key, 0) + value
        for model, tokens in part.tokens_by_model.items():
            merged = total.tokens_by_model.setdefault(model, {})
            for key, value in tokens.items():
                merged[key] = merged.get(key, 0) + value
        for error_type, count in part.errors_by_type.items():
            total.errors_by_type[error_type] = total.errors_by_type.get(error_type, 0) + count
        if part.estimated_cost_usd is not None:
            total.estimated_cost_usd = (total.estimated_cost_usd or 0.0) + part.estimated_cost_usd
    # Percentiles do not add up; the slowest part's are the honest upper figures.
    p50 = [p.latency_p50_s for p in parts if p.latency_p50_s is not None]
    p95 = [p.latency_p95_s for p in parts if p.latency_p95_s is not None]
    total.latency_p50_s = max(p50) if p50 else None
    total.latency_p95_s = max(p95) if p95 else None
    return total


def column_schema(df: Any) -> dg.TableSchema:
    return dg.TableSchema(columns=[
        dg.TableColumn(name=str(name), type=str(dtype)) for name, dtype in df.dtypes.items()
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


def stats_metadata(stats: InferenceStats, df: Any | None = None,
                   preview_rows: int = 5) -> dict[str, Any]:
    """Metadata for a materialization of an inference asset."""
    metadata: dict[str, Any] = {
        "batchllm/rows_succeeded": stats.succeeded,
        "batchllm/rows_failed": stats.failed,
        "batchllm/rows_deferred": stats.deferred,
        "batchllm/rows_cached": stats.cached,
        "batchllm/requests": stats.requests,
        "batchllm/retries": stats.retries,
        "batchllm/prompt_tokens": stats.prompt_tokens,
        "batchllm/completion_tokens": stats.completion_tokens,
        "batchllm/rows_per_s": round(stats.rows_per_s, 2),
        "batchllm/elapsed_s": round(stats.elapsed_s, 3),
        "batchllm/failure_rate": round(stats.failure_rate, 6),
    }
    if stats.latency_p50_s is not None:
        metadata["batchllm/latency_p50_s"] = stats.latency_p50_s
        metadata["batchllm/latency_p95_s"] = stats.latency_p95_s
    for model, tokens in stats.tokens_by_model.items():
        metadata[f"batchllm/{model}/prompt_tokens"] = tokens.get("prompt_tokens", 0)
        metadata[f"batchllm/{model}/completion_tokens"] = tokens.get("completion_tokens", 0)
    if stats.estimated_cost_usd is not None:
        metadata["batchllm/estimated_cost_usd"] = round(stats.estimated_cost_usd, 6)
    metadata["batchllm/stats"] = dg.MetadataValue.json(dataclasses.asdict(stats))
    if df is not None:
        metadata["dagster/row_count"] = len(df)
        metadata["dagster/column_schema"] = column_schema(df)
        if preview_rows:
            metadata["preview"] = dg.MetadataValue.md(markdown_preview(df, preview_rows))
    return metadata
