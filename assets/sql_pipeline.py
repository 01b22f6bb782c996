"""The summaries and risk labels again, written as ONE Databricks SQL query with ``ai_query``.

This is the Databricks example's CTE pipeline (preprocessing, LLM inference, ``CASE ... LIKE``
post-processing) run in an in-memory DuckDB over one day's raw transcripts. It is the SQL twin of
``transcript_summaries`` + ``classified_transcripts``: the same prompt and generation parameters,
so both variants share answers through the ledger (whichever runs second sends nothing new).

``PIPELINE_SQL`` is written in Databricks SQL, as a Databricks user writes it (the cleaning line
is the example's, verbatim), and runs with ``dialect="databricks"``: sqlglot translates it for
DuckDB (``regexp_replace`` replacing every match, ``'\\s'`` read as Databricks reads it,
``=>`` named arguments, ``named_struct``, the ``:endpoint`` parameter). ``DUCKDB_PIPELINE_SQL`` is
the same query hand-written in DuckDB's dialect (``'g'``, ``:=``, a struct literal), for
``build_sql_pipeline(DUCKDB_PIPELINE_SQL, dialect=None)``; both give the same tables. Their
post-processing (``POST_PROCESSING_SQL``) is plain SQL, written once.

Beyond the example's query, and deliberate: it keeps the columns the Python variant has, asks with
the Python variant's prompt, ``failOnError => false`` keeps a failed row as data (``summary_error``)
instead of failing the partition, and a blank transcript is not sent (its summary is NULL, as for
a NULL transcript). The classified table keeps every call; the example's final
``WHERE risk_level IN ('High Risk', 'Medium Risk')`` is a query on it::

    SELECT * FROM sql_classified_transcripts WHERE risk_level IN ('High Risk', 'Medium Risk')

Run it in the example location, or on its own::

    dg.materialize(sql_assets, partition_key="2026-11-03",
                   resources={"llm": llm, "warehouse": warehouse})
"""

import dagster as dg
import duckdb

from dagster_batchllm.core.ledger.stores import redact_url
from dagster_batchllm.factories.metadata import stats_metadata
from dagster_batchllm.sql import register_ai_functions, translate

from .partitions import daily_partitions

SOURCE_TABLE = "call_center_transcripts"
SUMMARIES_TABLE = "sql_transcript_summaries"
CLASSIFIED_TABLE = "sql_classified_transcripts"

# Step 3 and the result: plain SQL, the same in both dialects (the example's own lines).
POST_PROCESSING_SQL = """\
-- Step 3: Post-processing
final_result AS (
    SELECT call_id, call_timestamp, call_date, agent, customer_id, transcript_text,
           inference.result AS summary_analysis,
           inference.errorMessage AS summary_error,
        CASE WHEN inference.result IS NULL THEN NULL
             WHEN inference.result LIKE '%angry%' THEN 'High Risk'
             WHEN inference.result LIKE '%upset%' THEN 'Medium Risk' ELSE 'Low Risk' END AS risk_level,
        CASE WHEN inference.result IS NULL THEN NULL
             WHEN inference.result LIKE '%refund%' THEN 'Refund Request'
             WHEN inference.result LIKE '%complaint%' THEN 'Complaint' ELSE 'General Inquiry' END AS action_required
    FROM inference_result
)

SELECT * FROM final_result ORDER BY call_timestamp, call_id
"""  # noqa: E501 (the example's own line lengths)

# Databricks SQL; `:endpoint` is bound to llm.default_model at run time.
PIPELINE_SQL = r"""
-- Step 1: Preprocessing
WITH cleaned_data AS (
    SELECT LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', '')) AS transcript_text, call_id, call_timestamp,
           agent, customer_id, left(CAST(call_timestamp AS STRING), 10) AS call_date
    FROM call_center_transcripts
),

-- Step 2: LLM Inference
inference_result AS (
    SELECT *,
           ai_query(:endpoint,
                    CASE WHEN trim(transcript_text) <> ''
                         THEN 'Summarize this call transcript: ' || transcript_text END,
                    failOnError => false,
                    modelParameters => named_struct('max_tokens', 128, 'temperature', 0.0)) AS inference
    FROM cleaned_data
),

""" + POST_PROCESSING_SQL  # noqa: E501 (the example's own line lengths)

