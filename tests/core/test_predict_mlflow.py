"""predict(): scikit-learn models from a real local MLflow registry, scored in process.

Every URI form names the same model and gives its predictions; a row the model rejects fails
alone; a rerun is answered from the ledger; a model column routes each row to its model; a
moved alias scores again under the new version; a wrong call raises before anything runs."""

from __future__ import annotations

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec
from dagster_batchllm.core.tasks.predict.models import load_counts
from dagster_batchllm.core.tasks.predict.resolve import ModelsUnresolvedError

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    feature_frame,
    fit_risk_model,
    two_risk_versions,
)

FEATURES = ["f1", "f2"]


@pytest.fixture
def scoring(mlflow_registry, tmp_path):
    clients = []

    def build(*models: tuple[str, str], registry=None, **overrides) -> InferenceClient:
        registry = registry or mlflow_registry
        settings = InferenceSettings(
            endpoints=(), store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            mlflow_models=tuple(MlflowModelSpec(name=n, model_uri=u) for n, u in models),
            mlflow_registry_uri=registry.uri, ledger_flush_interval_s=0.05,
            progress_interval_s=60.0, **overrides)
        clients.append(InferenceClient(settings))
        return clients[-1]

    yield build
    for client in clients:
        client.close()


def expected(version: int, frame: pd.DataFrame) -> list[int]:
    return fit_risk_model(version).predict(frame[FEATURES]).tolist()


@pytest.mark.slow
def test_every_uri_form_scores_the_registered_model(scoring, mlflow_registry, tmp_path):
    frame = feature_frame(300, seed=7)
    folder = mlflow_registry.local_path("risk", "1", tmp_path / "risk_v1")
    client = scoring(("by_alias", "models:/risk@champion"), ("by_version", "models:/risk/1"),
                     ("by_run", mlflow_registry.run_uri("risk", "1")), ("by_path", folder))
    want = expected(1, frame)
    for name in ("by_alias", "by_version", "by_run", "by_path"):
        result = client.predict(frame, model=name, input_columns=FEATURES, output_column="risk")
        assert result.df["risk"].tolist() == want, name
        assert result.df["risk_error"].isna().all()
        assert result.stats.succeeded == len(frame)
    alias = client.predict(frame, model="by_alias", input_columns=FEATURES,
                           output_column="risk").models["by_alias"]
    assert alias["version"] == "1" and alias["alias"] == "champion"
    assert alias["uri"] == "models:/risk/1" and alias["registered_name"] == "risk"


def test_a_row_the_model_rejects_fails_alone_with_the_models_reason(scoring):
    frame = feature_frame(64, seed=3)
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[17, "f1"] = "not a number"
    client = scoring(("risk", "models:/risk@champion"))
    result = client.predict(frame, model="risk", input_columns=FEATURES, output_column="risk")
    errors = result.df["risk_error"]
    assert errors.notna().tolist() == [i == 17 for i in range(64)]
    assert errors[17].startswith("invalid_input: model 'risk' rejected the input")
    assert "f1" in errors[17]
    assert result.error_types[17] == "invalid_input"
    good = frame.drop(index=17).astype({"f1": float})
    assert result.df["risk"].drop(index=17).tolist() == expected(1, good)


def test_splitting_a_rejected_group_is_no_retry(scoring):
    """One bad row among 72 in one group: the halves sent to find it are requests, not
    retries (the example once reported 142 retries for this)."""
    frame = feature_frame(72, seed=4)
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[40, "f1"] = "forty"
    client = scoring(("risk", "models:/risk@champion"))
    result = client.predict(frame, model="risk", input_columns=FEATURES, output_column="risk",
                            rows_per_request=72)
    stats = result.stats
    assert result.df["risk_error"].notna().tolist() == [i == 40 for i in range(72)]
    assert stats.retries == 0 and stats.failed == 1 and stats.succeeded == 71
    # Every predict() is a request: 72, then halves on the bad row's side down to it (36 + 36,
    # 18 + 18, 9 + 9, 4 + 5, 2 + 3, 1 + 1).
    assert stats.requests == stats.endpoints["in-process"]["requests"] == 13


