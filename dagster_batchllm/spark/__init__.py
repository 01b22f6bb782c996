"""Batch LLM inference on Spark: ``ai_query`` in Spark SQL, a column API and many-model runs.

Three doors onto the same executor code (:mod:`.worker`), which answers one Arrow batch or one
group at a time through :class:`~dagster_batchllm.core.client.InferenceClient`:

* :func:`register_ai_functions` registers ``ai_query`` in Spark SQL with Databricks' signature,
  so the Databricks example query runs in ``spark.sql(...)`` unchanged. It returns STRING (or
  the ``returnType``, asked of a chat model as structured output), or ``STRUCT<result: STRING,
  errorMessage: STRING>`` with ``failOnError => false``. It also
  registers the Databricks AI functions (``ai_summarize``, ``ai_classify``, ``ai_extract``,
  ``ai_analyze_sentiment``, ``ai_translate``, ``ai_fix_grammar``, ``ai_mask``, ``ai_gen``,
  ``ai_similarity``) from the SQL module's catalogue (see :mod:`.functions`).
* :func:`ai_query_col` is the same as a column: ``df.withColumn("s", ai_query_col(model, col))``.
* :func:`infer_grouped` runs ``groupBy(model).applyInPandas`` for tables whose rows name their
  model; one client per model per worker process.
* :func:`model_udf` and :func:`predict_grouped` do the same for traditional ML models (MLflow
  pyfunc): ``mlflow.pyfunc.spark_udf`` and the per-model ``applyInPandas`` (see :mod:`.models`).

What travels to executors is plain data: :class:`~dagster_batchllm.core.settings.InferenceSettings`
(pickled inside the UDF closure), never the Dagster resource, and executor code never imports
dagster (it would cost seconds per Python worker). Each worker process keeps one client per
settings, so its endpoint pool, breakers and ledger connection outlive batches.

Per-row failures are data: with ``failOnError => false`` (``fail_on_error=False``) a row's error
is its ``errorMessage`` (``"<error_type>: <message>"``, the core's codes) and the stage never
fails for it. With ``failOnError`` true (Databricks' default) the task fails after the batch's
answered rows are written to the ledger, so the retry or rerun sends only the failed rows.

Limits across executors (the design choice)
--------------------------------------------
Each running task has its own client, so limits that hold per client must be shared out:

* **Concurrency and rate limits are split per task slot** (``limits="split"``, the default).
  Every endpoint's ``max_concurrency``, ``requests_per_minute`` and ``tokens_per_minute`` are
  divided by the number of tasks that can run at once (``task_slots``, by default Spark's
  default parallelism), rounded down. At most that many tasks run at once, so together they
  never exceed what the endpoint was configured for, with no coordination at all: these limits
  are checked before every single request, where a database round trip would cost more than
  the request. The price: a slot without a task (the last stragglers of a stage, fewer groups
  than slots) leaves its share unused. The core's run coordination is switched off on
  executors in this mode, as it would divide the static shares a second time.
  ``limits="shared"`` is the alternative for endpoints that other jobs use at the same time:
  tasks then register with the core's run coordination (a heartbeat table next to the ledger)
  and each live run, Spark task or not, takes ``1/N`` of every endpoint. Unused shares flow to
  the running tasks, at the cost of a heartbeat per task and, for each batch that starts while
  other runs are live, a wait of 1.5 heartbeats before it sends. Shares change at heartbeats,
  and requests already in flight when a task joins still run out, so with slow requests an
  endpoint can briefly see more than its ``max_concurrency``.
* **Token budgets are shared through the ledger database.** A budget caps what a whole call
  spends, which a static split would enforce badly (rows are not spread evenly over tasks). The
  driver creates one row in ``<ledger_table>_budgets``; each task claims a grant from it before
  sending a batch (at most what the batch could use), runs ``infer`` within the grant and
  gives back what it did not use. Claims are serialized by the database (a row lock on
  PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so the tasks together never spend more than the
  budget. A task that finds the budget held by others waits for them to give tokens back (up
  to ``budget_wait_s``). Rows the budget cannot pay for come back as ``deferred`` errors and a
  later run sends them.
* **Retries never pay twice** when the ledger is shared: a task's answers are written as they
  arrive, and a retried task, a speculative copy or a rerun finds them before sending anything.

Budgets, ``limits="shared"`` and cross-task retries need a ledger every executor reaches:
PostgreSQL on a cluster, or a SQLite file in local mode (``sqlite:///...``; a relative path is
relative to each executor's working directory).

Example::

    from dagster_batchllm.spark import register_ai_functions

    register_ai_functions(spark, llm, token_budget=5_000_000)  # llm: BatchInferenceResource
    spark.sql('''
        SELECT call_id, ai_query('llama-70b', transcript_text, failOnError => false) AS s
        FROM cleaned_transcripts
    ''').where("s.errorMessage IS NULL")
"""

from ..ai_functions.outcomes import AIQueryError
from .columns import ai_query_col
from .embeddings import embed_col
from .grouped import infer_grouped
from .job import RESULT_STRUCT_DDL, BudgetRef, SparkJob, split_for_slots
from .models import model_udf, predict_grouped
from .session import SparkAI
from .sql import register_ai_functions
from .worker import cache_info
from .worker_python import use_driver_python_by_default

use_driver_python_by_default()  # before the user's session starts its workers

__all__ = [
    "RESULT_STRUCT_DDL",
    "AIQueryError",
    "BudgetRef",
    "SparkAI",
    "SparkJob",
    "ai_query_col",
    "cache_info",
    "embed_col",
    "infer_grouped",
    "model_udf",
    "predict_grouped",
    "register_ai_functions",
    "split_for_slots",
]
