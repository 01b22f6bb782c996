"""A scoring asset over a model served by a real `mlflow models serve`, whose endpoint declares
what it serves (``served_model_uri``): the metadata names the served version and alias, the
code version follows the model asset's version, and a redeploy on the moved alias is scored
again under the new version while the same version is answered from the ledger."""

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, Endpoint
from dagster_batchllm.factories.scoring import build_model_version_asset, build_scoring_asset

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    ModelServer,
    feature_frame,
    fit_risk_model,
    two_risk_versions,
)

FEATURES = ["f1", "f2"]
ROWS = 60


@dg.asset
def features() -> pd.DataFrame:
    return feature_frame(ROWS, seed=71)


def _definitions(registry):
    """What a code location builds as it loads: the code version covers the version then."""
    model_asset = build_model_version_asset(name="churn_model",
                                            model_uri="models:/churn@champion",
                                            registry_uri=registry.uri)
    scores = build_scoring_asset(name="churn_scores", source=features, model="churn-served",
                                 input_columns=FEATURES, output_column="churn",
                                 model_asset=model_asset)
    return model_asset, scores


def _llm(registry, server, tmp_path) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="scoring", base_url=server.base_url, models=["churn-served"],
                            protocol="mlflow", served_model_uri="models:/churn@champion")],
        mlflow_registry_uri=registry.uri, store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        ledger_flush_interval_s=0.05)


def _scored(scores, llm, instance):
    result = dg.materialize([features, scores], resources={"llm": llm}, instance=instance)
    assert result.success
    metadata = result.asset_materializations_for_node("churn_scores")[0].metadata
    return metadata, result.output_for_node("churn_scores")


@pytest.mark.slow
def test_a_served_scoring_asset_follows_the_served_version(tmp_path):
    registry = two_risk_versions(tmp_path / "registry", "churn")
    expected = {v: fit_risk_model(v).predict(features()).tolist() for v in (1, 2)}
    assert expected[1] != expected[2]
    _, scores = _definitions(registry)
    with dg.instance_for_test() as instance:
        with ModelServer("models:/churn@champion", tracking_uri=registry.uri) as server:
            llm = _llm(registry, server, tmp_path)
            metadata, table = _scored(scores, llm, instance)
            assert table["churn"].tolist() == expected[1]
            assert {k: metadata[f"batchllm/model/{k}"].value for k in
                    ("name", "kind", "version", "alias", "registered_name", "uri")} == {
                "name": "churn-served", "kind": "served", "version": "1",
                "alias": "champion", "registered_name": "churn", "uri": "models:/churn/1"}
            assert metadata["batchllm/rows_cached"].value == 0
            again, _ = _scored(scores, llm, instance)  # the same version: the ledger's
            assert again["batchllm/rows_cached"].value == ROWS

        registry.set_alias("churn", "champion", "2")  # the redeploy
        _, moved = _definitions(registry)
        assert moved.code_versions_by_key[moved.key] != scores.code_versions_by_key[scores.key]
        with ModelServer("models:/churn@champion", tracking_uri=registry.uri) as server:
            metadata, table = _scored(moved, _llm(registry, server, tmp_path), instance)
            assert metadata["batchllm/model/version"].value == "2"
            assert metadata["batchllm/rows_cached"].value == 0  # every row again
            assert table["churn"].tolist() == expected[2]
