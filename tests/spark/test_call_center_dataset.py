"""The Databricks example on the project's own dataset, every row as shipped (issue 17).

The 720 transcripts include 7 NULL and 7 whitespace-only ones. The example runs as written on
DuckDB (``dialect="databricks"``) and in Spark SQL without filtering them out first: neither is
sent, both summaries are NULL. With ``failOnError => false`` the post-processing compares the
struct's ``result`` field (CALL_CENTER_PIPELINE_FAIL_ON_ERROR), and a failed row stays as data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_batchllm.sql import execute
from dagster_batchllm.testing.databricks.compat import transcripts_frame
from dagster_batchllm.testing.databricks.examples import (
    CALL_CENTER_PIPELINE,
    CALL_CENTER_PIPELINE_FAIL_ON_ERROR,
)

pytestmark = pytest.mark.spark

DATASET = Path(__file__).resolve().parents[2] / "assets" / "data" / "call_center_transcripts.csv.gz"

# The example's three steps, keeping every row (Low Risk and NULL summaries too).
EVERY_ROW = CALL_CENTER_PIPELINE[:CALL_CENTER_PIPELINE.index("-- Retrieve Results")] + """
SELECT f.call_id, c.transcript_text, f.summary_analysis, f.risk_level, f.action_required
FROM final_result f JOIN cleaned_data c ON f.call_id = c.call_id
"""


@pytest.fixture(scope="module")
def rows():
    frame = transcripts_frame(DATASET)
    raw = frame["transcript_raw_text"]
    assert len(frame) == 720 and raw.isna().sum() == 7
    assert (raw.notna() & (raw.str.strip() == "")).sum() == 7  # shipped as whitespace
    return frame


@pytest.fixture
def engines(engines_over, rows):
    return engines_over(rows[["call_id", "call_timestamp", "transcript_raw_text"]])


def test_the_example_runs_as_written_on_every_shipped_row(engines, rows, on_both):
    columns = ["call_id", "call_timestamp", "summary_analysis", "risk_level", "action_required"]

    on_spark, on_duckdb, (sent_by_spark, sent_by_duckdb) = on_both(
        engines, CALL_CENTER_PIPELINE, columns)

    assert on_duckdb == on_spark and len(on_spark) > 100
    # Each engine sends every transcript with text once, NULL and blank ones not at all.
    with_text = rows["transcript_raw_text"].str.replace(r"[^a-zA-Z\s]", "", regex=True)
    distinct = with_text[with_text.str.strip().ne("") & with_text.notna()].str.lower().nunique()
    assert sent_by_spark == sent_by_duckdb == distinct


def test_null_and_blank_transcripts_get_null_summaries_on_both_engines(engines, on_both):
    columns = ["call_id", "transcript_text", "summary_analysis", "risk_level", "action_required"]

    on_spark, on_duckdb, _ = on_both(engines, EVERY_ROW, columns)

    assert on_duckdb == on_spark and len(on_spark) == 720
    empty = [r for r in on_spark if r[1] is None or not r[1].strip()]
    assert len(empty) == 14
    assert {(r[2], r[3], r[4]) for r in empty} == {(None, "Low Risk", "General Inquiry")}


def test_fail_on_error_false_runs_through_the_post_processing(engines, rows, records):
    spark, con, sim = engines
    columns = ["call_id", "summary_analysis", "summary_error", "risk_level", "action_required"]

    sim.script(400)  # final: one row of each engine's run fails
    on_spark = records(spark.sql(CALL_CENTER_PIPELINE_FAIL_ON_ERROR).toPandas(), columns)
    sim.script(400)
    on_duckdb = records(
        execute(con, CALL_CENTER_PIPELINE_FAIL_ON_ERROR, dialect="databricks").df(), columns)

    for result in (on_spark, on_duckdb):
        failed = [r for r in result if r[2] is not None]
        assert len(failed) == 1 and failed[0][2].startswith("bad_request: HTTP 400")
        assert failed[0][1] is None  # its result is NULL; the row is kept by the filter
    failed_ids = {r[0] for r in on_spark + on_duckdb if r[2] is not None}
    assert ([r for r in on_spark if r[0] not in failed_ids]
            == [r for r in on_duckdb if r[0] not in failed_ids])
    assert {r[3] for r in on_spark if r[2] is None} == {"High Risk", "Medium Risk"}
