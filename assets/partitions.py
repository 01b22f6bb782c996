"""The example's days, and the shape of a call-center asset over them."""

import warnings
from collections.abc import Callable
from typing import Any

import dagster as dg

daily_partitions = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-11")

GROUP = "call_center"


def daily_call_center_asset(compute: Callable[..., Any], **attributes: Any
                            ) -> dg.AssetsDefinition:
    """``compute`` as an asset of the call-center group over the days, a backfill of many days
    in one run (``attributes``: dg.asset's, e.g. name, ins, kinds, description)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # backfill_policy is marked beta
        return dg.asset(partitions_def=daily_partitions, group_name=GROUP,
                        backfill_policy=dg.BackfillPolicy.single_run(), **attributes)(compute)
