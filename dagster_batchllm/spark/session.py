"""``SparkAI``: a SparkSession bound to inference settings, on the driver.

It turns the resource (or plain settings) into what executors get: settings split per task
slot, generation parameters checked before anything runs, and a shared token budget row when a
budget is set. ``register_ai_functions`` returns one and makes it the active one, so
``ai_query_col`` and ``infer_grouped`` find it without being passed it.

Example::

    from dagster_batchllm.spark import SparkAI

    ai = SparkAI(spark, llm, token_budget=2_000_000)  # llm: a BatchInferenceResource
    df = df.withColumn("summary", ai.ai_query_col("llama-70b", "transcript_text"))
"""

from __future__ import annotations

from typing import Any, Literal

from ..core import InferenceConfigError, InferenceSettings, Ledger, literal_template
from ..factories.context import read_context
from . import active, columns, grouped
from .budget import SharedTokenBudget, require_shared_store
from .job import (
    MODEL_COLUMN,
    PROMPT_COLUMN,
    BudgetRef,
    SparkJob,
    endpoint_aliases,
    executor_call,
    split_for_slots,
)
from .worker_python import align_worker_python


def as_settings(resource_or_settings: Any) -> InferenceSettings:
    """``InferenceSettings`` from a ``BatchInferenceResource`` (duck-typed: no dagster import)."""
    if isinstance(resource_or_settings, InferenceSettings):
        return resource_or_settings
    to_settings = getattr(resource_or_settings, "to_settings", None)
    if callable(to_settings):
        if getattr(resource_or_settings, "managed_endpoints", None):
            # Managed endpoints are in the settings once started; the client starts them (a
            # Dagster run already has). They listen on the driver: fine for local mode only.
            resource_or_settings.client  # noqa: B018
        return to_settings()
    raise InferenceConfigError(
        "Pass a BatchInferenceResource or an InferenceSettings, got "
        f"{type(resource_or_settings).__name__}."
    )


