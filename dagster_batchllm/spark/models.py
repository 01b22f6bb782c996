"""Traditional ML models (MLflow) on Spark DataFrames: the seed's two patterns as one-liners.

* :func:`model_udf` is ``mlflow.pyfunc.spark_udf``: ``predict = model_udf(spark, "risk", llm)``
  then ``df.withColumn("prediction", predict("f1", "f2"))``. Each Arrow batch is one
  ``predict`` with the model loaded once per Python worker, and a row the model rejects fails
  alone with its reason.
* :func:`predict_grouped` is ``df.groupBy("model_id").applyInPandas(run_inference, ...)``
  for tables whose rows name their model (a configured name, or a URI such as
  ``models:/churn_eu@champion``): one group per model (``buckets_per_model`` spreads a large
  model's rows over more groups), each model loaded once per worker process.

Both keep nothing by default, as ``spark_udf`` (a rerun scores every row again: for a model this
cheap the ledger's bookkeeping costs more than the model). ``use_ledger=True`` keys every
prediction in the ledger by model version and input row: a retried task or a rerun scores only
what is missing, and ``predict()`` and these answer each other's rows; served models (an
``mlflow`` endpoint) need it, their rows going through the engine's pool.

Models are resolved on the driver (an alias read from the registry once, so every executor
scores the same version) and the request keys cover that version: a moved alias scores afresh.
With ``fail_on_error=False`` (the default) the column is ``struct<result: <result_type>,
errorMessage: string>``; with ``True`` it is the prediction itself and a failed row fails the
task (with the ledger, after the answered rows are written to it).

Example::

    from dagster_batchllm.spark import model_udf, predict_grouped

    predict = model_udf(spark, "models:/risk@champion", llm)   # llm: the resource or settings
    scored = df.withColumn("risk", predict("f1", "f2"))
    scored.select("risk.result", "risk.errorMessage")
    resumable = model_udf(spark, "risk", llm, use_ledger=True)  # a rerun scores only new rows
    per_model = predict_grouped(df, model_column="model_uri", input_columns=["f1", "f2"],
                                llm=llm, output_column="risk")
"""

from __future__ import annotations

from typing import Any

from ..core import InferenceConfigError, PredictCall, resolve_models
from .job import split_for_slots
from .model_worker import (
    ERROR_FIELD,
    RESULT_FIELD,
    ModelJob,
    columns_function,
    group_function,
)
from .session import as_settings, default_task_slots
from .worker_python import align_worker_python

_BUCKET = "_batchllm_bucket"


def _job(spark: Any, llm: Any, call: PredictCall, refs: list[str], *, result_type: str,
         fail_on_error: bool, run_id: str | None, task_slots: int | None,
         use_ledger: bool) -> ModelJob:
    """The executors' job: models resolved here (a model ``call.model`` names that cannot be
    used raises now, as does a served model without the ledger), endpoint limits split over
    the task slots."""
    settings = as_settings(llm)
    models = resolve_models(settings, refs)
    if call.model is not None and models[call.model].error:
        raise InferenceConfigError(models[call.model].error)
    served = sorted(name for name, m in models.items() if m.served)
    if served and not use_ledger:
        # Their rows go through the engine's pool (limits, retries, breakers), which answers
        # through the ledger: refused here rather than every row failing on the executors.
        raise InferenceConfigError(
            f"{served} {'is' if len(served) == 1 else 'are'} served by an mlflow endpoint: "
            "pass use_ledger=True (served rows go through the pool and the ledger)")
    slots = task_slots or default_task_slots(spark)
    settings = split_for_slots(settings, slots).replace(coordinate_runs=False)
    align_worker_python(spark)
    return ModelJob(settings=settings, call=call, models=tuple(models.items()),
                    result_type=result_type, fail_on_error=fail_on_error, run_id=run_id,
                    use_ledger=use_ledger)


def _output_type(result_type: str, fail_on_error: bool) -> str:
    return result_type if fail_on_error else \
        f"struct<{RESULT_FIELD}: {result_type}, {ERROR_FIELD}: string>"


