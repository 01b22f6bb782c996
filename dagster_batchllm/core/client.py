"""``InferenceClient``: the whole inference core behind one entry point for every job.

``infer`` (chat), ``embed`` and ``predict`` are doors onto :meth:`InferenceClient.arun_call`,
which runs any call whose task is registered (:mod:`.tasks.base`) online or through a
provider's batch API; ``estimate`` is the dry run of any of them, ``plan`` its forecast of
what they cost. It imports no dagster, so plain scripts, the SQL functions and Spark
executors use it directly;
``BatchInferenceResource`` is a thin Dagster door onto it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from .batch.mode import BatchModeCall, check_delivery, check_mode
from .delivery.online import OnlineDelivery
from .delivery.pool import EndpointPool
from .delivery.tokenize import server_token_counts
from .delivery.transport import make_transport
from .errors import InferenceConfigError
from .ledger.table import Ledger
from .requests import RowRequest, distinct_requests
from .results import InferenceEstimate, InferenceResult
from .run.budgets import check_planned_cost
from .run.engine import InferenceRun
from .run.figures import estimate_cost
from .run.plan import BATCH_API, ONLINE, DryCount, Plan, make_plan
from .run.sync import run_sync
from .settings import EndpointSpec, InferenceSettings
from .tasks.base import CallBase, Task, task_type_for
from .tasks.chat.call import InferenceCall
from .tasks.chat.rendering import row_tuples
from .tasks.chat.task import ChatTask  # noqa: F401  (registers the chat job)
from .tasks.embed.call import EmbedCall
from .tasks.embed.task import EmbedTask  # noqa: F401  (registers the embeddings job)
from .tasks.predict.task import PredictCall, PredictTask  # noqa: F401  (registers predict)

log = logging.getLogger("dagster_batchllm")


class InferenceClient:
    """Run batch inference over pandas DataFrames.

    Example::

        from dagster_batchllm.core.client import InferenceClient
        from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

        client = InferenceClient(InferenceSettings(
            endpoints=(EndpointSpec(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                    models=("llama-70b",)),),
            store_url="sqlite:///batchllm.db",
        ))
        result = client.infer(df, prompt="Summarize: {text}", model="llama-70b",
                              output_column="summary")
    """

    def __init__(self, settings: InferenceSettings, *, logger: Any = None):
        self.settings = settings
        self.log = logger or log
        self._ledger: Ledger | None = None
        self._ledger_lock = threading.Lock()
        # The pool outlives calls so breaker state carries over between calls of one process.
        self.pool = EndpointPool(
            settings.endpoints,
            failure_threshold=settings.breaker_failure_threshold,
            cooldown_s=settings.breaker_cooldown_s,
            price_of=settings.price_at,  # of the endpoints with room, the cheaper goes first
        )

    @property
    def ledger(self) -> Ledger:
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = Ledger(
                    self.settings.store_url, self.settings.ledger_table,
                    statement_timeout_s=self.settings.ledger_statement_timeout_s)
            return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.dispose()
            self._ledger = None

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the calls ---------------------------------------------------------------------------
    def infer(self, df: Any, call: InferenceCall | None = None, /, **kwargs: Any
              ) -> InferenceResult:
        """Sync door to :meth:`ainfer`."""
        return run_sync(self.ainfer(df, call, **kwargs))

    async def ainfer(self, df: Any, call: InferenceCall | None = None, /, *,
                     run_id: str | None = None, supersede_stale: bool = False,
                     collect_keys: bool = False, logger: Any = None, mode: str = "online",
                     wait: bool = True, deadline: Any = None, **call_fields: Any
                     ) -> InferenceResult:
        """One chat answer per row of ``df``; failures are data in the error column.

        ``call`` (an :class:`InferenceCall`) says what to send; ``call_fields`` are its fields
        (``prompt=``, ``model=``, ``output_column=``, ``max_tokens=``, ...; other names are
        generation parameters such as ``top_p=``), set on top of ``call`` or on their own.
        The other keywords are :meth:`arun_call`'s."""
        return await self.arun_call(
            df, InferenceCall.of(call, **call_fields), run_id=run_id,
            supersede_stale=supersede_stale, collect_keys=collect_keys, logger=logger,
            mode=mode, wait=wait, deadline=deadline)

    def embed(self, df: Any, call: EmbedCall | None = None, /, **kwargs: Any
              ) -> InferenceResult:
        """Sync door to :meth:`aembed`."""
        return run_sync(self.aembed(df, call, **kwargs))

    async def aembed(self, df: Any, call: EmbedCall | None = None, /, *,
                     run_id: str | None = None, supersede_stale: bool = False,
                     collect_keys: bool = False, logger: Any = None, mode: str = "online",
                     wait: bool = True, deadline: Any = None, **call_fields: Any
                     ) -> InferenceResult:
        """One float32 vector (a 1-D numpy array) per row of ``df``; failures are data in the
        error column. ``call`` (an :class:`~.tasks.embed.call.EmbedCall`) or its fields as
        keywords: ``input=`` (a template) or ``input_column=``, ``model=``,
        ``output_column=``, ``dimensions=``, ``inputs_per_request=`` ...; the other keywords
        are :meth:`arun_call`'s (``mode="batch_api"`` sends one line per row)."""
        return await self.arun_call(
            df, EmbedCall.of(call, **call_fields), run_id=run_id,
            supersede_stale=supersede_stale, collect_keys=collect_keys, logger=logger,
            mode=mode, wait=wait, deadline=deadline)

    def predict(self, df: Any, call: PredictCall | None = None, /, **kwargs: Any) -> Any:
        """Sync door to :meth:`apredict`."""
        return run_sync(self.apredict(df, call, **kwargs))

    async def apredict(self, df: Any, call: PredictCall | None = None, /, *,
                       run_id: str | None = None, logger: Any = None,
                       supersede_stale: bool = False, models: Any = None,
                       **call_fields: Any) -> Any:
        """One prediction per row of ``df`` from an MLflow model (in process or served):
        ``model=`` or ``model_column=``, ``input_columns=[...]``, ``output_column=``; failures
        are data in ``<output>_error``. ``models``: resolved already (a Spark executor gets
        them from the driver). Returns a :class:`~.tasks.predict.task.PredictionResult`."""
        return await self.arun_call(
            df, PredictCall.of(call, **call_fields), run_id=run_id, logger=logger,
            supersede_stale=supersede_stale, task_options={"models": models})

    def run_call(self, df: Any, call: CallBase, /, **kwargs: Any) -> InferenceResult:
        """Sync door to :meth:`arun_call`."""
        return run_sync(self.arun_call(df, call, **kwargs))

    async def arun_call(self, df: Any, call: CallBase, /, *, run_id: str | None = None,
                        supersede_stale: bool = False, collect_keys: bool = False,
                        logger: Any = None, mode: str = "online", wait: bool = True,
                        deadline: Any = None, task_options: dict[str, Any] | None = None
                        ) -> InferenceResult:
        """Run any job's ``call`` over ``df``: one output per row, failures as data.

        ``collect_keys``: keep the rows' distinct request keys in ``result.request_keys`` (to
        look their answers up afterwards). ``supersede_stale``: this call covers its whole
        partition, so the partition's records of requests it no longer asks for are retired.
        ``mode="batch_api"``: through the provider's offline batch API (an endpoint with
        ``batch_api=True``) at its batch price; ``wait=False`` returns once the batches are
        submitted, the rows deferred "waiting for batch <id>" (see :mod:`.delivery.batch_api`).
        ``deadline`` (with ``mode="batch_api"``): a ``datetime`` (naive: local time) or a
        ``timedelta`` from now by which every row is answered, the rows the batches have not
        answered in time sent online (see :mod:`dagster_batchllm.core.batch.deadline`).
        ``task_options``: keywords of the task's ``prepare`` (``models`` for predict)."""
        due = check_delivery(mode, wait, deadline)
        task_type = task_type_for(call)
        if mode == "batch_api" and task_type.batch_refusal:
            raise InferenceConfigError(f"mode='batch_api': {task_type.batch_refusal}.")
        call, frame = self._bind(df, call)
        task = await task_type.prepare(call, frame, self, **(task_options or {}))
        budget = call.token_budget if call.token_budget is not None else self.settings.token_budget
        log = logger or self.log
        keep_keys = collect_keys or bool(supersede_stale and call.partition_key)
        needed = None  # the budget that sends every row, which a deferral for budget names
        if call.budget_usd is not None:  # refused before anything is sent, if it may not do
            needed = await asyncio.to_thread(self._check_budget, call, task, frame,
                                             batch=mode == "batch_api")
        if mode == "batch_api":
            batches = BatchModeCall(self, call, task, frame, wait=wait, token_budget=budget,
                                    run_id=run_id, logger=log, collect_keys=keep_keys,
                                    budget_usd=call.budget_usd, deadline=due)
            _name_budget_needed(batches.cost_budget, needed)
            run: Any = await batches.run()
        else:
            run = InferenceRun(
                task.run_settings(self.settings, self.pool.capacity(call.model)), frame,
                task=task, delivery=self._online_delivery(task, log),
                pool=self.pool, ledger=self.ledger, token_budget=budget,
                partition_key=call.partition_key, run_id=run_id, scope=call.scope,
                logger=log, collect_keys=keep_keys, budget_usd=call.budget_usd)
            _name_budget_needed(run.budgets.usd if run.budgets is not None else None, needed)
            await run.run()
        if supersede_stale and call.partition_key:
            await asyncio.to_thread(self.ledger.mark_superseded, call.partition_key, run.keys,
                                    call.scope)
        log.info(f"batchllm: {task.label}: {run.stats.summary()}")
        return task.result(df, run)

    def aggregate(self, df: Any, /, **kwargs: Any) -> Any:
        """Sync door to :meth:`aaggregate`."""
        return run_sync(self.aaggregate(df, **kwargs))

    async def aaggregate(self, df: Any, /, **kwargs: Any) -> Any:
        """One answer per group of ``df``'s rows, however many (``instruction=``, ``column=``,
        ``by=[...]``, ``model=``, ``max_tokens=`` ...), reduced level by level through
        :meth:`ainfer`: see :mod:`dagster_batchllm.semantic.aggregate`."""
        # Imported on use: the operators and the AI-function catalogue under them cost about
        # a third of this module's import, which every Spark executor and subprocess pays.
        from ..semantic.aggregate import aggregate_frame

        return await aggregate_frame(self, df, **kwargs)

    def filter(self, df: Any, /, **kwargs: Any) -> Any:
        """Sync door to :meth:`afilter`."""
        return run_sync(self.afilter(df, **kwargs))

    async def afilter(self, df: Any, /, **kwargs: Any) -> Any:
        """The rows of ``df`` that satisfy ``predicate=`` over ``columns=`` (``ai_filter``'s
        requests), a reason for every NULL answer; ``cascade=Cascade(...)`` pays the oracle
        only for the rows the proxy is unsure of: see :mod:`dagster_batchllm.semantic.filter`."""
        from ..semantic.filter import afilter_rows  # on use, as aaggregate's

        return await afilter_rows(self, df, **kwargs)

    def classify(self, df: Any, /, **kwargs: Any) -> Any:
        """Sync door to :meth:`aclassify`."""
        return run_sync(self.aclassify(df, **kwargs))

    async def aclassify(self, df: Any, /, **kwargs: Any) -> Any:
        """Each row's label among ``labels=`` from ``column=`` (``ai_classify``'s requests),
        with a cascade as for :meth:`afilter`."""
        from ..semantic.filter import aclassify_rows  # on use, as aaggregate's

        return await aclassify_rows(self, df, **kwargs)

    def estimate(self, df: Any, call: CallBase | None = None, /, task: str = "chat",
                 **call_fields: Any) -> InferenceEstimate:
        """A dry run of ``infer`` (or of ``embed`` / ``predict``: ``task="embed"`` /
        ``"predict"``, or a call of that job) with the same arguments: nothing is sent.
        ``requests_to_send`` counts requests (of several rows where the job groups them);
        its tokens and cost are the bound (4 characters per token, ``max_tokens``, the
        dearest price); :meth:`plan` forecasts them."""
        _call, counted = self._dry_run(df, call, task, call_fields)
        tokens_by_model: dict[str, dict[str, int]] = {}
        for item in counted.to_send:
            per_model = tokens_by_model.setdefault(
                item.model, {"prompt_tokens": 0, "completion_tokens": 0})
            per_model["prompt_tokens"] += item.typical_prompt_tokens
            per_model["completion_tokens"] += item.max_tokens
        return InferenceEstimate(
            rows=counted.rows,
            requests_to_send=counted.requests_to_send,
            rows_answered_by_ledger=counted.answered_by_ledger,
            rows_deduplicated=counted.deduplicated,
            invalid_rows=counted.invalid,
            estimated_prompt_tokens=sum(t["prompt_tokens"] for t in tokens_by_model.values()),
            max_completion_tokens=sum(t["completion_tokens"] for t in tokens_by_model.values()),
            tokens_by_model=tokens_by_model,
            estimated_cost_usd=estimate_cost(self.settings, tokens_by_model),
        )

    def plan(self, df: Any, call: CallBase | None = None, /, task: str = "chat", *,
             mode: str = "online", run_id: str | None = None, supersede_stale: bool = False,
             collect_keys: bool = False, logger: Any = None, wait: bool = True,
             deadline: Any = None, **call_fields: Any) -> Plan:
        """What ``infer`` (or ``embed`` / ``predict`` / ``run_call``, as for :meth:`estimate`)
        with the same arguments would send and cost, forecast from the ledger's past usage of
        the same scope and model (see :mod:`.plan`); nothing is sent. ``mode`` picks the
        delivery of ``plan.cost_usd``; ``plan.cost_by_delivery`` has every one offered.
        (``run_id``, ``supersede_stale``, ``collect_keys``, ``logger``, ``wait``,
        ``deadline``: taken so that infer's arguments pass as they are.)"""
        check_mode(mode, wait)
        call, counted = self._dry_run(df, call, task, call_fields)
        return make_plan(self.settings, self.ledger, counted, scope=call.scope,
                         delivery=BATCH_API if mode == "batch_api" else ONLINE,
                         counter=self._server_token_counts)

    # -- the parts of a call ---------------------------------------------------------------------
    def _dry_run(self, df: Any, call: CallBase | None, task: str,
                 call_fields: dict[str, Any]) -> tuple[CallBase, DryCount]:
        """The call of a dry run (of the job ``task`` names, or ``call``'s) and its count;
        rows the online delivery would refuse (too long for the model) count as invalid."""
        if call is None or call_fields:
            kinds = {"chat": InferenceCall, "embed": EmbedCall, "predict": PredictCall}
            if call is None and task not in kinds:
                raise InferenceConfigError(
                    f"task must be one of {sorted(kinds)}, got {task!r}")
            call = (type(call) if call is not None else kinds[task]).of(call, **call_fields)
        call, frame = self._bind(df, call)
        job = run_sync(task_type_for(call).prepare(call, frame, self))
        delivery = job.deliver(self._online_delivery(job, self.log))
        return call, self._count(call, job, frame,
                                 usable=lambda item: delivery.refusal(item) is None)

    def _count(self, call: CallBase, task: Task, frame: Any,
               usable: Callable[[Any], bool] | None) -> DryCount:
        """The one count of what a call would send (its distinct requests the ledger does
        not answer): what estimate(), plan() and budget_usd's check read."""
        distinct, invalid, duplicates = distinct_requests(task.requests(row_tuples(frame)),
                                                          usable=usable)
        hits = self.ledger.lookup_ok(list(distinct), call.partition_key, call.scope)
        missing = [item for key, item in distinct.items() if key not in hits]
        by_count = math.ceil(len(missing) / task.items_per_request)
        cap = task.max_request_tokens
        by_tokens = math.ceil(sum(i.reserve_tokens for i in missing) / cap) if cap else 0
        return DryCount(rows=len(frame), to_send=missing,
                        answered_by_ledger=len(distinct) - len(missing),
                        deduplicated=duplicates, invalid=invalid,
                        requests_to_send=max(by_count, by_tokens))

    def _check_budget(self, call: CallBase, task: Task, frame: Any, *, batch: bool
                      ) -> float | None:
        """Refuse a call whose plan (its distinct requests not answered by the ledger, at the
        delivery it uses) costs more than its ``budget_usd`` (see :mod:`.run.budgets`); rows
        the ledger holds cost nothing. Returns the plan's ``budget_needed_usd``."""
        counted = self._count(call, task, frame, usable=None)
        plan = make_plan(self.settings, self.ledger, counted, scope=call.scope,
                         delivery=BATCH_API if batch else ONLINE,
                         counter=self._server_token_counts)
        check_planned_cost(self.settings, call.budget_usd, plan)
        return plan.budget_needed_usd

    def _server_token_counts(self, endpoint: EndpointSpec, requests: Sequence[RowRequest]
                             ) -> list[int]:
        """The plans' counter: ``endpoint``'s ``/tokenize`` counts (the same figures for the
        plan a user reads and the budget check, so a budget of the plan's figure passes)."""
        return run_sync(server_token_counts(endpoint, requests,
                                            timeout_s=self.settings.request_timeout_s))

    def _bind(self, df: Any, call: CallBase) -> tuple[CallBase, Any]:
        """The call bound to ``df`` and the settings, and the columns of ``df`` it reads."""
        if not isinstance(df, pd.DataFrame):
            raise InferenceConfigError(
                f"{call.entry}() takes a pandas DataFrame, got {type(df).__name__}")
        call = call.bind(list(df.columns), self.settings)
        return call, df[call.columns_read()]

    def _online_delivery(self, task: Task, log: Any) -> Any:
        """Each request sent over HTTP now, through the pool, as the task arranges."""
        settings = self.settings
        return task.deliver(OnlineDelivery(
            settings, self.pool,
            make_transport(settings.http_client, timeout_s=settings.request_timeout_s,
                           max_reply_bytes=settings.max_reply_bytes),
            route=task.route, route_models=task.route_models(settings), parse=task.parse_reply,
            log=log))


def _name_budget_needed(budget: Any, needed: float | None) -> None:
    """Have a run's USD budget (a ``CostBudget``, or None without one) name, in the rows it
    defers, the budget its plan says sends every row (``Plan.budget_needed_usd``)."""
    if budget is not None:
        budget.needed_usd = needed


def token_reservations(client: InferenceClient, df: Any, call: CallBase) -> tuple[int, int]:
    """What a run of ``call`` over ``df`` reserves from a token budget, summed over its
    distinct requests (those the ledger answers included), and its largest reservation: what a
    budget shared by several processes (Spark's tasks) is claimed for before the run. Nothing
    is sent. (Not a verb of the client: only such a shared budget needs it.)"""
    call, frame = client._bind(df, call)
    task = run_sync(task_type_for(call).prepare(call, frame, client))
    distinct, _invalid, _repeated = distinct_requests(task.requests(row_tuples(frame)))
    sizes = [item.reserve_tokens for item in distinct.values()]
    return sum(sizes), max(sizes, default=0)
