"""Scoring assets over a real local MLflow registry, materialized on a real Dagster instance:
metadata names the model version, a bad row fails alone (and the check says so), a moved
alias marks the asset stale through the sensor's observation, and the rerun scores under the
new version only."""


import dagster as dg
import pandas as pd
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from dagster_batchllm import BatchInferenceResource, MlflowModel
from dagster_batchllm.factories.scoring import (
    build_model_alias_sensor,
    build_model_version_asset,
    build_scoring_asset,
)

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    feature_frame,
    fit_risk_model,
    two_risk_versions,
)

FEATURES = ["f1", "f2"]
DAYS = ["2026-11-01", "2026-11-02"]


def _features() -> pd.DataFrame:
    frame = feature_frame(40, seed=31)
    frame.insert(0, "row_id", range(40))
    frame["day"] = [DAYS[i % 2] for i in range(40)]
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[7, "f1"] = "seven"  # the model cannot read it
    return frame


@pytest.fixture
def setup(tmp_path):
    registry = two_risk_versions(tmp_path / "registry", "churn")

    @dg.asset
    def features() -> pd.DataFrame:
        return _features()

    model_asset = build_model_version_asset(name="churn_model",
                                            model_uri="models:/churn@champion",
                                            registry_uri=registry.uri)
    scores = build_scoring_asset(name="churn_scores", source=features, model="churn",
                                 input_columns=FEATURES, output_column="churn",
                                 model_asset=model_asset, key_columns=["row_id"])
    sensor = build_model_alias_sensor(scores, model_asset)
    llm = BatchInferenceResource(
        mlflow_models=[MlflowModel(name="churn", model_uri="models:/churn@champion",
                                   registry_uri=registry.uri)],
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05)
    return registry, features, model_asset, scores, sensor, llm


def _predictions(version: int) -> list:
    frame = _features().drop(index=7).astype({"f1": float})
    return fit_risk_model(version).predict(frame[FEATURES]).tolist()


@pytest.mark.slow
def test_a_moved_alias_marks_the_scores_stale_and_the_rerun_uses_the_new_version(setup):
    registry, features, model_asset, scores, sensor, llm = setup
    assets = [features, model_asset, scores]
    with dg.instance_for_test() as instance:
        # The sensor's first tick records the version as it finds it (the daemon reports the
        # observations a sensor returns; here the test does).
        seen = sensor(dg.build_sensor_context(instance=instance))
        assert isinstance(seen, dg.SensorResult) and not seen.run_requests
        instance.report_runless_asset_event(seen.asset_events[0])
        cursor = seen.cursor
        first = dg.materialize(assets[::2], resources={"llm": llm}, instance=instance)
        assert first.success
        metadata = first.asset_materializations_for_node("churn_scores")[0].metadata
        assert metadata["batchllm/model/version"].value == "1"
        assert metadata["batchllm/model/alias"].value == "champion"
        assert metadata["batchllm/model/uri"].value == "models:/churn/1"
        assert metadata["batchllm/rows_failed"].value == 1
        assert metadata["batchllm/rows_succeeded"].value == 39
        assert "batchllm/run/rows_per_s" in metadata
        failed = metadata["batchllm/failed_rows"].value.records[0].data
        assert failed["row_id"] == 7 and failed["error_type"] == "invalid_input"
        checks = {c.check_name: c for c in first.get_asset_check_evaluations()}
        assert not checks["failed_row_rate"].passed  # 1 in 40 is above the 1% warning
        assert checks["row_count_matches_input"].passed
        table = first.output_for_node("churn_scores")
        assert table["churn"].drop(index=7).tolist() == _predictions(1)

        quiet = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
        assert isinstance(quiet, dg.SkipReason) and "still version 1" in quiet.skip_message
        resolver = get_stale_status_resolver(instance, assets)
        assert resolver.get_status(scores.key) == StaleStatus.FRESH

        registry.set_alias("churn", "champion", "2")
        moved = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
        assert [r.asset_selection for r in moved.run_requests] == [[scores.key]]
        (observation,) = moved.asset_events
        assert observation.metadata["batchllm/model/version"].value == "2"
        instance.report_runless_asset_event(observation)  # what the daemon does with it
        resolver = get_stale_status_resolver(instance, assets)
        assert resolver.get_status(scores.key) == StaleStatus.STALE

        rerun = dg.materialize(assets[::2], resources={"llm": llm}, instance=instance)
        metadata = rerun.asset_materializations_for_node("churn_scores")[0].metadata
        assert metadata["batchllm/model/version"].value == "2"
        assert metadata["batchllm/rows_cached"].value == 0  # nothing of version 1 reused
        table = rerun.output_for_node("churn_scores")
        assert table["churn"].drop(index=7).tolist() == _predictions(2)
        assert _predictions(2) != _predictions(1)
        resolver = get_stale_status_resolver(instance, assets)
        assert resolver.get_status(scores.key) == StaleStatus.FRESH


