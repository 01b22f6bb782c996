"""The executor side of Spark's ``ai_agg`` and ``ai_summarize_agg``: one group, one answer.

A grouped-aggregate pandas UDF hands each group's values to :func:`answer_group` as a Series;
the group is reduced hierarchically (:mod:`dagster_batchllm.semantic.reduce`) through this
worker process's cached client (:func:`.worker.client_for`: its pool, limits and ledger), so
the answers are those DuckDB gets for the same rows and settings, and a rerun sends nothing.
Imports neither dagster nor pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from ..ai_functions.aggregates import AGGREGATES, group_failure, one_instruction
from ..ai_functions.calls import sendable
from ..core import InferenceConfigError, InferenceSettings, run_sync
from ..semantic.reduce import GroupInput, reduce_groups, reduce_options
from . import worker


@dataclass(frozen=True)
class AggregateJob:
    """What an executor needs to answer a group: plain data, pickled with the UDF."""

    function: str
    settings: InferenceSettings
    model: str | None
    scope: str = ""
    partition_key: str = ""
    run_id: str | None = None
    #: Endpoint names that stand for the one model they serve (as ai_query's endpoint).
    aliases: Mapping[str, str] = field(default_factory=dict)


def answer_group(job: AggregateJob, texts: pd.Series, instructions: pd.Series,
                 endpoints: pd.Series) -> str | None:
    """The group's answer (None for a group of no text); a failed group fails the task,
    saying why, once its answered chunks are in the ledger. ``endpoints``: the constant
    endpoint argument (NULL: the default model)."""
    function = AGGREGATES[job.function]
    given = sorted({i for i in instructions.tolist() if isinstance(i, str)}) or [None]
    instruction = one_instruction(function, given[0], given[-1])
    named = next((e for e in endpoints.tolist() if isinstance(e, str)), None)
    model = job.aliases.get(named, named) if named is not None else job.model
    if model is None:
        raise InferenceConfigError(
            f"{function.name}: no default model; pass the argument 'endpoint' or set "
            "default_model in the settings.")
    client = worker.client_for(job.settings)
    options = reduce_options(client.settings, model=model, instructions=[instruction],
                             scope=job.scope, partition_key=job.partition_key,
                             run_id=job.run_id)
    group = GroupInput(instruction, [str(t) for t in texts.tolist() if sendable(t)])
    [(answer, error)], _figures = run_sync(reduce_groups(client, [group], options))
    worker.count_batch(len(texts))
    if error is not None:
        raise group_failure(function, [error], 1)
    return answer


def aggregate_function(job: AggregateJob):
    """The UDF body (a closure over plain data), with the type hints Spark reads to make it a
    grouped aggregate: the group's texts, instructions and endpoints (NULL where not given)."""

    def aggregate(expr: pd.Series, instruction: pd.Series, endpoint: pd.Series) -> str:
        return answer_group(job, expr, instruction, endpoint)  # type: ignore[return-value]

    aggregate.__name__ = job.function
    return aggregate
