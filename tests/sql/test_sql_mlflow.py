"""ai_query on traditional ML models from a real local MLflow registry, in DuckDB and SQLite:
Databricks' custom-model form ``ai_query('<model>', named_struct('f1', a, 'f2', b), returnType
=> 'DOUBLE')`` (as written, through the databricks dialect, and in each engine's own struct
spelling), the seed's plain ``ai_query('my_registered_model', input_text)``, a bad row alone
with failOnError => false, and LLM and model calls in one query."""

from __future__ import annotations

import sqlite3

import duckdb
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec
from dagster_batchllm.sql import execute, register_ai_functions

pytest.importorskip("mlflow")

from dagster_batchllm.simulator.mlflow_registry import (
    LocalRegistry,
    feature_frame,
    fit_intent_model,
    fit_risk_model,
)

DATABRICKS = """SELECT f1, f2, ai_query('risk', named_struct('f1', f1, 'f2', f2),
                                      returnType => 'DOUBLE') AS p
                FROM features ORDER BY row_id"""


@pytest.fixture
def client(mlflow_registry, tmp_path):
    settings = InferenceSettings(
        endpoints=(), mlflow_models=(MlflowModelSpec(name="risk",
                                                     model_uri="models:/risk@champion"),),
        mlflow_registry_uri=mlflow_registry.uri,
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05)
    with InferenceClient(settings) as scoring:
        yield scoring


@pytest.fixture
def features():
    frame = feature_frame(120, seed=51)
    frame.insert(0, "row_id", range(120))
    return frame


def expected(frame) -> list[float]:
    return [float(v) for v in fit_risk_model(1).predict(frame[["f1", "f2"]])]


def test_duckdb_runs_the_documented_custom_model_form(client, features):
    con = duckdb.connect()
    con.register("features", features)
    register_ai_functions(con, client)
    documented = execute(con, DATABRICKS, dialect="databricks").df()
    assert documented["p"].tolist() == expected(features)
    native = con.sql("""SELECT ai_query('risk', {'f1': f1, 'f2': f2}, returnType := 'DOUBLE') AS p
                        FROM features ORDER BY row_id""").df()
    assert native["p"].tolist() == expected(features)
    assert str(con.sql("SELECT ai_query('risk', {'f1': 0.5, 'f2': 0.1}, returnType := 'DOUBLE')"
                       " AS p").types[0]) == "DOUBLE"


def test_sqlite_runs_it_with_json_objects(client, features, tmp_path):
    con = sqlite3.connect(tmp_path / "features.db")
    features.to_sql("features", con, index=False)
    register_ai_functions(con, client)
    rows = execute(con, """SELECT ai_query('risk', json_object('f1', f1, 'f2', f2), 'DOUBLE')
                           FROM features ORDER BY row_id""").fetchall()
    assert [r[0] for r in rows] == expected(features)
    translated = execute(con, DATABRICKS, dialect="databricks").fetchall()
    assert [r[2] for r in translated] == expected(features)


def test_a_row_the_model_rejects_is_its_error_message(client, features):
    con = duckdb.connect()
    frame = features.astype({"f1": object})
    frame.loc[3, "f1"] = "three"
    con.register("features", frame)
    register_ai_functions(con, client)
    out = con.sql("""SELECT ai_query('risk', {'f1': f1, 'f2': f2}, returnType := 'DOUBLE',
                                     failOnError := false) AS p
                     FROM features ORDER BY row_id""").df()["p"]
    errors = [p["errorMessage"] for p in out]
    assert [e is not None for e in errors] == [i == 3 for i in range(120)]
    assert errors[3].startswith("invalid_input: model 'risk' rejected the input")
    good = features.drop(index=3)
    assert [p["result"] for i, p in enumerate(out) if i != 3] == expected(good)


@pytest.mark.slow
def test_the_seeds_plain_request_goes_to_the_models_only_input(tmp_path):
    registry = LocalRegistry(tmp_path / "registry")
    texts = ["i want my money back", "refund please", "this is terrible service",
             "i want to complain", "what are your hours", "where is the store"]
    labels = ["refund", "refund", "complaint", "complaint", "question", "question"]
    import pandas as pd

    registry.log_sklearn("my_registered_model", fit_intent_model(texts, labels),
                         input_example=pd.DataFrame({"text": texts[:2]}), alias="champion")
    settings = InferenceSettings(
        endpoints=(), mlflow_models=(MlflowModelSpec(
            name="my_registered_model", model_uri="models:/my_registered_model@champion"),),
        mlflow_registry_uri=registry.uri, store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    with InferenceClient(settings) as client:
        con = duckdb.connect()
        con.register("my_input_table", pd.DataFrame({"input_text": texts}))
        register_ai_functions(con, client)
        # The seed's SQL, as written.
        out = execute(con, """SELECT input_text, ai_query('my_registered_model', input_text)
                              AS prediction FROM my_input_table""", dialect="databricks").df()
    assert out["prediction"].tolist() == labels


def test_the_documented_struct_request_reaches_the_custom_model(mlflow_registry, qa_bot_models,
                                                                tmp_path):
    from dagster_batchllm.simulator.mlflow_pyfunc import QA_PASSAGES
    from dagster_batchllm.testing.databricks.documented import EXAMPLES

    example = next(e for e in EXAMPLES if e.name == "ai_query: a STRUCT request")
    settings = InferenceSettings(endpoints=(), store_url=f"sqlite:///{tmp_path / 'l.db'}",
                                 **qa_bot_models)
    with InferenceClient(settings) as client:
        con = duckdb.connect()
        register_ai_functions(con, client)
        [(answer,)] = execute(con, example.sql, dialect="databricks").fetchall()
    assert answer == QA_PASSAGES[1]  # the passage about Dolly 2.0
