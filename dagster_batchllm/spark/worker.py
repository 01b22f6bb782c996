"""The executor side: answer one Arrow batch (or one group) through a cached InferenceClient.

Runs inside Spark's Python workers, so it imports neither dagster nor pyspark: only pandas and
the inference core. Each worker process keeps one :class:`InferenceClient` per distinct
settings (``client_for``): its endpoint pool, breakers and rate limiters, and its ledger
connection, outlive the batch, so every model is served by one client per worker process and
endpoints that serve several models keep a single set of limits. A batch is handed to
``infer`` whole, which sends its rows concurrently (up to the task's share of each endpoint's
``max_concurrency``) and looks every row up in the ledger first, so a retried task, or a rerun,
only sends the rows that have no ``ok`` answer yet.

Example (what a pandas UDF does with one batch)::

    import pandas as pd
    from dagster_batchllm.spark.job import SparkJob, executor_call
    from dagster_batchllm.spark.worker import run_scalar

    job = SparkJob(settings, executor_call(max_tokens=64), fail_on_error=False)
    out = run_scalar(job, True, pd.Series(["llama-70b"] * 2), pd.Series(["Hi", None]))
    out.columns.tolist()  # ['result', 'errorMessage']; the NULL prompt gives NULL, NULL
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd

from ..ai_functions.calls import sendable
from ..ai_functions.catalogue import AI_QUERY, read_result
from ..ai_functions.documents import parse_document_value
from ..ai_functions.outcomes import AIQueryError, with_error
from ..core import (
    DeferredError,
    ErrorType,
    InferenceClient,
    InferenceSettings,
    token_reservations,
)
from .budget import SharedTokenBudget
from .job import (
    ERROR_FIELD,
    FILES_COLUMN,
    MODEL_COLUMN,
    PROMPT_COLUMN,
    RESULT_FIELD,
    ROUTED_MODEL_COLUMN,
    SparkJob,
)

_POLL_S = 0.1

_CLIENTS: dict[InferenceSettings, InferenceClient] = {}
_LOCK = threading.Lock()
_COUNTERS = {"clients_created": 0, "batches": 0, "rows": 0}


def client_for(settings: InferenceSettings) -> InferenceClient:
    """This worker process's client for ``settings`` (created on first use)."""
    with _LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = InferenceClient(settings)
            _COUNTERS["clients_created"] += 1
        return client


def cache_info() -> dict[str, int]:
    """What this worker process holds: for tests and for diagnosing a job."""
    with _LOCK:
        return {"pid": os.getpid(), "clients": len(_CLIENTS), **_COUNTERS}


# -- one batch ---------------------------------------------------------------------------------
def run_scalar(job: SparkJob, struct: bool, models: pd.Series, prompts: pd.Series,
               model_parameters: Any = None, response_format: Any = None,
               files: pd.Series | None = None) -> Any:
    """Answer one Arrow batch of a scalar UDF: a string Series, or result/errorMessage frame.

    ``model_parameters`` and ``response_format`` are the SQL arguments of the same names
    (constant per query, so the first row's value is the call's). ``files`` (``ai_query``'s
    ``files``, ``ai_query_col``'s ``images``) holds each row's image: its bytes (a BINARY
    column), a path or a URL, or a list of those; a row whose file is NULL gives NULL unsent.
    """
    job = _with_sql_options(job, model_parameters, response_format)
    outputs, errors = _answer_rows(job, models, prompts, files)
    return batch_column([as_sql_text(o) for o in outputs], errors,
                        fail_on_error=job.fail_on_error, struct=struct)


def run_typed(job: SparkJob, models: pd.Series, prompts: pd.Series, return_type: pd.Series,
              fail_on_error: pd.Series | None = None, model_parameters: Any = None,
              files: pd.Series | None = None) -> pd.Series:
    """One Arrow batch of ``ai_query`` with a ``returnType``: each row's ``{"result": value,
    "errorMessage": error}`` as JSON text, which the query reads with ``from_json`` into the
    type (see :func:`dagster_batchllm.spark.sql.typed_expression`).

    The catalogue's ``ai_query`` asks the model for the type and reads its reply, as on DuckDB
    and SQLite; a reply that does not fit is the row's error.
    """
    call = AI_QUERY.bind({"returnType": first_value(return_type),
                          "failOnError": plain_value(first_value(fail_on_error))})
    job = _with_sql_options(job, model_parameters, None)
    job = job.replace(call=call.inference_call(job.call), fail_on_error=call.fail_on_error)
    outputs, errors = _answer_rows(job, models, prompts, files)
    read = [read_result(call, o, e) for o, e in zip(outputs, errors, strict=True)]
    return batch_column([with_error(v, e) for v, e in read], [e for _, e in read],
                        fail_on_error=call.fail_on_error, struct=False)


