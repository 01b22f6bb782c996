"""cleaned -> inferred -> classified: the Databricks batch-inference example as Dagster assets."""


import os
import re
from typing import Any

import dagster as dg
import pandas as pd

from dagster_batchllm import build_inference_asset
from resources import build_llm_resource

from .partitions import GROUP, daily_call_center_asset, daily_partitions

SOURCE_COLUMNS = ["call_id", "call_timestamp", "call_date", "agent", "customer_id"]
_NOT_LETTER_OR_SPACE = re.compile(r"[^a-zA-Z\s]")

call_center_transcripts = dg.AssetSpec(
    "call_center_transcripts",
    description="Raw call-center transcripts (loaded from the shipped dataset on first use).",
    group_name=GROUP,
    partitions_def=daily_partitions,
    kinds={"sqlite"},
    metadata={"dagster/table_name": "main.call_center_transcripts"},
)


def _clean(context: dg.AssetExecutionContext, raw: pd.DataFrame) -> pd.DataFrame:
    """Lower-cased, everything but letters and whitespace removed (the Databricks example's
    ``LOWER(regexp_replace(transcript_raw_text, '[^a-zA-Z\\s]', ''))``). Null stays null."""
    cleaned = raw[SOURCE_COLUMNS].copy()
    cleaned["transcript_text"] = raw["transcript_raw_text"].map(
        lambda t: _NOT_LETTER_OR_SPACE.sub("", t).lower() if isinstance(t, str) else None
    )
    context.add_output_metadata({"dagster/row_count": len(cleaned)})
    return cleaned


cleaned_transcripts = daily_call_center_asset(
    _clean, name="cleaned_transcripts", ins={"raw": dg.AssetIn("call_center_transcripts")},
    kinds={"pandas", "sqlite"})


SUMMARY_PROMPT = "Summarize this call transcript: {transcript_text}"


# What both inference assets are: a table of calls per day, answered deterministically.
# Off by default: BATCHLLM_BATCH_API=1 (see resources/) sends both inference assets through the
# endpoints' offline batch API at about half the price, each run waiting for its batches;
# BATCHLLM_BATCH_WAIT=0 ends the run once they are submitted, and the batch-collect sensor
# (definitions.py) runs the day again when they end.
BATCH_MODE = (dict(mode="batch_api",
                   wait=os.environ.get("BATCHLLM_BATCH_WAIT", "1").lower() not in ("0", "false"))
              if os.environ.get("BATCHLLM_BATCH_API", "").lower() in ("1", "true", "yes")
              else {})

# The resource the runs use (definitions.py binds this one as `llm`). The assets read it for
# their code versions, which then cover the model it answers with: switching BATCHLLM_MODEL
# (or BATCHLLM_ENDPOINTS' models) marks them and what they feed stale.
LLM = build_llm_resource()

# What every asset over the calls' table is (inference or embeddings): a table of calls per day.
DAILY_CALLS = dict(
    resource=LLM,
    partitions_def=daily_partitions,
    partition_column="call_date",  # a single-run backfill records each day under its own key
    key_columns=["call_id"],
    group_name=GROUP,
    # The shipped calls are messy on purpose: about 2% have a null or blank transcript, which
    # fail as input errors; the failed_row_rate check warns only above 5%.
    warn_failed_rate=0.05,
)
DAILY_CALL_TABLE = dict(**BATCH_MODE, temperature=0.0, **DAILY_CALLS)


def build_transcript_summaries(prompt: str = SUMMARY_PROMPT, **changes: Any
                               ) -> dg.AssetsDefinition:
    """The summaries asset (another prompt gives another code version, and the UI then calls
    the summaries and what they feed unsynced); ``changes`` override the daily table's
    options, e.g. the check thresholds."""
    return build_inference_asset(
        name="transcript_summaries",
        source=cleaned_transcripts,
        prompt=prompt,
        output_column="summary",
        max_tokens=128,
        **{**DAILY_CALL_TABLE, **changes},
    )


transcript_summaries = build_transcript_summaries()

CLASSIFICATION_SCHEMA = {
    "type": "object",
    "properties": {
        "risk_level": {"type": "string", "enum": ["High", "Medium", "Low"]},
        "action_required": {
            "type": "string", "enum": ["Refund Request", "Complaint", "General Inquiry"],
        },
    },
    "required": ["risk_level", "action_required"],
    "additionalProperties": False,
}


def add_rule_based_labels(df: pd.DataFrame) -> pd.DataFrame:
    """The Databricks example's post-processing, ``CASE WHEN summary LIKE '%angry%' ...``."""
    summary = df["summary"].fillna("")
    out = df.copy()
    out["rule_risk_level"] = "Low Risk"
    out.loc[summary.str.contains("upset", regex=False), "rule_risk_level"] = "Medium Risk"
    out.loc[summary.str.contains("angry", regex=False), "rule_risk_level"] = "High Risk"
    out["rule_action_required"] = "General Inquiry"
    out.loc[summary.str.contains("complaint", regex=False), "rule_action_required"] = "Complaint"
    out.loc[summary.str.contains("refund", regex=False), "rule_action_required"] = "Refund Request"
    return out


classified_transcripts = build_inference_asset(
    name="classified_transcripts",
    source=transcript_summaries,
    system=(
        "You classify call-center calls from their summary. risk_level: High if the customer "
        "is angry or threatens to leave, Medium if upset or frustrated, Low otherwise. "
        "action_required: Refund Request, Complaint or General Inquiry. Answer in JSON."
    ),
    prompt="{summary}",
    response_format=CLASSIFICATION_SCHEMA,
    output_column="classification",
    max_tokens=64,
    transform=add_rule_based_labels,
    **DAILY_CALL_TABLE,
)

pipeline_assets = [call_center_transcripts, cleaned_transcripts, transcript_summaries,
                   classified_transcripts]
