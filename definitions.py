"""The example code location: ``dagster dev -w workspace.yaml`` or ``dagster asset materialize``."""

from __future__ import annotations

import os

import dagster as dg

from assets.documents import document_assets, invoices
from assets.embeddings import embedding_assets, transcript_embeddings
from assets.ml_models import ml_assets, predicted_actions_alias_sensor
from assets.partitions import daily_partitions
from assets.pipeline import (
    BATCH_MODE,
    LLM,
    classified_transcripts,
    pipeline_assets,
    transcript_summaries,
)
from assets.sql_pipeline import sql_assets
from dagster_batchllm import (
    build_batch_collect_sensor,
    build_new_data_sensor,
    build_retry_partitions_sensor,
)
from resources import build_resources, describe_llm, serves_embeddings
from resources.warehouse import PARTITION_COLUMN, SOURCE_TABLE

call_center_job = dg.define_asset_job(
    "call_center_pipeline",
    selection=dg.AssetSelection.groups("call_center"),
    partitions_def=daily_partitions,
    description="cleaned -> inferred -> classified transcripts for one day.",
)

daily_schedule = dg.build_schedule_from_partitioned_job(
    call_center_job, hour_of_day=1, description="Materialize the latest day every night."
)

resources = build_resources(llm=LLM)  # the resource the assets' code versions were read from
llm = resources["llm"]


INFERENCE_KEYS = {transcript_summaries.key, classified_transcripts.key}
INFERENCE_KEYS.add(invoices.key)  # the documents pipeline's fields (assets/documents.py)


def _as_configured(spec: dg.AssetSpec) -> dg.AssetSpec:
    """The inference assets' kinds, model and cost note, from the endpoints this location
    configures (the assets are built before the resource, which decides them)."""
    if spec.key not in INFERENCE_KEYS:
        return spec
    return spec.replace_attributes(
        kinds={"pandas", *llm.asset_kinds()},
        description=f"{spec.description}\n\n{describe_llm(llm)}",
    )


pipeline_assets = dg.map_asset_specs(_as_configured, pipeline_assets)
document_assets = dg.map_asset_specs(_as_configured, document_assets)
_by_key = {a.key: a for a in pipeline_assets}
transcript_summaries = _by_key[transcript_summaries.key]
classified_transcripts = _by_key[classified_transcripts.key]

# Days whose rows failed or were deferred are run again; the summaries' retries re-classify the
# same day too, so the filled summaries reach the classified table.
retry_summaries = build_retry_partitions_sensor(
    transcript_summaries, resource=llm, job=call_center_job,
    also_materialize=[classified_transcripts], max_rounds=3,
)
retry_classifications = build_retry_partitions_sensor(
    classified_transcripts, resource=llm, job=call_center_job, max_rounds=3,
)

# New calls appended to the source table (each stamped with an increasing ingest_id) re-run
# their day through the whole pipeline; answers already in the ledger are not paid for again.
new_calls = build_new_data_sensor(
    call_center_job, url=resources["warehouse"].url, table=SOURCE_TABLE,
    cursor_column="ingest_id", partition_column=PARTITION_COLUMN,
)

# With BATCHLLM_BATCH_API=1 BATCHLLM_BATCH_WAIT=0 a run ends once its batches are submitted;
# this sensor runs the day again (summaries and classifications) when they end.
batch_sensors = [] if BATCH_MODE.get("wait", True) else [
    build_batch_collect_sensor(transcript_summaries, resource=llm,
                               also_materialize=[classified_transcripts]),
    build_batch_collect_sensor(classified_transcripts, resource=llm),
]

extra_assets: list = []
extra_sensors: list = []
if serves_embeddings(llm):  # the embedded default does; real endpoints once one is named
    extra_assets += embedding_assets
    extra_sensors.append(build_retry_partitions_sensor(
        transcript_embeddings, resource=llm, job=call_center_job, max_rounds=3))
if os.environ.get("BATCHLLM_ENABLE_SPARK", "").lower() in ("1", "true", "yes"):
    # The Spark variant of the summaries (ai_query in Spark SQL over Parquet). Opt-in: it needs
    # pyspark and a JVM, and starting Spark is slow for a code location that does not use it.
    from dagster_pyspark import PySparkResource

    from assets.spark_pipeline import spark_assets

    extra_assets += list(spark_assets)
    resources["pyspark"] = PySparkResource(spark_config={
        "spark.master": os.environ.get("BATCHLLM_SPARK_MASTER", "local[2]"),
        "spark.ui.enabled": "false",
        "spark.driver.bindAddress": "127.0.0.1",
    })

# Steps fork from a server process that has imported dagster already (Dagster's documented
# way to cut per-step overhead): a step starts without importing dagster again and ends without
# a full interpreter teardown, which halves the time a stopped run takes to exit (1.8 s -> 0.8 s).
step_executor = dg.multiprocess_executor.configured({"start_method": {"forkserver": {}}})

defs = dg.Definitions(
    executor=step_executor,
    assets=[*pipeline_assets, *sql_assets, *document_assets, *ml_assets, *extra_assets],
    jobs=[call_center_job],
    schedules=[daily_schedule],
    sensors=[retry_summaries, retry_classifications, new_calls, predicted_actions_alias_sensor,
             *extra_sensors, *batch_sensors],
    resources=resources,
)
