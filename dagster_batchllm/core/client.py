"""``InferenceClient``: the whole inference core behind two calls, ``infer`` and ``estimate``.

It imports no dagster, so plain scripts, the SQL functions and Spark executors use it directly;
``BatchInferenceResource`` is a thin Dagster door onto it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from .delivery.batch_api.mode import BatchModeCall, check_mode
from .tasks.chat.call import InferenceCall
from .tasks.embed.call import EmbedCall
from .tasks.embed.client import embed_frame, estimate_embeddings
from .run.engine import InferenceRun
from .errors import InferenceConfigError
from .ledger.table import Ledger
from .delivery.pool import EndpointPool
from .run.prompts import distinct_requests, iter_row_requests, row_tuples
from .results import InferenceEstimate, InferenceResult
from .run.figures import estimate_cost
from .settings import InferenceSettings

log = logging.getLogger("dagster_batchllm")
Result = TypeVar("Result")
# How long a stopping run may take to write its answers before the stop goes through anyway.
_STOP_WAIT_S = 4.0


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

    async def ainfer(
        self,
        df: Any,
        call: InferenceCall | None = None,
        /,
        *,
        run_id: str | None = None,
        supersede_stale: bool = False,
        collect_keys: bool = False,
        logger: Any = None,
        mode: str = "online",
        wait: bool = True,
        **call_fields: Any,
    ) -> InferenceResult:
        """One output per row of ``df``; failures are data in the error column.

        ``call`` (an :class:`InferenceCall`) says what to send; ``call_fields`` are its fields
        (``prompt=``, ``model=``, ``output_column=``, ``max_tokens=``, ...; other names are
        generation parameters such as ``top_p=``), set on top of ``call`` or on their own.
        ``collect_keys``: keep the rows' distinct request keys in ``result.request_keys`` (to
        look their answers up afterwards).
        ``supersede_stale``: this call covers its whole partition, so the partition's records of
        requests it no longer asks for are retired.
        ``mode="batch_api"``: through the provider's offline batch API (an endpoint with
        ``batch_api=True``) at its batch price; ``wait=False`` returns once the batches are
        submitted, the rows deferred "waiting for batch <id>" (see :mod:`.batch_mode`).
        """
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise InferenceConfigError(f"infer() takes a pandas DataFrame, got {type(df).__name__}")
        call = self._bind(df, call, call_fields)
        for name in (call.output_column, call.error_column):
            if name in df.columns:
                raise InferenceConfigError(
                    f"The input already has a column '{name}'; choose another output_column."
                )
        budget = call.token_budget if call.token_budget is not None else self.settings.token_budget
        check_mode(mode, wait)
        keep_keys = collect_keys or bool(supersede_stale and call.partition_key)
        if mode == "batch_api":
            run = await BatchModeCall(self, call, df[call.input_columns()], wait=wait,
                                      token_budget=budget, run_id=run_id,
                                      logger=logger or self.log, collect_keys=keep_keys).run()
        else:
            run = InferenceRun(
                self.settings, call, df[call.input_columns()],
                pool=self.pool, ledger=self.ledger, token_budget=budget,
                partition_key=call.partition_key, run_id=run_id, scope=call.scope,
                logger=logger or self.log, collect_keys=keep_keys,
            )
            await run.run()
        stats = run.stats
        if supersede_stale and call.partition_key:
            await asyncio.to_thread(self.ledger.mark_superseded, call.partition_key, run.keys,
                                    call.scope)
        (logger or self.log).info(f"batchllm: {stats.summary()}")
        return InferenceResult.of_run(df, run, output_column=call.output_column,
                                      error_column=call.error_column)

    def estimate(self, df: Any, call: InferenceCall | EmbedCall | None = None, /,
                 task: str = "chat", **call_fields: Any) -> InferenceEstimate:
        """A dry run of ``infer`` (or, with ``task="embed"`` or an ``EmbedCall``, of
        ``embed``) with the same arguments: nothing is sent."""
        if task == "embed" or isinstance(call, EmbedCall):
            return estimate_embeddings(self, df, call, call_fields)
        if task != "chat":
            raise InferenceConfigError(f"task must be 'chat' or 'embed', got {task!r}")
        call = self._bind(df, call, call_fields)
        rows = row_tuples(df[call.input_columns()])
        distinct, invalid, duplicates = distinct_requests(
            iter_row_requests(rows, call, default_max_tokens=self.settings.default_max_tokens),
            usable=lambda item: self.pool.serves(item.model))
        hits = self.ledger.lookup_ok(list(distinct), call.partition_key, call.scope)
        answered = 0
        tokens_by_model: dict[str, dict[str, int]] = {}
        for key, item in distinct.items():
            if key in hits:
                answered += 1
                continue
            per_model = tokens_by_model.setdefault(
                item.model, {"prompt_tokens": 0, "completion_tokens": 0})
            per_model["prompt_tokens"] += item.typical_prompt_tokens
            per_model["completion_tokens"] += item.max_tokens
        return InferenceEstimate(
            rows=len(df),
            requests_to_send=len(distinct) - answered,
            rows_answered_by_ledger=answered,
            rows_deduplicated=duplicates,
            invalid_rows=invalid,
            estimated_prompt_tokens=sum(t["prompt_tokens"] for t in tokens_by_model.values()),
            max_completion_tokens=sum(t["completion_tokens"] for t in tokens_by_model.values()),
            tokens_by_model=tokens_by_model,
            estimated_cost_usd=estimate_cost(self.settings, tokens_by_model),
        )

    # -- traditional ML models (MLflow): see core/predicting.py --------------------------------
    def predict(self, df: Any, call: Any = None, /, **kwargs: Any) -> Any:
        """Sync door to :meth:`apredict`."""
        return run_sync(self.apredict(df, call, **kwargs))

    async def apredict(self, df: Any, call: Any = None, /, *, run_id: str | None = None,
                       logger: Any = None, supersede_stale: bool = False, models: Any = None,
                       **call_fields: Any) -> Any:
        """One prediction per row of ``df`` from an MLflow model (in process or served):
        ``model=`` or ``model_column=``, ``input_columns=[...]``, ``output_column=``; failures
        are data in ``<output>_error``. Returns a :class:`~.predict.PredictionResult`."""
        from .tasks.predict.client import apredict, predict_call

        return await apredict(self, df, predict_call(call, call_fields), run_id=run_id,
                              logger=logger, supersede_stale=supersede_stale, models=models)
    def embed(self, df: Any, call: EmbedCall | None = None, /, **kwargs: Any
              ) -> InferenceResult:
        """Sync door to :meth:`aembed`."""
        return run_sync(self.aembed(df, call, **kwargs))

    async def aembed(self, df: Any, call: EmbedCall | None = None, /, **kwargs: Any
                     ) -> InferenceResult:
        """One float32 vector (a 1-D numpy array) per row of ``df``; failures are data in the
        error column. ``call`` (an :class:`~.embed_call.EmbedCall`) or its fields as keywords:
        ``input=`` (a template) or ``input_column=``, ``model=``, ``output_column=``,
        ``dimensions=``, ``inputs_per_request=`` ...; and ``run_id``, ``supersede_stale``,
        ``collect_keys``, ``logger`` as for :meth:`ainfer`."""
        return await embed_frame(self, df, call, **kwargs)

    def _bind(self, df: Any, call: InferenceCall | None,
              call_fields: Mapping[str, Any]) -> InferenceCall:
        return InferenceCall.of(call, **call_fields).bind(
            list(df.columns), self.settings.models, self.settings.model_when_unnamed)


def run_sync(coro: Coroutine[Any, Any, Result]) -> Result:
    """Run a coroutine to completion from sync code, also inside a running loop (notebooks).

    A stop reaches the coroutine as a cancellation, so it writes what was answered and lets go
    of what it holds before the caller sees the stop: Ctrl-C (KeyboardInterrupt, Dagster's run
    termination too) and, where nobody else handles it, SIGTERM (the process then still ends
    as SIGTERM says, once the coroutine has stopped). Inside a running loop the coroutine runs
    on a thread of its own, which a KeyboardInterrupt in the caller's thread cancels.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_a_loop = False
    else:
        in_a_loop = True
    # Decided outside the except block above: an error of the coroutine raised in it would
    # carry "RuntimeError: no running event loop" as its context in every traceback.
    if in_a_loop:
        return _run_on_thread(coro)
    with asyncio.Runner() as runner:
        task = runner.get_loop().create_task(coro)
        with _sigterm_cancels(task):
            return runner.run(_await(task))