def default_task_slots(spark: Any) -> int:
    """How many tasks can run at once: Spark's default parallelism (cores of the cluster)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext; fall back to the configuration
        return max(1, int(spark.conf.get("spark.default.parallelism", "1")))


class SparkAI:
    """Inference settings bound to a SparkSession; build columns and grouped runs from it.

    ``limits="split"`` (the default) divides each endpoint's concurrency and rate limits by
    ``task_slots`` (default: Spark's default parallelism), the most tasks that run at once.
    ``limits="shared"`` lets every task take its share at run time instead, through the core's
    run coordination in the ledger database (see :mod:`dagster_batchllm.spark`).
    ``token_budget`` (default: the settings') caps the tokens of each call made through this
    object, shared by all its tasks through the ledger database.
    """

    def __init__(self, spark: Any, resource_or_settings: Any, *, task_slots: int | None = None,
                 token_budget: int | None = None, partition_key: str | None = None,
                 run_id: str | None = None, scope: str | None = None,
                 context: Any = None, budget_wait_s: float = 30.0,
                 limits: Literal["split", "shared"] = "split"):
        self.spark = spark
        align_worker_python(spark)
        self.settings = as_settings(resource_or_settings)
        self.task_slots = int(task_slots) if task_slots is not None else default_task_slots(spark)
        self.limits = limits
        # The total budget is enforced through the database, never by each task's own budget.
        per_call = self.settings.replace(token_budget=None)
        if limits == "split":
            # Static shares need no coordination; the core's would divide them once more.
            self.worker_settings = split_for_slots(per_call.replace(coordinate_runs=False),
                                                   self.task_slots)
        elif limits == "shared":
            require_shared_store(self.settings.store_url, "limits='shared'")
            self.worker_settings = per_call.replace(coordinate_runs=True)
        else:
            raise InferenceConfigError(f"limits must be 'split' or 'shared', got {limits!r}.")
        self.token_budget = token_budget if token_budget is not None \
            else self.settings.token_budget
        seen = read_context(context)
        self.partition_key = partition_key if partition_key is not None else seen.partition_key
        self.run_id = run_id if run_id is not None else seen.run_id
        self.scope = scope if scope is not None else seen.scope
        self.budget_wait_s = budget_wait_s
        self.aliases = endpoint_aliases(self.settings)
        self.budgets: list[BudgetRef] = []  # every budget created, newest last
        # Set by register_ai_functions: Spark's registry holds only py4j proxies of these.
        self.sql_builder: Any = None
        self.function_builders: dict[str, Any] = {}

    @classmethod
    def active(cls) -> SparkAI:
        """The SparkAI ``register_ai_functions`` activated last."""
        return active.active_ai()

    def activate(self) -> SparkAI:
        return active.activate(self)

    # -- models and calls ----------------------------------------------------------------------
    def check_model(self, name: str, where: str = "ai_query") -> str:
        """The served model ``name`` stands for (a model, or an endpoint serving one model)."""
        model = self.aliases.get(name, name)
        if model not in self.settings.models:
            raise InferenceConfigError(
                f"{where}: no configured endpoint serves '{name}'; served models: "
                f"{sorted(self.settings.models)}."
            )
        return model

    def job(self, *, fail_on_error: bool, prompt: str | None = None,
            prompt_column: str = PROMPT_COLUMN, model_column: str = MODEL_COLUMN,
            max_tokens: int | None = None, temperature: float | None = None,
            response_format: Any = None, system: str | None = None,
            token_budget: int | None = None, partition_key: str | None = None,
            run_id: str | None = None, scope: str | None = None, **params: Any) -> SparkJob:
        """A checked :class:`SparkJob` (argument mistakes raise here, on the driver).

        By default its call reads a scalar batch's frame (see :func:`~.job.executor_call`);
        ``prompt`` (a template), ``prompt_column`` and ``model_column`` name a group's columns.
        """
        call = executor_call(
            prompt=prompt, prompt_column=prompt_column, model_column=model_column,
            # The Spark API takes the system prompt as literal text; infer() reads a template.
            system=literal_template(system) if system else None,
            response_format=response_format, max_tokens=max_tokens, temperature=temperature,
            partition_key=partition_key if partition_key is not None else self.partition_key,
            scope=scope if scope is not None else self.scope, **params)
        budget = token_budget if token_budget is not None else self.token_budget
        return SparkJob(
            settings=self.worker_settings,
            call=call,
            fail_on_error=fail_on_error,
            run_id=run_id if run_id is not None else self.run_id,
            budget=self.new_budget(budget) if budget is not None else None,
            aliases=self.aliases,
        )

    # -- budgets -------------------------------------------------------------------------------
    def new_budget(self, total: int) -> BudgetRef:
        store_url = require_shared_store(self.settings.store_url, "a token budget")
        budget = SharedTokenBudget.create(store_url, self.settings.ledger_table, total=total)
        budget.close()
        ref = BudgetRef(store_url=store_url, ledger_table=self.settings.ledger_table,
                        budget_id=budget.budget_id, wait_s=self.budget_wait_s,
                        parts=self.task_slots)
        self.budgets.append(ref)
        return ref

    def budget_snapshot(self, ref: BudgetRef | None = None) -> dict[str, int]:
        """total / granted / spent / remaining of a budget (the newest one by default)."""
        ref = ref or (self.budgets[-1] if self.budgets else None)
        if ref is None:
            raise InferenceConfigError("No token budget was created through this SparkAI.")
        ledger = Ledger(ref.store_url, ref.ledger_table)
        try:
            return SharedTokenBudget(ledger.engine, ref.ledger_table, ref.budget_id).snapshot()
        finally:
            ledger.dispose()

    # -- the DataFrame API ---------------------------------------------------------------------
    def ai_query_col(self, model: Any, prompt: Any, **kwargs: Any) -> Any:
        """:func:`~.columns.ai_query_col` with these settings."""
        return columns.ai_query_col(model, prompt, ai=self, **kwargs)

    def infer_grouped(self, df: Any, **kwargs: Any) -> Any:
        """:func:`~.grouped.infer_grouped` with these settings."""
        return grouped.infer_grouped(df, ai=self, **kwargs)
