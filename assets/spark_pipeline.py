"""The call summaries again, computed on Spark: ``ai_query`` in Spark SQL over Parquet.

The Spark twin of ``transcript_summaries``: the same cleaning (the Databricks example's
``LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', ''))``), the same prompt and the
same generation parameters, so it shares answers with the pandas and DuckDB variants through
the ledger (whichever runs second sends nothing new). One day goes:

1. the warehouse's raw rows for the day -> ``<parquet_dir>/call_center_transcripts/date=<day>``
2. Spark reads that Parquet, runs ``SUMMARY_SQL`` (``ai_query`` through the ``llm`` resource's
   endpoints, ``failOnError => false`` so a failed row keeps its error in ``summary_error``)
3. -> ``<parquet_dir>/spark_transcript_summaries/date=<day>`` (overwritten on rerun)

The SparkSession comes from ``dagster_pyspark.PySparkResource`` (resource key ``pyspark``); the
model is the ``llm`` resource's ``default_model``. On a cluster, ``parquet_dir`` must be a mount
the driver and every executor see, and the ledger PostgreSQL.

Example::

    import dagster as dg
    from dagster_pyspark import PySparkResource

    from assets.spark_pipeline import spark_assets

    dg.materialize(spark_assets, partition_key="2026-11-03", resources={
        "pyspark": PySparkResource(spark_config={"spark.master": "local[2]",
                                                  "spark.driver.bindAddress": "127.0.0.1",
                                                  "spark.ui.enabled": "false"}),
        "llm": llm, "warehouse": warehouse,
    }, run_config={"ops": {"spark_transcript_summaries": {
        "config": {"parquet_dir": "/tmp/spark"}}}})
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from dagster_batchllm.spark import register_ai_functions

from .partitions import daily_partitions

SOURCE_TABLE = "call_center_transcripts"
ASSET_NAME = "spark_transcript_summaries"
RAW_COLUMNS = ["call_id", "call_timestamp", "agent", "customer_id", "transcript_raw_text"]

# Spark SQL: `:endpoint` is bound to llm.default_model, `{raw}` to the day's Parquet.
SUMMARY_SQL = r"""
WITH cleaned_data AS (
    SELECT call_id, call_timestamp, agent, customer_id,
           LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', '')) AS transcript_text
    FROM {raw}
)
SELECT call_id, call_timestamp, :day AS call_date, agent, customer_id, transcript_text,
       inference.result AS summary, inference.errorMessage AS summary_error
FROM (
    SELECT *,
           ai_query(:endpoint,
                    CASE WHEN trim(transcript_text) <> ''
                         THEN 'Summarize this call transcript: ' || transcript_text END,
                    failOnError => false,
                    modelParameters => named_struct('max_tokens', 128, 'temperature', 0.0))
               AS inference
    FROM cleaned_data
)
"""


class SparkPipelineConfig(dg.Config):
    parquet_dir: str = Field(
        default="data/spark",
        description="Directory of the raw and summary Parquet (on a cluster: a shared mount).",
    )


@dg.asset(
    name=ASSET_NAME,
    deps=[SOURCE_TABLE],
    partitions_def=daily_partitions,
    group_name="spark_pipeline",
    kinds={"spark"},
    required_resource_keys={"pyspark", "llm", "warehouse"},
    description="Call summaries from ai_query in Spark SQL over the day's Parquet; failed rows "
                "keep their error in summary_error.",
)
def spark_transcript_summaries(context: dg.AssetExecutionContext,
                               config: SparkPipelineConfig) -> dg.MaterializeResult:
    """Write the day's raw rows to Parquet, summarize them on Spark, write the summaries."""
    resources = context.resources
    day = context.partition_key
    root = Path(config.parquet_dir)
    raw_dir = root / SOURCE_TABLE / f"date={day}"
    out_dir = root / ASSET_NAME / f"date={day}"

    raw = resources.warehouse.read_partition(SOURCE_TABLE, day)[RAW_COLUMNS]
    raw_dir.mkdir(parents=True, exist_ok=True)
    # Microseconds: Spark cannot read the nanosecond timestamps pandas writes by default.
    raw.to_parquet(raw_dir / "part-00000.parquet", index=False, coerce_timestamps="us",
                   allow_truncated_timestamps=True)

    spark = resources.pyspark.spark_session
    llm = resources.llm
    register_ai_functions(spark, llm, context=context)
    summaries = spark.sql(SUMMARY_SQL, args={"endpoint": llm.default_model, "day": day},
                          raw=spark.read.parquet(str(raw_dir)))
    summaries.write.mode("overwrite").parquet(str(out_dir))

    # Figures from what was written: another action on `summaries` would run ai_query again.
    written = spark.read.parquet(str(out_dir))
    rows = written.count()
    failed = written.where("summary_error IS NOT NULL").count()
    return dg.MaterializeResult(metadata={
        "dagster/row_count": rows,
        "path": dg.MetadataValue.path(str(out_dir.resolve())),
        "raw_path": dg.MetadataValue.path(str(raw_dir.resolve())),
        "failed_rows": failed,
        "model": llm.default_model,
        "sql": dg.MetadataValue.md(f"```sql\n{SUMMARY_SQL.strip()}\n```"),
    })


spark_assets = [spark_transcript_summaries]
