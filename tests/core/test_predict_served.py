"""predict() against a model served by the real `mlflow models serve` (MLflow's scoring
protocol, POST /invocations with dataframe_split, dataframe_records or inputs) through the
endpoint pool: many rows per request, a bad row fails alone with the server's reason, served
and in-process models in one call, reruns from the ledger."""

from __future__ import annotations

import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings, MlflowModelSpec

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    ModelServer,
    feature_frame,
    fit_risk_model,
)

# Outside the fast tier: the module starts `mlflow models serve` before its first test (about 5 s).
pytestmark = pytest.mark.slow
FEATURES = ["f1", "f2"]


@pytest.fixture(scope="module")
def server(mlflow_registry):
    with ModelServer("models:/risk/1", tracking_uri=mlflow_registry.uri) as served:
        yield served


@pytest.fixture
def client(server, mlflow_registry, tmp_path):
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="scoring", base_url=server.base_url,
                                models=("risk-served",), protocol="mlflow", max_concurrency=2),),
        mlflow_models=(MlflowModelSpec(name="challenger", model_uri="models:/risk@challenger"),),
        mlflow_registry_uri=mlflow_registry.uri,
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05,
        retry_initial_backoff_s=0.01, retry_max_backoff_s=0.05, progress_interval_s=60.0)
    with InferenceClient(settings) as scoring:
        yield scoring


@pytest.mark.slow
@pytest.mark.parametrize("input_format", ["dataframe_split", "dataframe_records", "inputs"])
def test_a_served_model_answers_many_rows_per_request_through_the_pool(client, input_format):
    frame = feature_frame(1000, seed=21)
    result = client.predict(frame, model="risk-served", input_columns=FEATURES,
                            output_column="risk", rows_per_request=200,
                            input_format=input_format)
    assert result.df["risk"].tolist() == fit_risk_model(1).predict(frame).tolist()
    assert result.df["risk_error"].isna().all()
    # 1000 rows in requests of up to 200 (a group not full goes after a few ms' linger)
    assert 5 <= result.stats.requests <= 8
    assert result.stats.endpoints["scoring"]["requests"] == result.stats.requests
    assert result.models["risk-served"]["kind"] == "served"
    again = client.predict(frame, model="risk-served", input_columns=FEATURES,
                           output_column="risk", rows_per_request=200,
                           input_format=input_format)
    assert again.stats.requests == 0 and again.stats.cached == 1000


def test_a_row_the_server_rejects_fails_alone_with_its_reason(client):
    frame = feature_frame(32, seed=22)
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[5, "f1"] = "five"
    result = client.predict(frame, model="risk-served", input_columns=FEATURES,
                            output_column="risk")
    errors = result.df["risk_error"]
    assert errors.notna().tolist() == [i == 5 for i in range(32)]
    assert errors[5].startswith("bad_request:") and "could not convert string to float" \
        in errors[5]
    good = frame.drop(index=5).astype({"f1": float})
    assert result.df["risk"].drop(index=5).tolist() == fit_risk_model(1).predict(good).tolist()


def test_one_call_routes_rows_to_served_and_in_process_models(client):
    frame = feature_frame(60, seed=23)
    frame["model"] = ["risk-served" if i % 3 else "challenger" for i in range(60)]
    result = client.predict(frame, model_column="model", input_columns=FEATURES,
                            output_column="risk")
    served = frame["model"] == "risk-served"
    assert result.df.loc[served, "risk"].tolist() == \
        fit_risk_model(1).predict(frame.loc[served, FEATURES]).tolist()
    assert result.df.loc[~served, "risk"].tolist() == \
        fit_risk_model(2).predict(frame.loc[~served, FEATURES]).tolist()
    assert set(result.stats.endpoints) == {"scoring", "in-process"}


def test_a_scoring_endpoint_is_no_chat_model(client):
    frame = feature_frame(2)
    frame["text"] = ["a", "b"]
    with pytest.raises(InferenceConfigError):
        client.infer(frame, prompt="Summarize: {text}", model="risk-served")
