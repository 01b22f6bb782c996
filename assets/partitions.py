import dagster as dg

daily_partitions = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-11")
