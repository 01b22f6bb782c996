"""The Databricks batch-inference example pipeline, verbatim, for tests, docs and demos.

From Databricks' announcement of batch LLM inference with ``ai_query``: preprocessing with
``regexp_replace``/``LOWER``, inference, and ``CASE ... LIKE`` post-processing in one query over
``call_center_transcripts``. Run it with ``dagster_batchllm.sql.execute(con, CALL_CENTER_PIPELINE,
dialect="databricks")`` on DuckDB, or unchanged in Spark SQL after
``dagster_batchllm.spark.register_ai_functions``.

A transcript that is NULL, or that cleaning leaves empty or only whitespace (the shipped dataset
has 7 of each), is not sent: its summary is NULL, as Databricks documents NULL in, NULL out, and
the post-processing labels it 'Low Risk', so the example's final filter leaves it out.
``CALL_CENTER_PIPELINE_FAIL_ON_ERROR`` is the same pipeline with ``failOnError => false``.
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

# The same pipeline with failOnError => false, as Databricks recommends for large workloads. The
# result is then STRUCT<result: STRING, errorMessage: STRING>, so the post-processing compares
# its result field (LIKE over the struct itself is a type error, in Databricks too), and the
# final filter keeps the rows that failed, which would otherwise drop out as 'Low Risk'.
CALL_CENTER_PIPELINE_FAIL_ON_ERROR = r"""
-- Step 1: Preprocessing
WITH cleaned_data AS (
    SELECT LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', '')) AS transcript_text, call_id, call_timestamp
    FROM call_center_transcripts
),

-- Step 2: LLM Inference, a failed row kept as data
inference_result AS (
    SELECT call_id, call_timestamp, ai_query('llama-70b', transcript_text, failOnError => false) AS inference
    FROM cleaned_data
),

-- Step 3: Post-processing of the result field
final_result AS (
    SELECT call_id, call_timestamp, inference.result AS summary_analysis, inference.errorMessage AS summary_error,
        CASE WHEN inference.result LIKE '%angry%' THEN 'High Risk'
             WHEN inference.result LIKE '%upset%' THEN 'Medium Risk' ELSE 'Low Risk' END AS risk_level,
        CASE WHEN inference.result LIKE '%refund%' THEN 'Refund Request'
             WHEN inference.result LIKE '%complaint%' THEN 'Complaint' ELSE 'General Inquiry' END AS action_required
    FROM inference_result
)

-- Retrieve Results, and the rows that failed
SELECT call_id, call_timestamp, summary_analysis, summary_error, risk_level, action_required
FROM final_result
WHERE risk_level IN ('High Risk', 'Medium Risk') OR summary_error IS NOT NULL;
"""  # noqa: E501 (the example's own line lengths)