def model_udf(spark: Any, model: str, llm: Any, *, result_type: str = "double",
              fail_on_error: bool = False, rows_per_request: int | None = None,
              partition_key: str | None = None, scope: str | None = None,
              run_id: str | None = None, task_slots: int | None = None,
              use_ledger: bool = False):
    """A function of feature columns giving the model's prediction column, like the UDF
    ``mlflow.pyfunc.spark_udf(spark, model_uri, result_type)`` returns. The columns passed
    (names or Columns) are the model's features, named as the columns are.

    ``use_ledger=False`` (the default) keeps nothing, as spark_udf: each Arrow batch is one
    plain ``predict``, a rejected row still failing alone with its reason. ``use_ledger=True``
    keys every prediction in the ledger (model version and input row): a retried task or a
    rerun scores only rows without an answer, ``predict()`` takes these answers and these take
    its; it costs a ledger write per distinct row (several microseconds, and SQLite takes one
    writer at a time), more than a cheap model's predict. Served models need
    ``use_ledger=True``."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf

    def predict(*columns: Any) -> Any:
        if not columns:
            raise InferenceConfigError("pass the feature columns: predict('f1', 'f2')")
        cols = [c if isinstance(c, Column) else F.col(c) for c in columns]
        names = [c if isinstance(c, str) else _column_name(c) for c in columns]
        call = PredictCall(input_columns=tuple(names), model=model, output_column="prediction",
                           rows_per_request=rows_per_request, partition_key=partition_key or "",
                           scope=scope or "")
        job = _job(spark, llm, call, [model], result_type=result_type,
                   fail_on_error=fail_on_error, run_id=run_id, task_slots=task_slots,
                   use_ledger=use_ledger)
        udf = arrow_udf(columns_function(job, names, _arrow_type(result_type)),
                        _output_type(result_type, fail_on_error)).asNondeterministic()
        return udf(*cols)

    return predict


def _arrow_type(result_type: str) -> Any:
    """The Arrow type of the prediction column (for the executors, which build it in Arrow)."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import _parse_datatype_string

    try:
        return to_arrow_type(_parse_datatype_string(result_type))
    except Exception as exc:
        raise InferenceConfigError(
            f"result_type {result_type!r} is not a Spark type that Arrow can hold: {exc}. "
            "Use a type such as 'double', 'bigint', 'string' or 'array<double>'.") from exc


def _column_name(column: Any) -> str:
    """A Column's output name (``F.col("f1")`` -> ``f1``), which the model sees."""
    text = str(column)
    inner = text[text.find("'") + 1: text.rfind("'")] if "'" in text else text
    return inner.split(" AS ")[-1].strip("`")


def predict_grouped(df: Any, *, model_column: str, input_columns: list[str], llm: Any,
                    output_column: str = "prediction", result_type: str = "double",
                    fail_on_error: bool = False, buckets_per_model: int = 1,
                    rows_per_request: int | None = None, partition_key: str | None = None,
                    scope: str | None = None, run_id: str | None = None,
                    task_slots: int | None = None, use_ledger: bool = False) -> Any:
    """``df`` plus ``output_column``: each row scored by the model its ``model_column`` names,
    through ``groupBy(model_column).applyInPandas``; rows are never dropped.
    ``use_ledger``: as for :func:`model_udf` (False: each group one plain ``predict``, as the
    seed's function; True: resume from the ledger and share answers with ``predict()``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    missing = [c for c in [model_column, *input_columns] if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"predict_grouped: column(s) {missing} are not in the DataFrame ({df.columns}).")
    if output_column in df.columns:
        raise InferenceConfigError(
            f"predict_grouped: the DataFrame already has a column '{output_column}'.")
    if buckets_per_model < 1:
        raise InferenceConfigError("predict_grouped: buckets_per_model must be at least 1.")
    refs = [r[0] for r in df.select(model_column).distinct().collect() if r[0] is not None]
    call = PredictCall(input_columns=tuple(input_columns), model_column=model_column,
                       output_column="prediction", rows_per_request=rows_per_request,
                       partition_key=partition_key or "", scope=scope or "")
    job = _job(df.sparkSession, llm, call, [str(r) for r in refs], result_type=result_type,
               fail_on_error=fail_on_error, run_id=run_id, task_slots=task_slots,
               use_ledger=use_ledger)
    output_type = _parse_datatype_string(_output_type(result_type, fail_on_error))
    schema = StructType([*df.schema.fields, StructField(output_column, output_type, True)])
    keys, drop = [model_column], ()
    if buckets_per_model > 1:
        df = df.withColumn(_BUCKET, F.pmod(F.xxhash64(*[F.col(c) for c in input_columns]),
                                           F.lit(buckets_per_model)))
        keys.append(_BUCKET)
        drop = (_BUCKET,)
    return df.groupBy(*keys).applyInPandas(group_function(job, output_column, drop),
                                           schema=schema)