# The same query in DuckDB's dialect; `$endpoint` is bound to llm.default_model at run time.
DUCKDB_PIPELINE_SQL = r"""
-- Step 1: Preprocessing
WITH cleaned_data AS (
    SELECT call_id, call_timestamp, agent, customer_id,
           left(CAST(call_timestamp AS VARCHAR), 10) AS call_date,
           LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\s]', '', 'g')) AS transcript_text
    FROM call_center_transcripts
),

-- Step 2: LLM inference
inference_result AS (
    SELECT *,
           ai_query($endpoint,
                    CASE WHEN trim(transcript_text) <> ''
                         THEN 'Summarize this call transcript: ' || transcript_text END,
                    failOnError := false,
                    modelParameters := {'max_tokens': 128, 'temperature': 0.0}) AS inference
    FROM cleaned_data
),

""" + POST_PROCESSING_SQL

SUMMARY_COLUMNS = ["call_id", "call_timestamp", "call_date", "agent", "customer_id",
                   "transcript_text", "summary_analysis", "summary_error"]
CLASSIFIED_COLUMNS = ["call_id", "call_timestamp", "call_date", "summary_analysis",
                      "risk_level", "action_required"]


def build_sql_pipeline(sql: str = PIPELINE_SQL, *,
                       dialect: str | None = "databricks") -> dg.AssetsDefinition:
    """The two SQL-defined tables from one query over ``call_center_transcripts``.

    ``sql`` must return the columns of both tables and may use an ``endpoint`` parameter;
    ``dialect`` is the SQL's dialect (``"databricks"``; None for DuckDB's own). A query that
    cannot be translated faithfully fails here, when the code location loads, not in a run.
    """
    if dialect not in (None, "duckdb"):
        translate(sql, read=dialect, write="duckdb")
    written_in = dialect or "duckdb"

    @dg.multi_asset(
        name="sql_transcript_pipeline",
        specs=[
            dg.AssetSpec(
                SUMMARIES_TABLE, deps=[SOURCE_TABLE], group_name="sql_pipeline",
                kinds={"duckdb", "sql"},
                description="Call summaries from ai_query in one SQL query run on DuckDB (the "
                            "Databricks example's CTE pipeline); failed rows keep their error "
                            "in summary_error.",
            ),
            dg.AssetSpec(
                CLASSIFIED_TABLE, deps=[SUMMARIES_TABLE], group_name="sql_pipeline",
                kinds={"duckdb", "sql"},
                description="Risk level and action required from CASE ... LIKE rules over the "
                            "summaries, computed in the same SQL query.",
            ),
        ],
        partitions_def=daily_partitions,
        required_resource_keys={"llm", "warehouse"},
    )
    def sql_transcript_pipeline(context: dg.AssetExecutionContext):
        """Run the query over the partition's raw transcripts; write both tables."""
        llm, warehouse = context.resources.llm, context.resources.warehouse
        partition = context.partition_key
        raw = warehouse.read_partition(SOURCE_TABLE, partition)
        con = duckdb.connect()
        try:
            con.register(SOURCE_TABLE, raw)
            # The AI functions answer the summaries' rows: record them under that asset, so
            # its retry-partitions sensor finds the failed ones.
            with register_ai_functions(con, llm, context=context, scope=SUMMARIES_TABLE) as ai:
                result = ai.execute(sql, {"endpoint": llm.default_model},
                                    dialect=dialect).df()
                stats = ai.stats
        finally:
            con.close()
        summaries = result[SUMMARY_COLUMNS]
        classified = result[CLASSIFIED_COLUMNS]
        warehouse.write_partition(SUMMARIES_TABLE, summaries, partition)
        warehouse.write_partition(CLASSIFIED_TABLE, classified, partition)
        location = {"warehouse": redact_url(warehouse.url),
                    "sql": dg.MetadataValue.md(f"```sql\n{sql.strip()}\n```"),
                    "sql_dialect": written_in}
        yield dg.MaterializeResult(
            asset_key=SUMMARIES_TABLE,
            metadata={**stats_metadata(stats, summaries,
                                       price_for=llm.client.settings.price_for), **location,
                      "dagster/table_name": f"main.{SUMMARIES_TABLE}"},
        )
        labelled = classified["risk_level"].notna()
        yield dg.MaterializeResult(
            asset_key=CLASSIFIED_TABLE,
            metadata={
                "dagster/row_count": len(classified),
                "dagster/table_name": f"main.{CLASSIFIED_TABLE}",
                "high_risk_calls": int((classified["risk_level"] == "High Risk").sum()),
                "refund_requests": int((classified["action_required"] == "Refund Request").sum()),
                "unlabelled_calls": int((~labelled).sum()),
                **location,
            },
        )

    return sql_transcript_pipeline


sql_transcript_pipeline = build_sql_pipeline()
sql_assets = [sql_transcript_pipeline]