@pytest.mark.slow
def test_partitioned_scores_keep_each_day_apart_and_the_sensor_reruns_each_day(setup):
    registry, features, model_asset, _, _, llm = setup
    days = dg.StaticPartitionsDefinition(DAYS)

    @dg.asset(partitions_def=days)
    def daily_features(context: dg.AssetExecutionContext) -> pd.DataFrame:
        frame = _features()
        return frame[frame["day"] == context.partition_key]

    scores = build_scoring_asset(name="daily_scores", source=daily_features, model="churn",
                                 input_columns=FEATURES, output_column="churn",
                                 model_asset=model_asset, partitions_def=days)
    sensor = build_model_alias_sensor(scores, model_asset)
    with dg.instance_for_test() as instance:
        for day in DAYS:
            result = dg.materialize([daily_features, scores], partition_key=day,
                                    resources={"llm": llm}, instance=instance)
            assert result.success
            rows = result.asset_materializations_for_node("daily_scores")[0].metadata
            assert rows["dagster/row_count"].value == 20
        cursor = sensor(dg.build_sensor_context(instance=instance)).cursor
        registry.set_alias("churn", "champion", "2")
        moved = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
        assert sorted(r.partition_key for r in moved.run_requests) == DAYS
        again = dg.materialize([daily_features, scores], partition_key=DAYS[0],
                               resources={"llm": llm}, instance=instance)
        metadata = again.asset_materializations_for_node("daily_scores")[0].metadata
        assert metadata["batchllm/model/version"].value == "2"
        assert metadata["batchllm/rows_cached"].value == 0


@pytest.mark.slow
def test_the_code_version_follows_the_model_version(setup):
    registry, features, model_asset, scores, _, _ = setup
    rebuilt = build_scoring_asset(name="churn_scores", source=features, model="churn",
                                  input_columns=FEATURES, output_column="churn",
                                  model_asset=model_asset)
    assert rebuilt.code_versions_by_key[rebuilt.key] == scores.code_versions_by_key[scores.key]
    registry.set_alias("churn", "champion", "2")
    moved = build_scoring_asset(name="churn_scores", source=features, model="churn",
                                input_columns=FEATURES, output_column="churn",
                                model_asset=model_asset)
    assert moved.code_versions_by_key[moved.key] != scores.code_versions_by_key[scores.key]
    assert "version 2 when the definitions loaded" in moved.descriptions_by_key[moved.key]


@pytest.mark.slow
def test_observing_a_model_not_registered_yet_records_so_without_failing(tmp_path):
    """Training and observing in one run: the observation may come first (it cannot wait for
    the training step), and is then an observation of no version, not a failed run."""
    from dagster._core.definitions.observe import observe

    from dagster_batchllm.simulator.mlflow_registry import LocalRegistry

    registry = LocalRegistry(tmp_path / "fresh")
    model_asset = build_model_version_asset(name="later_model",
                                            model_uri="models:/later@champion",
                                            registry_uri=registry.uri)
    with dg.instance_for_test() as instance:
        result = observe([model_asset], instance=instance)
        assert result.success
        (event,) = result.get_asset_observation_events()
        observation = event.asset_observation_data.asset_observation
        assert observation.data_version.startswith("unresolved: ")
        assert "later" in observation.metadata["batchllm/model/error"].value