def _answer_rows(job: SparkJob, models: pd.Series, prompts: pd.Series,
                 files: pd.Series | None) -> tuple[list[Any], list[str | None]]:
    """Each row's raw output and error; rows with a NULL or blank prompt (or a NULL file)
    are (None, None), unsent."""
    n = len(prompts)
    present = np.fromiter((sendable(p) for p in prompts), dtype=bool, count=n)
    if files is not None:
        present &= np.fromiter((not _is_null(f) for f in files), dtype=bool, count=n)
        job = job.with_call(images=FILES_COLUMN)
    outputs: list[Any] = [None] * n
    errors: list[str | None] = [None] * n
    if present.any():
        columns = {
            MODEL_COLUMN: [job.model_for(m) if isinstance(m, str) else m
                           for m in models[present].tolist()],
            PROMPT_COLUMN: prompts[present].tolist(),
        }
        if files is not None:
            columns[FILES_COLUMN] = [_file_cell(f) for f in files[present].tolist()]
        answered, failed = answer_frame(job, pd.DataFrame(columns))
        for pos, out, err in zip(present.nonzero()[0], answered, failed, strict=True):
            outputs[pos] = out
            errors[pos] = err
    return outputs, errors


def run_group(job: SparkJob, pdf: pd.DataFrame, *, model_column: str, output_column: str,
              struct: bool, drop_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Answer one ``groupBy(model).applyInPandas`` group: the rows plus ``output_column``.

    The job's call reads its prompt from the group's columns and its model from
    :data:`~.job.ROUTED_MODEL_COLUMN`, the model ``model_column`` names."""
    pdf = pdf.reset_index(drop=True)
    frame = pdf.copy(deep=False)
    # Per-row routing even inside a group: an unserved model is then a row error, not a
    # failed stage, and a group keyed by more than the model still works.
    frame[ROUTED_MODEL_COLUMN] = [job.model_for(m) if isinstance(m, str) else m
                                  for m in pdf[model_column]]
    outputs, errors = answer_frame(job, frame)
    count_batch(len(pdf))
    if job.fail_on_error:
        raise_if_failed(errors)
    out = pdf.drop(columns=list(drop_columns))
    texts = [as_sql_text(o) for o in outputs]
    if struct:
        out[output_column] = [{RESULT_FIELD: o, ERROR_FIELD: e}
                              for o, e in zip(texts, errors, strict=True)]
    else:
        out[output_column] = pd.Series(texts, dtype=object)
    return out


def answer_frame(job: SparkJob, frame: pd.DataFrame) -> tuple[list[Any], list[str | None]]:
    """``infer`` over ``frame`` with the job's call, within its shared budget if any."""
    client = client_for(job.settings)
    if job.budget is None:
        result = client.infer(frame, job.call, run_id=job.run_id)
        return result.df[result.output_column].tolist(), result.df[result.error_column].tolist()
    return _infer_within_budget(client, job, frame)


# -- the shared budget -------------------------------------------------------------------------
def _infer_within_budget(client: InferenceClient, job: SparkJob, frame: pd.DataFrame
                         ) -> tuple[list[Any], list[str | None]]:
    """Claim, infer, settle; again for deferred rows while other tasks give tokens back."""
    ref = job.budget
    budget = SharedTokenBudget(client.ledger.engine, ref.ledger_table, ref.budget_id)
    n = len(frame)
    outputs: list[Any] = [None] * n
    errors: list[str | None] = [None] * n
    pending = list(range(n))
    deadline = time.monotonic() + ref.wait_s
    while True:
        part = frame.iloc[pending].reset_index(drop=True)
        wanted, largest = token_reservations(client, part, job.call)
        grant = budget.claim(wanted, parts=ref.parts, at_least=largest)
        # Even a zero grant is worth a call: rows already in the ledger are answered for free.
        result = client.infer(part, job.call, token_budget=grant, run_id=job.run_id)
        stats = result.stats
        budget.settle(grant, stats.prompt_tokens + stats.completion_tokens)
        still: list[int] = []
        for row, out, err, error_type in zip(pending, result.df[result.output_column],
                                             result.df[result.error_column],
                                             result.error_types, strict=True):
            outputs[row], errors[row] = out, err
            if error_type == ErrorType.DEFERRED:
                still.append(row)
        if not still:
            return outputs, errors
        if len(still) == len(pending) and not _wait_for_tokens(budget, deadline):
            break
        pending = still
    # The engine's message speaks of the last grant; the user set the call's budget.
    left = budget.snapshot()
    for row in still:
        errors[row] = DeferredError(
            f"the call's token budget ({left['total']} tokens, shared by all its Spark tasks) "
            f"has {left['remaining']} left, less than this request may need; a later run will "
            "send it").as_cell()
    return outputs, errors


def _wait_for_tokens(budget: SharedTokenBudget, deadline: float) -> bool:
    """Wait while other tasks hold grants; True once one gave tokens back."""
    start = budget.snapshot()
    while start["granted"] > 0 and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        now = budget.snapshot()
        if now["remaining"] > start["remaining"]:
            return True
        if now["granted"] == 0:
            break
    return False


# -- values ------------------------------------------------------------------------------------
def as_sql_text(value: Any) -> str | None:
    """Structured replies (parsed JSON) go back to Spark as JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def batch_column(outputs: list[Any], errors: list[str | None], *, fail_on_error: bool,
                 struct: bool) -> pd.Series | pd.DataFrame:
    """A pandas UDF's answer for one Arrow batch (counted): the values, or the result and
    errorMessage struct; with ``fail_on_error`` a failed row fails the batch instead."""
    count_batch(len(outputs))
    if fail_on_error:
        raise_if_failed(errors)
    if struct:
        return pd.DataFrame({RESULT_FIELD: outputs, ERROR_FIELD: errors})
    return pd.Series(outputs, dtype=object)


def raise_if_failed(errors: list[str | None]) -> None:
    failed = [e for e in errors if e is not None]
    if failed:
        raise AIQueryError(
            f"ai_query failed for {len(failed)} of {len(errors)} rows of this batch "
            f"(failOnError is true); first error: {failed[0]}. Answered rows are kept in the "
            "ledger, so a rerun sends only the failed ones; pass failOnError => false "
            "(fail_on_error=False in Python) to get the errors as data."
        )


def _with_sql_options(job: SparkJob, model_parameters: Any, response_format: Any) -> SparkJob:
    """The job with the call's ``modelParameters`` on top of its generation parameters and its
    ``responseFormat``."""
    changes: dict[str, Any] = {}
    params = first_value(model_parameters)
    if params is not None:
        if isinstance(params, str):
            params = json.loads(params)
        changes.update({str(k): plain_value(v) for k, v in dict(params).items()
                        if plain_value(v) is not None})
    fmt = first_value(response_format)
    if fmt is not None:
        changes["response_format"] = fmt
    return job.with_call(**changes) if changes else job


def first_value(arg: Any) -> Any:
    """The call's constant: a struct argument arrives as a frame, the others as a Series."""
    if arg is None or len(arg) == 0:
        return None
    if isinstance(arg, pd.DataFrame):
        return {c: arg[c].iloc[0] for c in arg.columns}
    value = arg.iloc[0]
    if isinstance(value, Mapping):
        return dict(value)
    return None if _is_null(value) else value


def plain_value(value: Any) -> Any:
    """numpy scalars and SQL decimals (``0.7`` is a DECIMAL literal in Spark) to JSON types."""
    if _is_null(value):
        return None
    if isinstance(value, Decimal):
        return float(value) if value.as_tuple().exponent < 0 else int(value)
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _is_null(value: Any) -> bool:
    if isinstance(value, bytes | bytearray | str):
        return False
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False  # an array of files: not NULL


def _file_cell(value: Any) -> Any:
    """A BINARY cell arrives as bytes (or bytearray), an ARRAY one as a numpy array."""
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "tolist") and not isinstance(value, bytes):
        return [_file_cell(v) for v in value.tolist()]
    return value


