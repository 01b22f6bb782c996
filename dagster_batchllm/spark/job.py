"""What a Spark task needs to answer its rows, as plain picklable data.

A :class:`SparkJob` is built once on the driver and travels to executors inside the pandas UDF's
closure. It holds the :class:`~dagster_batchllm.core.settings.InferenceSettings` already split
for one task slot (see :func:`split_for_slots`), the call as one
:class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall` (checked on the driver; it reads
the columns of the frames the executor builds, see :data:`PROMPT_COLUMN`) and, when a token
budget is set, a :class:`BudgetRef` to the shared budget row in the ledger database. Nothing
here imports pyspark or dagster.

Example::

    >>> from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
    >>> from dagster_batchllm.spark.job import split_for_slots
    >>> settings = InferenceSettings(endpoints=(EndpointSpec(
    ...     name="gpu", base_url="http://127.0.0.1:8000/v1", models=("llama-70b",),
    ...     max_concurrency=64, requests_per_minute=600),))
    >>> per_task = split_for_slots(settings, 4).endpoints[0]
    >>> per_task.max_concurrency, per_task.requests_per_minute
    (16, 150)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import InferenceCall, InferenceConfigError, InferenceSettings

RESULT_FIELD = "result"
ERROR_FIELD = "errorMessage"
RESULT_STRUCT_DDL = f"struct<{RESULT_FIELD}: string, {ERROR_FIELD}: string>"

# The columns of the frames an executor hands to infer(): a scalar UDF's batch becomes
# (MODEL_COLUMN, PROMPT_COLUMN); a group gets a ROUTED_MODEL_COLUMN next to its own columns. The
# answers go to OUTPUT_COLUMN and ERROR_COLUMN, named so that no input column is overwritten.
PROMPT_COLUMN = "prompt"
MODEL_COLUMN = "model"
FILES_COLUMN = "files"  # ai_query's files (ai_query_col's images): a bad file's error names it
ROUTED_MODEL_COLUMN = "_batchllm_model"
OUTPUT_COLUMN = "_batchllm_result"
ERROR_COLUMN = "_batchllm_error"


def split_for_slots(settings: InferenceSettings, slots: int) -> InferenceSettings:
    """Each endpoint's concurrency and rate limits divided by the number of task slots.

    At most ``slots`` tasks run at once, each with its own client, so the sum over tasks never
    exceeds what the endpoint was configured for. Rounded down (at least 1): a limit smaller
    than the number of slots cannot be split and is then exceeded by up to ``slots`` times 1.
    """
    if slots < 1:
        raise InferenceConfigError(f"task_slots must be at least 1, got {slots}.")
    if slots == 1:
        return settings

    def share(value: int | None) -> int | None:
        return None if value is None else max(1, int(value) // slots)

    endpoints = tuple(
        dataclasses.replace(
            e,
            max_concurrency=share(e.max_concurrency),
            requests_per_minute=share(e.requests_per_minute),
            tokens_per_minute=share(e.tokens_per_minute),
        )
        for e in settings.endpoints
    )
    return settings.replace(endpoints=endpoints)


@dataclass(frozen=True)
class BudgetRef:
    """Where a shared token budget lives: a row of ``<ledger_table>_budgets``."""

    store_url: str
    ledger_table: str
    budget_id: str
    wait_s: float = 30.0
    parts: int = 1  # tasks that may draw on it at once: a claim takes at most 1/parts


@dataclass(frozen=True)
class SparkJob:
    """One Spark-side call: settings for one task slot, the call, and how failures surface."""

    settings: InferenceSettings
    call: InferenceCall  # over the executor's frames (see PROMPT_COLUMN): see executor_call
    fail_on_error: bool = True
    run_id: str | None = None
    budget: BudgetRef | None = None
    # Databricks calls ai_query's first argument an endpoint: an endpoint name that serves a
    # single model stands for that model.
    aliases: Mapping[str, str] = field(default_factory=dict)

    def replace(self, **changes: Any) -> SparkJob:
        return dataclasses.replace(self, **changes)

    def with_call(self, **fields: Any) -> SparkJob:
        """The job with ``fields`` of its call changed (other names: generation parameters)."""
        return self.replace(call=InferenceCall.of(self.call, **fields))

    def model_for(self, name: str) -> str:
        return self.aliases.get(name, name)


def executor_call(*, prompt: str | None = None, prompt_column: str = PROMPT_COLUMN,
                  model_column: str = MODEL_COLUMN, **fields: Any) -> InferenceCall:
    """The call as an executor sends it: each row's prompt from ``prompt`` (a template over the
    frame's columns) or ``prompt_column``, its model from ``model_column``, the answers to
    :data:`OUTPUT_COLUMN` and :data:`ERROR_COLUMN`; ``fields`` are the other InferenceCall
    fields and generation parameters. Mistakes raise here, on the driver."""
    source = {"prompt": prompt} if prompt is not None else {"prompt_column": prompt_column}
    return InferenceCall.of(**source, model_column=model_column, output_column=OUTPUT_COLUMN,
                            error_column=ERROR_COLUMN, **fields)


def endpoint_aliases(settings: InferenceSettings) -> dict[str, str]:
    models = settings.models
    return {e.name: e.models[0] for e in settings.endpoints
            if len(e.models) == 1 and e.name not in models}
