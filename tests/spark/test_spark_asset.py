"""The example location's Spark variant materializes in Dagster, reading and writing Parquet."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
from dagster_pyspark import PySparkResource

from assets.spark_pipeline import spark_assets, spark_transcript_summaries
from dagster_batchllm import BatchInferenceResource, Endpoint
from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.spark

DAY = "2026-11-03"


class FakeWarehouse(dg.ConfigurableResource):
    """The warehouse's read side, over three calls of one day."""

    def read_partition(self, table: str, partition_key: str) -> pd.DataFrame:
        assert (table, partition_key) == ("call_center_transcripts", DAY)
        return pd.DataFrame({
            "call_id": ["a", "b", "c"],
            "call_timestamp": pd.to_datetime([f"{DAY} 09:00:00.123456789",  # nanoseconds
                                              f"{DAY} 10:00:00.0", f"{DAY} 11:00:00.0"]),
            "agent": ["ann", "bob", "ann"],
            "customer_id": [1, 2, 3],
            "transcript_raw_text": ["I'm ANGRY!! Refund order #12 now.", "Where is my parcel?",
                                    "?!? 123"],
        })


def test_the_spark_asset_materializes_and_a_rerun_pays_only_for_failures(spark, tmp_path):
    assert [a.key for a in spark_assets] == [dg.AssetKey("spark_transcript_summaries")]
    spec = spark_transcript_summaries.specs_by_key[spark_transcript_summaries.key]
    assert spec.kinds == {"spark"} and spec.group_name == "spark_pipeline"
    run_config = {"ops": {"spark_transcript_summaries": {
        "config": {"parquet_dir": str(tmp_path / "parquet")}}}}
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        resources = {
            "pyspark": PySparkResource(spark_config={"spark.master": "local[2]"}),
            "warehouse": FakeWarehouse(),
            "llm": BatchInferenceResource(
                endpoints=[Endpoint(name="sim", base_url=sim.base_url, models=["llama-70b"])],
                store_url=f"sqlite:///{tmp_path / 'ledger.db'}", default_model="llama-70b",
                retry_initial_backoff_s=0.01, max_retry_after_s=0.2),
        }
        sim.script(400)
        first = dg.materialize(spark_assets, partition_key=DAY, resources=resources,
                               run_config=run_config)
        sent_first = sim.stats(log=False)["requests"]
        second = dg.materialize(spark_assets, partition_key=DAY, resources=resources,
                                run_config=run_config)
        stats = sim.stats(log=False)

    assert first.success and second.success
    [meta_first] = [m.metadata for m in first.asset_materializations_for_node(
        "spark_transcript_summaries")]
    [meta] = [m.metadata for m in second.asset_materializations_for_node(
        "spark_transcript_summaries")]
    assert meta_first["dagster/row_count"].value == 3 and meta_first["failed_rows"].value == 1
    assert meta["dagster/row_count"].value == 3 and meta["failed_rows"].value == 0
    assert sent_first == 2 and stats["requests"] == 3  # the rerun sent only the failed row
    path = meta["path"].value
    assert path.endswith(f"spark_transcript_summaries/date={DAY}")
    out = pd.read_parquet(path).sort_values("call_id").reset_index(drop=True)
    assert out["summary"].tolist() == [
        "[sim] Summarize this call transcript: im angry refund order now",
        "[sim] Summarize this call transcript: where is my parcel",
        None,  # nothing left after cleaning: not sent
    ]
    assert out["summary_error"].isna().all()
    assert set(out["call_date"]) == {DAY}
    assert (tmp_path / "parquet" / "call_center_transcripts" / f"date={DAY}").is_dir()
