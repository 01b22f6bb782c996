"""The example code location: ``dagster dev -w workspace.yaml`` or ``dagster asset materialize``."""

from __future__ import annotations

import dagster as dg

from assets.partitions import daily_partitions
from assets.pipeline import pipeline_assets
from resources import build_resources

call_center_job = dg.define_asset_job(
    "call_center_pipeline",
    selection=dg.AssetSelection.groups("call_center"),
    partitions_def=daily_partitions,
    description="cleaned -> inferred -> classified transcripts for one day.",
)

daily_schedule = dg.build_schedule_from_partitioned_job(
    call_center_job, hour_of_day=1, description="Materialize the latest day every night."
)

defs = dg.Definitions(
    assets=pipeline_assets,
    jobs=[call_center_job],
    schedules=[daily_schedule],
    resources=build_resources(),
)
