"""The Databricks batch-inference example pipeline, verbatim, for tests, docs and demos.

From Databricks' announcement of batch LLM inference with ``ai_query``: preprocessing with
``regexp_replace``/``LOWER``, inference, and ``CASE ... LIKE`` post-processing in one query over
``call_center_transcripts``. Run it with ``dagster_batchllm.sql.execute(con, CALL_CENTER_PIPELINE,
dialect="databricks")`` on DuckDB, or unchanged in Spark SQL after
``dagster_batchllm.spark.register_ai_functions``.
"""

CALL_CENTER_PIPELINE = r"""
-- Step 1: Preprocessing
WITH cleaned_data AS (
    SELECT LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', '')) AS transcript_text, call_id, call_timestamp
    FROM call_center_transcripts
),

-- Step 2: LLM Inference
inference_result AS (
    SELECT call_id, call_timestamp, ai_query('llama-70b', transcript_text) AS summary_analysis
    FROM cleaned_data
),

-- Step 3: Post-processing
final_result AS (
    SELECT call_id, call_timestamp, summary_analysis,
        CASE WHEN summary_analysis LIKE '%angry%' THEN 'High Risk'
             WHEN summary_analysis LIKE '%upset%' THEN 'Medium Risk' ELSE 'Low Risk' END AS risk_level,
        CASE WHEN summary_analysis LIKE '%refund%' THEN 'Refund Request'
             WHEN summary_analysis LIKE '%complaint%' THEN 'Complaint' ELSE 'General Inquiry' END AS action_required
    FROM inference_result
)

-- Retrieve Results
SELECT call_id, call_timestamp, summary_analysis, risk_level, action_required
FROM final_result
WHERE risk_level IN ('High Risk', 'Medium Risk');
"""  # noqa: E501 (the example's own line lengths)
