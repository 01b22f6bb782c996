"""Traditional ML next to the LLMs: a model trained from the shipped calls, in a local MLflow
registry, scoring every day's cleaned transcripts.

* ``action_required_models`` trains TF-IDF + logistic regression predicting the call's
  ``action_required`` (Refund Request / Complaint / General Inquiry) from the cleaned
  transcript, on the shipped dataset's labelled calls of the first week: one model over all
  calls (registered ``action_required``) and one per agent team (``action_required_<team>``,
  the many-models pattern), each logged to the registry under ``data/mlflow/`` and aliased
  ``champion``.
* ``action_required_champion`` observes which version ``champion`` points at; the scoring
  assets depend on it, so moving the alias (``MlflowClient().set_registered_model_alias``)
  marks them stale, and the ``predicted_actions_model_alias`` sensor re-scores.
* ``predicted_actions`` scores each day with the champion in process; ``predicted_actions_by_team``
  routes each call to its agent's team model (a model column, as Databricks'
  ``groupBy("model_id").applyInPandas`` does).
"""

import os
import re

import dagster as dg
import pandas as pd

from dagster_batchllm import (
    build_model_alias_sensor,
    build_model_version_asset,
    build_scoring_asset,
)
from dagster_batchllm.core.tasks.predict.models import mlflow_uris
from dagster_batchllm.core.tasks.predict.registry import ready_registry
from resources.mlflow_registry import ACTION_MODEL as MODEL
from resources.mlflow_registry import ARTIFACTS_URI, MLFLOW_DIR, REGISTRY_URI
from resources.warehouse import DATASET

from .partitions import daily_partitions
from .pipeline import LLM, cleaned_transcripts

TEAMS = {
    "north": ["Maria Lopez", "James Carter", "Aisha Khan", "Tom Becker"],
    "south": ["Priya Nair", "Daniel Kim", "Sofia Rossi", "Marcus Reed"],
    "west": ["Elena Petrova", "Kevin O'Brien", "Grace Liu", "Omar Haddad"],
}
TEAM_OF = {agent: team for team, agents in TEAMS.items() for agent in agents}
TRAINING_DAYS = 7  # the first week's calls train; every day is scored
_NOT_LETTER_OR_SPACE = re.compile(r"[^a-zA-Z\s]")


def team_model_uri(team: str) -> str:
    return f"models:/{MODEL}_{team}@champion"


def training_calls() -> pd.DataFrame:
    """The shipped calls of the first week that carry a label, cleaned as the pipeline does."""
    calls = pd.read_csv(DATASET)
    days = pd.to_datetime(calls["call_timestamp"]).dt.normalize()
    calls = calls[(days < days.min() + pd.Timedelta(days=TRAINING_DAYS))
                  & calls["expected_action_required"].notna()]
    return pd.DataFrame({
        "transcript_text": calls["transcript_raw_text"].map(
            lambda t: _NOT_LETTER_OR_SPACE.sub("", t).lower()),
        "action_required": calls["expected_action_required"],
        "team": calls["agent"].map(TEAM_OF),
    })


def _fit(texts: pd.Series, labels: pd.Series):
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    model = Pipeline([
        ("tfidf", ColumnTransformer(
            [("words", TfidfVectorizer(ngram_range=(1, 2), min_df=2), "transcript_text")])),
        ("classify", LogisticRegression(max_iter=2000)),
    ])
    return model.fit(pd.DataFrame({"transcript_text": texts}), labels)


def _register(client, experiment_id: str, name: str, model, example: pd.DataFrame,
              accuracy: float) -> str:
    import mlflow
    import mlflow.sklearn

    # The registry's URI for this block only (mlflow.set_tracking_uri would also export it).
    with mlflow_uris(REGISTRY_URI):
        with mlflow.start_run(experiment_id=experiment_id, run_name=name):
            mlflow.log_metric("training_accuracy", accuracy)
            # MLflow 3's default format, skops: no pickle; a load refuses types it does not trust.
            info = mlflow.sklearn.log_model(model, name="model", input_example=example)
        if not client.search_registered_models(filter_string=f"name = '{name}'"):
            client.create_registered_model(name)
        version = client.create_model_version(name, info.model_uri, run_id=info.run_id).version
    client.set_registered_model_alias(name, "champion", version)
    return str(version)


@dg.asset(group_name="ml_models", kinds={"mlflow", "scikitlearn"},
          description="Trains TF-IDF + logistic regression models of action_required from the "
          "first week's labelled calls (one overall, one per agent team), registers each in "
          "the local MLflow registry and points its `champion` alias at the new version.")
def action_required_models(context: dg.AssetExecutionContext) -> pd.DataFrame:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    os.makedirs(MLFLOW_DIR, exist_ok=True)
    # The champion's observation may be opening the fresh registry in another step right now.
    ready_registry(REGISTRY_URI)
    client = MlflowClient(REGISTRY_URI, REGISTRY_URI)
    experiment = client.get_experiment_by_name("call_center_models")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        "call_center_models", artifact_location=ARTIFACTS_URI)
    calls = training_calls()
    groups = [(MODEL, calls)] + [(f"{MODEL}_{team}", calls[calls["team"] == team])
                                 for team in TEAMS]
    rows = []
    for name, part in groups:
        model = _fit(part["transcript_text"], part["action_required"])
        accuracy = float((model.predict(part[["transcript_text"]])
                          == part["action_required"]).mean())
        version = _register(client, experiment_id, name, model,
                            part[["transcript_text"]].head(3), accuracy)
        rows.append({"model": name, "version": version, "training_rows": len(part),
                     "training_accuracy": round(accuracy, 4)})
        context.log.info(f"registered {name} version {version} ({len(part)} calls)")
    table = pd.DataFrame(rows)
    context.add_output_metadata({"registry": REGISTRY_URI,
                                 "models": dg.MetadataValue.json(rows)})
    return table


action_required_champion = build_model_version_asset(
    name="action_required_champion", model_uri=f"models:/{MODEL}@champion",
    registry_uri=REGISTRY_URI, group_name="ml_models")


def with_team_model(df: pd.DataFrame) -> pd.DataFrame:
    """Each call's model: its agent's team's champion."""
    return df.assign(team_model=df["agent"].map(lambda a: team_model_uri(TEAM_OF.get(a, "?"))))


SCORED_DAILY = dict(
    source=cleaned_transcripts, input_columns=["transcript_text"],
    partitions_def=daily_partitions, partition_column="call_date", key_columns=["call_id"],
    group_name="ml_models", deps=[action_required_models], resource=LLM,
    # About 2% of the shipped calls have no transcript: they fail as input errors.
    warn_failed_rate=0.05,
)

predicted_actions = build_scoring_asset(
    name="predicted_actions", model=MODEL, output_column="predicted_action",
    model_asset=action_required_champion, **SCORED_DAILY)

predicted_actions_by_team = build_scoring_asset(
    name="predicted_actions_by_team", model_column="team_model",
    output_column="predicted_action", prepare=with_team_model, **SCORED_DAILY)

predicted_actions_alias_sensor = build_model_alias_sensor(
    predicted_actions, action_required_champion, name="predicted_actions_model_alias")

ml_assets = [action_required_models, action_required_champion, predicted_actions,
             predicted_actions_by_team]
