"""What every batchllm asset does around its call: one call per partition of the run, the
answers joined back in input order, and per partition its figures, its checks and its output.

The inference, embedding and scoring assets differ only in the call they make and in a few
figures of their own (batch savings, vector size, model version), which they pass in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg

from ..core import InferenceStats
from .checks import check_events, inference_check_results
from .context import read_context
from .metadata import failed_rows_table, row_figures

# Each row's place in the input while a multi-partition run works partition by partition.
POSITION = "__batchllm_position"

#: (partition key, the call's result or None where the partition had no rows, its stats, its
#: output rows) -> the asset's own figures for that partition.
Figures = Callable[[str | None, Any, InferenceStats, Any], dict[str, Any]]
#: The same arguments -> the line logged for the partition (None: none).
LogLine = Callable[[str | None, Any, InferenceStats, Any], str | None]


def call_per_partition(context: dg.AssetExecutionContext, source_table: Any,
                       partition_column: str | None, call: Callable[[Any, str | None], Any]
                       ) -> tuple[dict[str | None, tuple[Any, Any]], Any]:
    """``call(frame, partition_key)`` for each partition of the run that has rows; returns
    {key: (frame, result)} and the results' tables joined in input order."""
    results = {key: (frame, call(frame, key))
               for key, frame in split_by_partition(context, source_table, partition_column)}
    frames = [result.df for _, result in results.values()]
    table = concat_in_order(frames) if POSITION in frames[0].columns else frames[0]
    return results, table


def partition_events(context: dg.AssetExecutionContext, asset_key: dg.AssetKey, table: Any,
                     results: dict[str | None, tuple[Any, Any]], source_table: Any, *,
                     partition_column: str | None, key_columns: Sequence[str],
                     warn_failed_rate: float, error_failed_rate: float, empty_partition: str,
                     figures: Figures, log_line: LogLine) -> Iterator[Any]:
    """The asset's output and check results. Every partition of the run gets its own figures
    and checks, also one without input rows (its row count check as ``empty_partition``
    says)."""
    keys = list(read_context(context).partition_keys) or [None]
    metadata_by_key, checks = {}, []
    for key in keys:
        frame, result = results.get(key, (source_table.iloc[0:0], None))
        stats = result.stats if result is not None else InferenceStats()
        rows_out = rows_of(table, key, partition_column, single=len(keys) == 1)
        failed = failed_rows_table(result, key_columns) if result is not None else None
        metadata_by_key[key] = {
            **row_figures(stats),
            **({"batchllm/failed_rows": failed} if failed is not None else {}),
            **figures(key, result, stats, rows_out),
        }
        checks.append((key, inference_check_results(
            asset_key, stats, input_rows=len(frame), output_rows=len(rows_out),
            warn_failed_rate=warn_failed_rate, error_failed_rate=error_failed_rate,
            empty_partition=empty_partition, failed_rows=failed)))
        line = log_line(key, result, stats, rows_out)
        if line:
            context.log.info(line)
    if len(keys) == 1:
        yield dg.Output(table, metadata=metadata_by_key[keys[0]])
    else:  # a range (a single-run backfill): each partition's materialization, its figures
        for key, metadata in metadata_by_key.items():
            context.add_asset_metadata(metadata, partition_key=key)
        yield dg.Output(table)
    yield from check_events(context, asset_key, checks)


def split_by_partition(context: dg.AssetExecutionContext, df: Any,
                       partition_column: str | None) -> list[tuple[str | None, Any]]:
    keys = list(read_context(context).partition_keys)
    if not keys:
        return [(None, df)]
    if len(keys) == 1:
        return [(keys[0], df)]
    if partition_column is None or partition_column not in df.columns:
        raise dg.Failure(
            f"This run covers {len(keys)} partitions but the input has no partition column "
            f"{partition_column!r}; set partition_column= on the asset."
        )
    labels = df[partition_column].astype(str)
    unknown = sorted(set(labels) - set(keys))
    if unknown:
        raise dg.Failure(f"Input rows belong to partitions outside this run: {unknown[:5]}")
    if df.empty:
        return [(keys[0], df)]
    positioned = df.assign(**{POSITION: range(len(df))})
    return [(key, positioned[labels.to_numpy() == key]) for key in keys
            if (labels == key).any()]


def concat_in_order(frames: list[Any]) -> Any:
    import pandas as pd

    table = pd.concat(frames).sort_values(POSITION, kind="stable")
    return table.drop(columns=[POSITION])


def rows_of(table: Any, key: str | None, partition_column: str | None, *, single: bool) -> Any:
    """The output rows of one partition of the run."""
    if single:
        return table
    if partition_column not in table.columns:
        raise dg.Failure(
            f"The transform dropped the partition column {partition_column!r}, so the rows of "
            "each partition of this run cannot be told apart; keep it in the output."
        )
    return table[(table[partition_column].astype(str) == key).to_numpy()]
