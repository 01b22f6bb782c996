"""The seed's two Spark patterns against ours, over a real local MLflow registry in Spark local
mode: ``mlflow.pyfunc.spark_udf`` + ``withColumn`` and ``groupBy(model).applyInPandas`` with
``mlflow.pyfunc.load_model`` per group give the same predictions as ``model_udf`` and
``predict_grouped`` row for row; ours load each model once per Python worker (counted by the
model itself), a bad row fails alone; by default nothing is kept (as spark_udf), and with
``use_ledger=True`` a rerun is answered from the ledger."""

from __future__ import annotations

import collections

import pandas as pd
import pytest

pytest.importorskip("mlflow")

import mlflow
import mlflow.pyfunc

from dagster_batchllm.core.settings import InferenceSettings, MlflowModelSpec
from dagster_batchllm.simulator.mlflow_registry import (
    feature_frame,
    fit_risk_model,
)
from dagster_batchllm.spark import model_udf, predict_grouped

FEATURES = ["f1", "f2"]


@pytest.fixture
def settings(mlflow_registry, tmp_path):
    return InferenceSettings(
        endpoints=(), mlflow_models=(MlflowModelSpec(name="risk",
                                                     model_uri="models:/risk@champion"),),
        mlflow_registry_uri=mlflow_registry.uri,
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05)


def _frame(rows: int, seed: int) -> pd.DataFrame:
    frame = feature_frame(rows, seed=seed)
    frame.insert(0, "row_id", range(rows))
    return frame


def test_model_udf_matches_mlflow_spark_udf_row_for_row(spark, settings, mlflow_registry):
    from dagster_batchllm.core.tasks.predict.models import mlflow_uris

    df = spark.createDataFrame(_frame(600, seed=41)).repartition(3)

    # The seed's pattern, as the document writes it (over the feature columns); spark_udf
    # downloads the model here and ships it to the executors.
    with mlflow_uris(mlflow_registry.uri):
        predict_udf = mlflow.pyfunc.spark_udf(spark, model_uri="models:/risk/1",
                                              env_manager="local")
    seed = df.withColumn("prediction", predict_udf(*FEATURES)).toPandas()

    from dagster_batchllm.core.ledger.table import Ledger

    ours = df.withColumn("prediction", model_udf(spark, "risk", settings)(*FEATURES))
    ours = ours.select("row_id", "prediction.result", "prediction.errorMessage").toPandas()
    merged = seed.merge(ours, on="row_id")
    assert len(merged) == 600
    assert merged["prediction"].tolist() == merged["result"].tolist()
    assert merged["errorMessage"].isna().all()
    assert len(Ledger(settings.store_url).records()) == 0  # the default keeps nothing

    keyed = df.withColumn("p", model_udf(spark, "risk", settings, use_ledger=True)(*FEATURES))
    keyed = keyed.select("row_id", "p.result").toPandas().merge(seed, on="row_id")
    assert keyed["result"].tolist() == keyed["prediction"].tolist()
    records = Ledger(settings.store_url).records()
    assert len(records) == 600 and (records["status"] == "ok").all()
    again = df.withColumn("p", model_udf(spark, "risk", settings, use_ledger=True)(*FEATURES))
    assert again.where("p.errorMessage IS NULL").count() == 600  # from the ledger, same rows
    after = Ledger(settings.store_url).records().set_index("request_key")["updated_at"]
    assert after.equals(records.set_index("request_key")["updated_at"].loc[after.index])