def _run_on_thread(coro: Coroutine[Any, Any, Result]) -> Result:
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def target() -> None:
        try:
            with asyncio.Runner() as runner:
                outcome["loop"] = runner.get_loop()
                outcome["task"] = runner.get_loop().create_task(coro)
                started.set()
                outcome["value"] = runner.run(_await(outcome["task"]))
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=target, name="batchllm-infer", daemon=True)
    thread.start()
    try:
        thread.join()
    except BaseException:
        # The caller's thread was interrupted: stop the run (it writes what was answered),
        # wait for it a bounded time, then let the interrupt through.
        started.wait(_STOP_WAIT_S)
        if "task" in outcome:
            outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        thread.join(_STOP_WAIT_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _await(task: asyncio.Task) -> Any:
    return await task


@contextlib.contextmanager
def _sigterm_cancels(task: asyncio.Task):
    """While ``task`` runs in the main thread, SIGTERM cancels it (where SIGTERM would
    otherwise kill the process on the spot, losing what was answered); once it has stopped,
    the process ends by SIGTERM after all. Where someone else handles SIGTERM (Dagster turns
    it into a KeyboardInterrupt), their handler stays."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    received: list[int] = []
    loop = task.get_loop()

    def on_sigterm(signum: int, _frame: Any) -> None:
        received.append(signum)
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)  # wake the loop if it is waiting in select

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if received:
            os.kill(os.getpid(), signal.SIGTERM)


