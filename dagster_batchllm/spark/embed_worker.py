"""The executor side of Spark embeddings: one Arrow batch of texts through ``embed()``.

Like :mod:`.worker`, it imports neither dagster nor pyspark, and uses the worker process's
cached client (:func:`~.worker.client_for`): the batch's texts go in requests of many inputs,
each text keyed in the ledger, so a retried task or a rerun sends only the texts without a
vector yet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..ai_functions.calls import sendable
from ..core import EmbedCall, InferenceSettings
from .job import ERROR_COLUMN, ERROR_FIELD, OUTPUT_COLUMN, RESULT_FIELD
from .worker import batch_column, client_for

TEXT_COLUMN = "text"
VECTOR_DDL = "array<float>"
VECTOR_STRUCT_DDL = f"struct<{RESULT_FIELD}: array<float>, {ERROR_FIELD}: string>"


@dataclass(frozen=True)
class EmbedJob:
    """One Spark-side embeddings call: settings for one task slot and the call (its model
    None when each query's endpoint argument names it)."""

    settings: InferenceSettings
    call: EmbedCall
    fail_on_error: bool = True
    run_id: str | None = None

    def replace(self, **changes: Any) -> EmbedJob:
        return dataclasses.replace(self, **changes)


def executor_embed_call(**fields: Any) -> EmbedCall:
    """The call as an executor sends it: the batch's texts from :data:`TEXT_COLUMN`, the
    vectors to the worker's output and error columns."""
    return EmbedCall(input_column=TEXT_COLUMN, output_column=OUTPUT_COLUMN,
                     error_column=ERROR_COLUMN, **fields)


def run_embed(job: EmbedJob, struct: bool, texts: pd.Series, model: str | None = None) -> Any:
    """Vectors for one Arrow batch: a Series of float32 arrays (NULL where the text is NULL
    or blank), or the result/errorMessage frame."""
    n = len(texts)
    present = np.fromiter((sendable(t) for t in texts), dtype=bool, count=n)
    outputs: list[Any] = [None] * n
    errors: list[str | None] = [None] * n
    if present.any():
        frame = pd.DataFrame({TEXT_COLUMN: texts[present].tolist()})
        fields = {"model": model} if model is not None else {}
        result = client_for(job.settings).embed(frame, job.call, run_id=job.run_id, **fields)
        for pos, vector, error in zip(present.nonzero()[0], result.df[OUTPUT_COLUMN],
                                      result.df[ERROR_COLUMN], strict=True):
            outputs[pos], errors[pos] = vector, error
    return batch_column(outputs, errors, fail_on_error=job.fail_on_error, struct=struct)


# -- the functions Spark pickles (closures over plain data, as in .worker) ---------------------
def column_function(job: EmbedJob, struct: bool):
    def embed_col(text):
        return run_embed(job, struct, text)

    return embed_col


def sql_function(job: EmbedJob, struct: bool):
    """``ai_query(endpoint, request, ...)`` on an embedding model: the endpoint is a constant
    of the query, so the batch's first value names the model."""

    def ai_query(endpoint, request, returnType=None, failOnError=None,
                 modelParameters=None, responseFormat=None):
        model = endpoint.iloc[0] if len(endpoint) else None
        return run_embed(job, struct, request, model)

    return ai_query