@pytest.mark.slow
def test_models_saved_in_mlflows_default_skops_format_score(scoring, tmp_path):
    """MLflow 3 saves scikit-learn models with skops unless told otherwise: a plain model and
    a text pipeline (TF-IDF, as the example's) load and score, a bad row failing alone."""
    from mlflow.models import Model

    from dagster_batchllm.simulator.mlflow_registry import LocalRegistry, fit_intent_model

    registry = LocalRegistry(tmp_path / "skops")
    registry.log_sklearn("risk", fit_risk_model(1), input_example=feature_frame(3),
                         serialization_format=None)
    texts = ["refund my order please", "the app broke again", "what are your hours",
             "i want my money back", "this is broken", "when do you open"]
    labels = ["refund", "complaint", "inquiry"] * 2
    registry.log_sklearn("intent", fit_intent_model(texts, labels),
                         input_example=pd.DataFrame({"text": texts[:2]}),
                         serialization_format=None)
    path = registry.local_path("risk", "1", tmp_path / "risk_v1")
    assert Model.load(f"{path}/MLmodel").flavors["sklearn"]["serialization_format"] == "skops"
    client = scoring(("risk", "models:/risk/1"), ("intent", "models:/intent/1"),
                     registry=registry)
    frame = feature_frame(30, seed=8)
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[3, "f1"] = "three"
    risk = client.predict(frame, model="risk", input_columns=FEATURES, output_column="risk")
    assert risk.df["risk_error"].notna().tolist() == [i == 3 for i in range(30)]
    good = frame.drop(index=3).astype({"f1": float})
    assert risk.df["risk"].drop(index=3).tolist() == expected(1, good)
    asked = pd.DataFrame({"text": ["please refund my order", "it broke", "opening hours?"]})
    intent = client.predict(asked, model="intent", input_columns=["text"],
                            output_column="intent")
    assert intent.df["intent_error"].isna().all()
    assert intent.df["intent"].tolist() == \
        fit_intent_model(texts, labels).predict(asked).tolist()


def test_a_rerun_scores_only_the_rows_not_in_the_ledger(scoring):
    frame = feature_frame(500, seed=11)
    client = scoring(("risk", "models:/risk@champion"))
    first = client.predict(frame.head(200), model="risk", input_columns=FEATURES,
                           output_column="risk", partition_key="p")
    assert first.stats.cached == 0 and first.stats.requests >= 1
    again = client.predict(frame, model="risk", input_columns=FEATURES, output_column="risk",
                           partition_key="p")
    assert again.stats.cached == 200 and again.stats.succeeded == 500
    assert again.df["risk"].tolist() == expected(1, frame)
    # Only the 300 new rows went to the model: the in-process scorer counts what it scored.
    assert again.stats.endpoints["in-process"]["rows"] == 300
    assert again.statuses.value_counts()["cached"] == 200


def test_a_model_column_routes_each_row_to_its_model(scoring, mlflow_registry):
    frame = feature_frame(40, seed=5)
    cells = ["champion_model", "models:/risk/2", "nobody-knows-me", None]
    frame["model_uri"] = [cells[i % 4] for i in range(40)]
    client = scoring(("champion_model", "models:/risk@champion"))
    result = client.predict(frame, model_column="model_uri", input_columns=FEATURES,
                            output_column="risk")
    out = result.df
    v1, v2 = out["model_uri"] == "champion_model", out["model_uri"] == "models:/risk/2"
    assert out.loc[v1, "risk"].tolist() == expected(1, frame[v1])
    assert out.loc[v2, "risk"].tolist() == expected(2, frame[v2])
    unknown = out["model_uri"] == "nobody-knows-me"
    assert out.loc[unknown, "risk_error"].str.startswith(
        "unsupported_model: unknown model 'nobody-knows-me'").all()
    assert out.loc[out["model_uri"].isna(), "risk_error"].eq(
        "invalid_input: model column 'model_uri' is empty").all()
    assert result.models["models:/risk/2"]["version"] == "2"
    # One predict() per model: each group holds only its model's rows.
    assert result.stats.endpoints["in-process"]["requests"] == 2