def count_batch(rows: int) -> None:
    with _LOCK:
        _COUNTERS["batches"] += 1
        _COUNTERS["rows"] += rows


# -- the functions Spark pickles -----------------------------------------------------------------
# Closures over plain data: cloudpickle ships them by value and the names they use by reference
# to this module, so an executor imports the inference core and nothing else.
def sql_function(job: SparkJob, struct: bool):
    """The body of the SQL ``ai_query`` (Databricks' parameter names, usable as named args)."""

    def ai_query(endpoint, request, returnType=None, failOnError=None,
                 modelParameters=None, responseFormat=None, files=None):
        return run_scalar(job, struct, endpoint, request, modelParameters, responseFormat,
                          files)

    return ai_query


def typed_sql_function(job: SparkJob):
    """The body of the SQL ``ai_query`` with a ``returnType`` (see :func:`run_typed`)."""

    def ai_query(endpoint, request, returnType=None, failOnError=None,
                 modelParameters=None, responseFormat=None, files=None):
        return run_typed(job, endpoint, request, returnType, failOnError, modelParameters,
                         files)

    return ai_query


def column_function(job: SparkJob, struct: bool):
    def ai_query_col(model, prompt, images=None):
        return run_scalar(job, struct, model, prompt, files=images)

    return ai_query_col


def parse_documents(content: pd.Series, settings: Any = None) -> pd.DataFrame:
    """The body of Spark's ``ai_parse_document``: one Arrow batch of PDFs (bytes or paths, read
    as ``settings``' file policy allows)."""
    fields = ("page_count", "pages", "text", "error")
    parsed = []
    for value in content.tolist():
        if isinstance(value, bytearray):
            value = bytes(value)
        if value is not None and not isinstance(value, bytes | str):
            value = {"page_count": None, "pages": None, "text": None, "error": (
                f"content must be BINARY (the PDF) or a STRING (its path), got "
                f"{type(value).__name__}")}
        else:
            value = parse_document_value(value, settings)
        parsed.append(value or dict.fromkeys(fields))  # NULL in: NULL fields
    return pd.DataFrame({name: [row[name] for row in parsed] for name in fields})


def group_function(job: SparkJob, **group: Any):
    def infer_group(pdf):
        return run_group(job, pdf, **group)

    return infer_group
