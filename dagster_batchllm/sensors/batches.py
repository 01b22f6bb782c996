"""The batch-collect sensor: run a partition again when the batches its rows wait for end.

An asset with ``mode="batch_api", wait=False`` ends its run once the batches are submitted,
its rows deferred "waiting for batch <id>" (recorded by the batch book; rows whose keys were in
another run's batch, by a deferred ledger record naming it). Each tick this sensor reads which
partitions of the asset wait for which batches (``poll_waiting_partitions``), polls those batches
at the provider (a ``batches.retrieve`` each, recorded in the batch book) and requests one run
per partition whose batches have all ended, tagged ``batchllm/collect``. That run collects
the answers and submits nothing, except lines a retry may fix (429, 5xx, an expired batch's
unanswered lines).
So no Dagster run sits for the 24 h a batch may take. The run key names the batches, so the
same ended batches launch one run, however many ticks see them.

An asset with a ``deadline`` records, with ``wait=False``, when its partition's rows must go
online (the batch book's switch time, see
:mod:`dagster_batchllm.core.batch.deadline`). Once that time has come and the
batches have not all ended, the sensor requests a run of the partition tagged
``batchllm/deadline``: it cancels the unfinished batches, collects what they answered and
sends the rest online. The run key names the switch time, so each recorded time launches one
run; a run that finds the switch not yet due (the online endpoints measured faster) records a
new time, and that one launches the next.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import dagster as dg

from ..core import poll_waiting_partitions
from ..factories.deadlines import DEADLINE_TAG
from .common import _missing_sqlite_file, watched_asset

BATCH_COLLECT_TAG = "batchllm/collect"


def build_batch_collect_sensor(
    asset: dg.AssetsDefinition | dg.AssetSpec,
    *,
    resource: Any,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    also_materialize: Sequence[Any] = (),
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> dg.SensorDefinition:
    """A sensor that re-materializes the partitions whose batches ended, or whose deadline's
    switch time has come (an asset with ``deadline=``: the run sends the rest online).

    Args:
        asset: a partitioned inference asset built with ``mode="batch_api", wait=False``.
        resource: the ``BatchInferenceResource`` the asset uses (the sensor polls its
            ``batch_api`` endpoints and reads its ledger; an ``EnvVar`` API key is read at
            evaluation time).
        also_materialize: assets re-materialized in the same runs.

    Example::

        summaries = build_inference_asset(name="summaries", source="transcripts",
                                          prompt="Summarize: {text}", output_column="summary",
                                          partitions_def=days, mode="batch_api", wait=False)
        sensors = [build_batch_collect_sensor(summaries, resource=llm)]
    """
    watched = watched_asset(
        "build_batch_collect_sensor", asset, also_materialize=also_materialize,
        minimum_interval_seconds=minimum_interval_seconds,
        unpartitioned="; an unpartitioned asset with wait=False collects its batches on its "
        "next materialization.")
    if not hasattr(resource, "to_settings"):
        raise dg.DagsterInvalidDefinitionError(
            f"{watched.where}: resource= must be the BatchInferenceResource the asset uses, got "
            f"{type(resource).__name__}.")
    scope, selection = watched.scope, watched.selection

    def evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        settings = resource.to_settings()
        if _missing_sqlite_file(settings.store_url or "sqlite://"):
            return dg.SensorResult(skip_reason=f"No run of {scope} has written its ledger yet.")
        waits = poll_waiting_partitions(settings, scope, log=context.log)
        if not waits:
            return dg.SensorResult(skip_reason=f"No partition of {scope} waits for a batch.")
        requests, waiting, now = [], [], time.time()
        for wait in waits:
            partition, names = wait.partition, sorted(wait.batches)
            if wait.switch_due(now):
                context.log.info(f"{scope} partition {partition}: the deadline's switch time "
                                 f"{wait.switch_time} has come; its run sends the rows the "
                                 "batches have not answered online")
                requests.append(dg.RunRequest(
                    run_key=f"{partition}|deadline|{wait.switch_at:.3f}",
                    partition_key=partition, asset_selection=selection,
                    tags={DEADLINE_TAG: "true"}))
                continue
            if wait.pending:
                switch = f"; online at {wait.switch_time}" if wait.switch_at is not None else ""
                pending = ", ".join(f"{n} {status}" for n, status in wait.pending.items())
                waiting.append(f"{partition} ({pending}{switch})")
                continue
            rows = sum(wait.batches.values())
            context.log.info(f"{scope} partition {partition}: batches {', '.join(names)} "
                             f"ended; collecting {rows} rows")
            requests.append(dg.RunRequest(
                run_key=f"{partition}|{','.join(names)}", partition_key=partition,
                asset_selection=selection, tags={BATCH_COLLECT_TAG: "true"}))
        if requests:
            return dg.SensorResult(run_requests=requests)
        return dg.SensorResult(skip_reason=f"{scope}: waiting for batches: "
                                           f"{'; '.join(waiting[:20])}.")

    return watched.sensor(
        evaluate, suffix="batch_collect", name=name,
        minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
        description=description or (
            f"Re-materializes the partitions of {scope} whose provider batches ended, so their "
            "run collects the answers (mode='batch_api', wait=False)."))