@pytest.mark.slow
def test_a_moved_alias_scores_under_the_new_version_and_keeps_the_old_answers(
        scoring, tmp_path):
    registry = two_risk_versions(tmp_path / "own-registry", "churn")
    client = scoring(("churn", "models:/churn@champion"), registry=registry)
    frame = feature_frame(200, seed=9)
    first = client.predict(frame, model="churn", input_columns=FEATURES, output_column="p")
    assert first.models["churn"]["version"] == "1"
    registry.set_alias("churn", "champion", "2")
    moved = client.predict(frame, model="churn", input_columns=FEATURES, output_column="p")
    assert moved.models["churn"]["version"] == "2"
    assert moved.stats.cached == 0  # no answer of version 1 stands in for version 2
    assert moved.df["p"].tolist() == expected(2, frame) != expected(1, frame)
    registry.set_alias("churn", "champion", "1")  # moved back: version 1's answers still hold
    back = client.predict(frame, model="churn", input_columns=FEATURES, output_column="p")
    assert back.stats.cached == 200 and back.df["p"].tolist() == expected(1, frame)


def test_scoring_leaves_mlflows_process_settings_as_they_were(scoring, monkeypatch):
    import os

    import mlflow

    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///somewhere-else.db")
    before = mlflow.get_tracking_uri()
    client = scoring(("risk", "models:/risk/2"))
    client.predict(feature_frame(5), model="risk", input_columns=FEATURES)
    assert "MLFLOW_REGISTRY_URI" not in os.environ
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///somewhere-else.db"
    assert mlflow.get_tracking_uri() == before


def test_each_model_is_loaded_once_per_process(scoring):
    client = scoring(("risk", "models:/risk@champion"))
    for seed in range(3):
        client.predict(feature_frame(50, seed=100 + seed), model="risk", input_columns=FEATURES,
                       output_column="risk", rows_per_request=8)
    # Other tests' registries hold a risk v1 of their own: each is loaded once in the process.
    loaded = [n for identity, n in load_counts.items() if identity.startswith("models:/risk/1|")]
    assert loaded and all(n == 1 for n in loaded), loaded


def test_wrong_calls_raise_before_anything_is_scored(scoring, tmp_path):
    client = scoring(("risk", "models:/risk@champion"), ("gone", "models:/risk@nope"))
    frame = feature_frame(5)
    with pytest.raises(InferenceConfigError, match=r"(?i)column\(s\) \['f3'\]"):
        client.predict(frame, model="risk", input_columns=["f1", "f3"], output_column="r")
    with pytest.raises(InferenceConfigError, match="signature needs input"):
        client.predict(frame, model="risk", input_columns=["f1"], output_column="r")
    with pytest.raises(InferenceConfigError, match="unknown model 'elsewhere'"):
        client.predict(frame, model="elsewhere", input_columns=FEATURES, output_column="r")
    with pytest.raises(InferenceConfigError, match="'gone' .* cannot be resolved"):
        client.predict(frame, model="gone", input_columns=FEATURES, output_column="r")
    with pytest.raises(InferenceConfigError, match="model= .* or model_column="):
        client.predict(frame, input_columns=FEATURES, output_column="r")
    # A model column whose every model is unusable: no row could be scored, so it raises too
    # (one usable model among them, and only the other rows fail: see the test above).
    frame["model"] = ["gone", "elsewhere", "gone", None, "models:/nobody@champion"]
    with pytest.raises(ModelsUnresolvedError, match=r"no model that model column 'model' "
                                                    r"names can be used \(3 named\)") as info:
        client.predict(frame, model_column="model", input_columns=FEATURES, output_column="r")
    assert set(info.value.problems) == {"gone", "elsewhere", "models:/nobody@champion"}
    frame = feature_frame(5)
    with pytest.raises(InferenceConfigError, match="no MLmodel file"):
        client.predict(frame, model=str(tmp_path / "empty"), input_columns=FEATURES,
                       output_column="r")
    with pytest.raises(InferenceConfigError, match="unknown argument"):
        client.predict(frame, model="risk", input_columns=FEATURES, prompt="Summarize: {f1}")
