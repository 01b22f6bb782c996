"""A pyfunc model for tests that counts its own loads: each ``load_context`` appends this
process's id to a file, so a test can tell how often each worker process loaded it.

It imports mlflow at module level: only tests and benchmarks import it."""

from __future__ import annotations

import os
from typing import Any

import mlflow.pyfunc


class LoadCountingModel(mlflow.pyfunc.PythonModel):
    """A fitted scikit-learn model behind pyfunc; ``model_config["load_log"]`` names the file
    each load appends ``<pid> <tag>`` to."""

    def __init__(self, estimator: Any, tag: str):
        self.estimator = estimator
        self.tag = tag

    def load_context(self, context: Any) -> None:
        log = (context.model_config or {}).get("load_log")
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} {self.tag}\n")

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them
        return self.estimator.predict(model_input[["f1", "f2"]])


class RetrievalQAModel(mlflow.pyfunc.PythonModel):
    """A custom model endpoint in the sense of Databricks' ``qa_bot``: it answers each row's
    ``prompt`` with the passage of its knowledge base nearest by TF-IDF cosine similarity (a
    retrieval model: ``temperature`` is accepted and, having nothing to sample, unused)."""

    def __init__(self, passages: list[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.passages = list(passages)
        self.vectorizer = TfidfVectorizer(stop_words="english").fit(self.passages)
        self.matrix = self.vectorizer.transform(self.passages)

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them
        prompts = model_input["prompt"].fillna("").astype(str).tolist()
        scores = (self.vectorizer.transform(prompts) @ self.matrix.T).toarray()
        return [self.passages[int(row.argmax())] for row in scores]

    @staticmethod
    def signature() -> Any:
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, Schema

        return ModelSignature(
            inputs=Schema([ColSpec("string", "prompt"),
                           ColSpec("double", "temperature", required=False)]),
            outputs=Schema([ColSpec("string")]))


QA_PASSAGES = [
    "The Unity Catalog metastore stores metadata about data and AI assets: catalogs, schemas, "
    "tables, views, volumes, models and functions, and the permissions that govern them.",
    "Dolly 2.0 is an open source, instruction-following large language model fine-tuned on a "
    "human-generated instruction dataset licensed for research and commercial use. #Dolly2",
    "Delta Lake adds ACID transactions, schema enforcement and time travel to data lakes.",
    "Model Serving exposes MLflow models as REST endpoints that scale with demand.",
]