def test_a_served_model_without_the_ledger_is_refused_before_anything_is_sent(spark, tmp_path):
    from dagster_batchllm.core.errors import InferenceConfigError
    from dagster_batchllm.core.settings import EndpointSpec

    # Nothing listens on port 9: were a row sent, it would fail as unreachable, not raise.
    served = InferenceSettings(endpoints=(EndpointSpec(
        name="scoring", base_url="http://127.0.0.1:9", models=("risk-served",),
        protocol="mlflow"),), store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    with pytest.raises(InferenceConfigError, match="served by an mlflow endpoint: pass "
                                                   "use_ledger=True"):
        model_udf(spark, "risk-served", served)(*FEATURES)
    frame = _frame(5, seed=40)
    frame["model"] = "risk-served"
    with pytest.raises(InferenceConfigError, match="use_ledger=True"):
        predict_grouped(spark.createDataFrame(frame), model_column="model",
                        input_columns=FEATURES, llm=served)


def test_a_result_type_arrow_cannot_hold_is_refused_when_the_column_is_made(spark, settings):
    from dagster_batchllm.core.errors import InferenceConfigError

    with pytest.raises(InferenceConfigError, match="result_type 'no such type' is not a Spark "
                                                   "type"):
        model_udf(spark, "risk", settings, result_type="no such type")(*FEATURES)


@pytest.mark.parametrize("use_ledger", [True, False])
def test_a_row_the_model_rejects_fails_alone_in_spark(spark, settings, use_ledger):
    frame = _frame(50, seed=42).astype({"f1": object})
    frame.loc[10, "f1"] = None  # LogisticRegression rejects a missing value
    df = spark.createDataFrame(frame, "row_id long, f1 double, f2 double").coalesce(1)
    predict = model_udf(spark, "risk", settings, use_ledger=use_ledger)
    out = df.withColumn("p", predict("f1", "f2")).toPandas()
    errors = out.set_index("row_id")["p"].map(lambda p: p["errorMessage"])
    assert errors.notna().tolist() == [i == 10 for i in range(50)]
    assert errors[10].startswith("invalid_input: model 'risk' rejected the input")
    assert out.set_index("row_id")["p"][10]["result"] is None  # null, not NaN
    good = frame.drop(index=10).astype({"f1": float})
    assert out.set_index("row_id").drop(index=10)["p"].map(
        lambda p: p["result"]).tolist() == fit_risk_model(1).predict(good[FEATURES]).tolist()


@pytest.fixture
def counting_models(mlflow_registry, tmp_path):
    """Three registered pyfunc models (each a scikit-learn model) that log every load."""
    from dagster_batchllm.simulator.mlflow_pyfunc import LoadCountingModel

    log = tmp_path / "loads.log"
    paths = {}
    for tag, version in (("north", 1), ("south", 2), ("west", 1)):
        name = f"team_{tag}"
        got = mlflow_registry.log_pyfunc(
            name, LoadCountingModel(fit_risk_model(version), tag),
            input_example=feature_frame(2), model_config={"load_log": str(log)})
        paths[tag] = mlflow_registry.local_path(name, got, tmp_path / name)
    return paths, log


def _loads(log) -> collections.Counter:
    if not log.exists():
        return collections.Counter()
    return collections.Counter(tuple(line.split()) for line in log.read_text().splitlines())


def test_predict_grouped_matches_the_seeds_apply_in_pandas_and_loads_once_per_worker(
        spark, settings, counting_models):
    paths, log = counting_models
    frame = _frame(900, seed=43)
    teams = list(paths)
    frame["model_path"] = [paths[teams[i % 3]] for i in range(900)]
    df = spark.createDataFrame(frame)

    def run_inference(pdf):  # the seed's function, features selected by name
        model_path = pdf["model_path"].iloc[0]
        model = mlflow.pyfunc.load_model(model_path)
        pdf["prediction"] = model.predict(pdf[FEATURES]).astype("float64")
        return pdf

    from pyspark.sql.types import DoubleType, StructField, StructType

    schema = StructType([*df.schema.fields, StructField("prediction", DoubleType())])
    log.unlink(missing_ok=True)  # logging a model loads it once too
    seed = df.groupBy("model_path").applyInPandas(run_inference, schema=schema).toPandas()
    seed_loads = _loads(log)
    assert sum(seed_loads.values()) == 3  # one group per model, one load per group
    log.unlink()

    from dagster_batchllm.core.ledger.table import Ledger

    ours = predict_grouped(df, model_column="model_path", input_columns=FEATURES, llm=settings,
                           output_column="pred", buckets_per_model=4).toPandas()
    assert len(Ledger(settings.store_url).records()) == 0  # the default keeps nothing
    merged = seed.merge(ours[["row_id", "pred"]], on="row_id")
    assert len(merged) == 900
    assert merged["prediction"].tolist() == merged["pred"].map(lambda p: p["result"]).tolist()
    assert merged["pred"].map(lambda p: p["errorMessage"]).isna().all()
    # 12 groups (3 models x 4 buckets) over 2 worker slots: each model loaded once per worker
    # process that scored it, never per group.
    loads = _loads(log)
    assert loads and set(loads.values()) == {1}  # no worker loaded a model twice
    assert {tag for _, tag in loads} == set(teams)
    assert sum(loads.values()) < 12  # fewer loads than groups: the workers kept them

    keyed = predict_grouped(df, model_column="model_path", input_columns=FEATURES,
                            llm=settings, output_column="pred", buckets_per_model=4,
                            use_ledger=True)
    assert keyed.where("pred.errorMessage IS NULL").count() == 900
    assert set(_loads(log).values()) == {1}  # the workers kept their models
    records = Ledger(settings.store_url).records()
    assert len(records) == 900 and set(records["model"]) == set(paths.values())


def test_spark_sql_ai_query_on_a_registered_model_with_named_struct(spark, settings):
    from dagster_batchllm.spark import register_ai_functions

    frame = _frame(200, seed=44)
    spark.createDataFrame(frame).createOrReplaceTempView("features")
    register_ai_functions(spark, settings)
    out = spark.sql("""SELECT row_id, ai_query('risk', named_struct('f1', f1, 'f2', f2),
                                          returnType => 'DOUBLE') AS p
                       FROM features""").toPandas().sort_values("row_id")
    assert out["p"].tolist() == fit_risk_model(1).predict(frame[FEATURES]).astype(float).tolist()
    checked = spark.sql("""SELECT ai_query('risk', named_struct('f1', f1, 'f2', f2),
                                           returnType => 'DOUBLE', failOnError => false) AS p
                           FROM features""")
    assert checked.schema["p"].dataType.simpleString() == \
        "struct<result:double,errorMessage:string>"
    assert checked.where("p.errorMessage IS NULL").count() == 200


def test_model_udf_and_predict_share_the_ledger_and_a_rerun_scores_nothing(spark, settings):
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.ledger.table import Ledger

    frame = _frame(400, seed=45)
    with InferenceClient(settings) as client:  # predict() scores the first 150 rows
        client.predict(frame.head(150), model="risk", input_columns=FEATURES, run_id="predict")
    df = spark.createDataFrame(frame).repartition(2)
    out = df.withColumn("p", model_udf(spark, "risk", settings, run_id="udf",
                                       use_ledger=True)(*FEATURES))
    out = out.select("row_id", "p.result", "p.errorMessage").toPandas().sort_values("row_id")
    assert out["result"].tolist() == fit_risk_model(1).predict(frame[FEATURES]).tolist()
    assert out["errorMessage"].isna().all()
    records = Ledger(settings.store_url).records()
    # Every row in the ledger once; the 150 predict() scored were not scored again.
    assert len(records) == 400 and (records["status"] == "ok").all()
    assert records["run_id"].value_counts().to_dict() == {"udf": 250, "predict": 150}
    written = records.set_index("request_key")["updated_at"]
    df.withColumn("p", model_udf(spark, "risk", settings, run_id="rerun",
                                 use_ledger=True)(*FEATURES)) \
        .write.format("noop").mode("overwrite").save()
    after = Ledger(settings.store_url).records().set_index("request_key")
    assert "rerun" not in set(after["run_id"])  # nothing scored, nothing rewritten
    assert after["updated_at"].equals(written.loc[after.index])
    with InferenceClient(settings) as client:  # and predict() takes model_udf's answers
        again = client.predict(frame, model="risk", input_columns=FEATURES)
    assert again.stats.cached == 400


def test_model_udf_on_a_served_model_keys_its_declared_version_as_predict_does(
        spark, mlflow_registry, tmp_path):
    """Served through the pool from the executors with the driver's resolution of the
    endpoint's served_model_uri: predict() afterwards finds every row under the same keys."""
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec
    from dagster_batchllm.simulator.mlflow_registry import ModelServer

    frame = _frame(300, seed=46)
    with ModelServer("models:/risk/1", tracking_uri=mlflow_registry.uri) as server:
        served = InferenceSettings(
            endpoints=(EndpointSpec(name="scoring", base_url=server.base_url,
                                    models=("risk-served",), protocol="mlflow",
                                    served_model_uri="models:/risk/1"),),
            mlflow_registry_uri=mlflow_registry.uri,
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", ledger_flush_interval_s=0.05)
        predict = model_udf(spark, "risk-served", served, use_ledger=True,
                            rows_per_request=100)
        out = spark.createDataFrame(frame).repartition(2).withColumn("p", predict(*FEATURES))
        out = out.select("row_id", "p.result", "p.errorMessage").toPandas().sort_values("row_id")
        assert out["result"].tolist() == fit_risk_model(1).predict(frame[FEATURES]).tolist()
        assert out["errorMessage"].isna().all()
        with InferenceClient(served) as client:
            again = client.predict(frame, model="risk-served", input_columns=FEATURES)
    assert again.stats.cached == 300 and again.stats.requests == 0
    assert again.models["risk-served"]["version"] == "1"


def test_a_double_column_is_one_array_and_anything_else_goes_row_by_row():
    import numpy as np

    from dagster_batchllm.spark.model_worker import _as_column, _as_type

    column = _as_column([1, 0.5, None, True, "2.5"], "double")
    assert column.dtype == np.float64 and np.isnan(column[2])
    assert column[[0, 1, 3, 4]].tolist() == [_as_type(v, "double") for v in (1, 0.5, True, "2.5")]
    # Rows of lists, text that is no number, other result types: each row as _as_type has it.
    assert _as_column([[0.1, 0.9], [0.2, 0.8]], "double") is None
    assert _as_column([0.1, "high"], "double") is None
    assert _as_column([1, 2], "bigint") is None


def test_model_udf_over_one_feature_column(spark, mlflow_registry, qa_bot_models, tmp_path):
    """One feature reaches the worker as a Series, not a tuple of them (Spark's iterator UDF
    passes a lone column as it is): the custom QA model over its one required input."""
    from dagster_batchllm.core.tasks.predict.models import mlflow_uris

    settings = InferenceSettings(endpoints=(), store_url=f"sqlite:///{tmp_path / 'l.db'}",
                                 **qa_bot_models)
    prompts = pd.DataFrame({"prompt": ["How do I get a refund?", "Where is my order?",
                                       "Can I change my delivery address?"] * 20})
    df = spark.createDataFrame(prompts).repartition(2)
    out = df.withColumn("answer", model_udf(spark, "qa_bot", settings, result_type="string")(
        "prompt")).toPandas()
    with mlflow_uris(mlflow_registry.uri):
        expected = mlflow.pyfunc.load_model("models:/qa_bot@champion").predict(
            out[["prompt"]])
    assert out["answer"].map(lambda cell: cell["result"]).tolist() == list(expected)
    assert out["answer"].map(lambda cell: cell["errorMessage"]).isna().all()
