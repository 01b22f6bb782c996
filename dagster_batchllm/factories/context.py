"""What a Dagster asset context tells a call: its run, log, partitions and asset key.

The one place that reads a Dagster context. It reads by attribute and imports nothing from
dagster, so the SQL functions and the Spark driver can take a context without making Dagster a
dependency of the core (their executors never see one).

Example::

    @dg.asset(partitions_def=days)
    def summaries(context, llm: BatchInferenceResource): ...
        seen = read_context(context)   # seen.partition_key == context.partition_key
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunContext:
    """The parts of an asset context that go into the ledger and the log."""

    run_id: str | None = None
    logger: Any = None
    # The run's one partition; None when it covers none or a range (see partition_keys).
    partition_key: str | None = None
    # Every partition the run covers, in order (one for a plain partitioned run).
    partition_keys: tuple[str, ...] = ()
    # The asset key as a string: the ledger scope of the asset's rows (None for an op that
    # materializes several assets: see asset_keys).
    scope: str | None = None
    asset_keys: tuple[str, ...] = ()

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_keys)


def read_context(context: Any) -> RunContext:
    """A :class:`RunContext` from an asset (or op) execution context; empty for None."""
    if context is None:
        return RunContext()
    # context.run.run_id: the context's own run_id attribute is deprecated in Dagster 1.13.
    run = getattr(context, "run", None)
    run_id = getattr(run, "run_id", None)
    partition_key = None
    partition_keys: tuple[str, ...] = ()
    if getattr(context, "has_partition_key", False):
        partition_key = context.partition_key
        partition_keys = (partition_key,)
    elif getattr(context, "has_partition_key_range", False):
        partition_keys = tuple(context.partition_keys)
    asset_keys: tuple[str, ...] = ()
    if getattr(context, "has_assets_def", False):
        asset_keys = tuple(k.to_user_string() for k in context.assets_def.keys)
    # A multi-asset op has no single asset key: its calls must name their scope themselves.
    scope = asset_keys[0] if len(asset_keys) == 1 else None
    return RunContext(run_id=run_id, logger=getattr(context, "log", None),
                      partition_key=partition_key, partition_keys=partition_keys, scope=scope,
                      asset_keys=asset_keys)
