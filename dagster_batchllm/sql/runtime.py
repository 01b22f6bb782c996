"""The batch runtime behind the SQL functions: one event loop, many rows per ``infer`` call.

The engines hand over whole batches (a DuckDB vector of 2048 rows, or every distinct request
SQLite's first pass collected) and block until they are answered. The batches run on one event
loop in a daemon thread, started on first use and kept for the connection's life: the endpoint
pool, its breakers and rate limits then span the whole query, and DuckDB threads that call in at
the same time share one concurrency limit instead of each bringing their own.

Identical requests are sent once per query even when DuckDB evaluates two vectors in parallel:
a request already in flight for another batch is awaited, not sent again. Answers of earlier
batches come from the ledger (``infer`` looks every key up before sending).

Example::

    runtime = Runtime(client, default_model="sim-model")
    call = FUNCTIONS["ai_query"].bind({})
    [(value, error)] = runtime.answer([(call, [("sim-model", "Say hi")])])[0]
    runtime.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..ai_functions.calls import BoundCall, read_outcome
from ..core import InferenceConfigError, InferenceStats
from .scoring import is_scoring_model, score_rows

Outcome = tuple[Any, "str | None"]  # (SQL value, "<error_type>: <message>" or None)
# (model, user message[, file]); a None message is SQL NULL: not sent. The optional third item
# is the row's ``files`` argument (an image's bytes, path or URL), sent as an image part.
Row = tuple[Any, ...]
Key = tuple[str, str, str, Any]  # (request id, model, message, file or None)
NULL_OUTCOME: Outcome = (None, None)

class Runtime:
    """Answers batches of rows for bound calls through one :class:`~.client.InferenceClient`."""

    def __init__(self, client: Any, *, default_model: str | None = None,
                 partition_key: str | None = None, run_id: str | None = None,
                 logger: Any = None, scope: str | None = None, owns_client: bool = False):
        self.client = client
        self.default_model = default_model  # else the settings' rule (see model_for)
        self.partition_key = partition_key
        self.run_id = run_id
        self.logger = logger
        self.scope = scope
        self._owns_client = owns_client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._inflight: dict[Key, asyncio.Future] = {}  # loop thread only
        self._stats = InferenceStats()
        self._stats_lock = threading.Lock()
        # What each cascade call chose and measured (semantic.cascade.CascadeReport), in order
        self.cascade_reports: list[Any] = []

    # -- models -----------------------------------------------------------------------------
    def model_for(self, function: str, endpoint: Any, *, required: bool,
                  cascade: Any = None) -> str:
        """The served model an ``endpoint`` argument names; None means the default model.
        ``ai_query`` may also name an embedding model (its rows are embedded). A call with a
        ``cascade`` names its models there (its rows are keyed on the oracle)."""
        settings = self.client.settings
        if cascade is not None:
            if endpoint is not None:
                raise InferenceConfigError(
                    f"{function}: pass 'endpoint' or 'cascade', not both: the cascade names its "
                    f"models (proxy '{cascade.proxy}', oracle '{cascade.oracle}').")
            cascade.check_models(settings.models, function)
            return cascade.oracle
        served = settings.models
        if function == "ai_query":
            served = served | settings.embedding_models
        if endpoint is None:
            if required:
                raise InferenceConfigError(f"{function}: argument 'endpoint' is NULL.")
            endpoint = self.default_model or self.client.settings.model_when_unnamed
            if endpoint is None:
                raise InferenceConfigError(
                    f"{function}: no default model; pass the argument 'endpoint' (one of "
                    f"{sorted(served)}) or set default_model.")
        if not isinstance(endpoint, str):
            raise InferenceConfigError(
                f"{function}: argument 'endpoint' must be a STRING naming a served model, got "
                f"{type(endpoint).__name__} {endpoint!r}.")
        if endpoint not in served and function == "ai_query" and is_scoring_model(settings,
                                                                                   endpoint):
            return endpoint  # a traditional ML model (MLflow): see sql/scoring.py
        if endpoint not in served:
            raise InferenceConfigError(
                f"{function}: argument 'endpoint' names '{endpoint}', which no configured "
                f"endpoint serves; served models: {sorted(served)}.")
        return endpoint

    # -- answering --------------------------------------------------------------------------
    def answer(self, batches: Sequence[tuple[BoundCall, Sequence[Row]]]) -> list[list[Outcome]]:
        """Answer every row of every batch (batches run concurrently); blocks until done."""
        if not batches:
            return []
        future = asyncio.run_coroutine_threadsafe(self._answer_all(batches), self._ensure_loop())
        return future.result()

    async def _answer_all(self, batches):
        return list(await asyncio.gather(*(self._answer_batch(call, rows)
                                           for call, rows in batches)))

    async def _answer_batch(self, call: BoundCall, rows: Sequence[Row]) -> list[Outcome]:
        loop = asyncio.get_running_loop()
        mine: dict[Key, list[int]] = {}
        theirs: dict[Key, tuple[asyncio.Future, list[int]]] = {}
        for i, row in enumerate(rows):
            model, text = row[0], row[1]
            if text is None:
                continue
            # Identical bytes are one key (bytes hash by value); the request key that infer()
            # computes covers them too, so the ledger tells different images apart.
            key = (call.request_id, model, text, _file_key(row[2] if len(row) > 2 else None))
            if key in mine:
                mine[key].append(i)
            elif key in theirs:
                theirs[key][1].append(i)
            elif key in self._inflight:
                theirs[key] = (self._inflight[key], [i])
            else:
                mine[key] = [i]
        # A cascade's outcomes are read already (its proxy's and oracle's replies differ)
        reading = call if call.cascade is None else dataclasses.replace(call, reader=None)
        futures = {key: loop.create_future() for key in mine}
        self._inflight.update(futures)
        try:
            raw = await self._infer(call, list(mine)) if mine else []
        except BaseException as exc:
            for future in futures.values():
                future.set_exception(exc)
                future.exception()  # retrieved here: the other batch re-raises it if it waits
            raise
        finally:
            for key in mine:
                self._inflight.pop(key, None)
        for key, outcome in zip(mine, raw, strict=True):
            futures[key].set_result(outcome)
        outcomes: list[Outcome] = [NULL_OUTCOME] * len(rows)
        repeats = sum(len(v) for v in mine.values()) - len(mine)
        embedding = self.client.settings.embedding_models
        for key, indices in mine.items():
            # A vector is the value itself; the call's reader is for a chat reply.
            outcome = (futures[key].result() if key[1] in embedding
                       else read_outcome(reading, futures[key].result()))
            for i in indices:
                outcomes[i] = outcome
        for key, (future, indices) in theirs.items():
            outcome = (await future if key[1] in embedding
                       else read_outcome(reading, await future))
            for i in indices:
                outcomes[i] = outcome
        with self._stats_lock:
            # infer() counted the distinct rows it was given; the rest are repeats and NULLs.
            self._stats.deduplicated += repeats + sum(len(v[1]) for v in theirs.values())
            self._stats.rows += len(rows) - len(mine)
        return outcomes

    async def _infer(self, call: BoundCall, keys: list[Key]
                     ) -> list[tuple[Any, str | None]]:
        """The (value, error) of each key's request: chat models' through ``infer``, embedding
        models' through ``embed`` (a vector as a list of floats); a cascade's through it."""
        if call.cascade is not None:
            return await self._cascade(call, keys)
        scoring = [i for i, k in enumerate(keys) if is_scoring_model(self.client.settings, k[1])]
        if scoring:  # rows for traditional ML models are predicted, the others as below
            return await self._score_then_infer(call, keys, scoring)
        embedding = self.client.settings.embedding_models
        if not any(k[1] in embedding for k in keys):
            return await self._infer_chat(call, keys)
        by_kind: dict[str | None, list[int]] = {}
        for i, key in enumerate(keys):
            by_kind.setdefault(key[1] if key[1] in embedding else None, []).append(i)
        outcomes: list[tuple[Any, str | None]] = [(None, None)] * len(keys)
        for model, indices in by_kind.items():
            chosen = [keys[i] for i in indices]
            found = (await self._infer_chat(call, chosen) if model is None
                     else await self._embed(call, model, [k[2] for k in chosen]))
            for i, outcome in zip(indices, found, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _cascade(self, call: BoundCall, keys: list[Key]) -> list[tuple[Any, str | None]]:
        """Every row of the call through its cascade at once (the thresholds are learned over
        them): see dagster_batchllm.semantic.cascade."""
        from ..semantic.cascade import acascade, kind_of

        result = await acascade(
            self.client, call, [k[2] for k in keys], call.cascade, kind=kind_of(call),
            partition_key=self.partition_key, scope=self.scope, run_id=self.run_id,
            logger=self.logger)
        self._add(result.stats)
        with self._stats_lock:
            self.cascade_reports.append(result.report)
        return result.outcomes

    async def _score_then_infer(self, call: BoundCall, keys: list[Key], scoring: list[int]
                                ) -> list[tuple[Any, str | None]]:
        outcomes: list[tuple[Any, str | None]] = [(None, None)] * len(keys)
        chosen = set(scoring)
        rest = [i for i in range(len(keys)) if i not in chosen]
        predicted, stats = await score_rows(
            self.client, [(keys[i][1], keys[i][2]) for i in scoring],
            partition_key=self.partition_key, scope=self.scope, run_id=self.run_id,
            logger=self.logger)
        for stat in stats:
            self._add(stat)
        for i, outcome in zip(scoring, predicted, strict=True):
            outcomes[i] = outcome
        if rest:
            for i, outcome in zip(rest, await self._infer(call, [keys[i] for i in rest]),
                                  strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _embed(self, call: BoundCall, model: str, texts: list[str]
                     ) -> list[tuple[Any, str | None]]:
        import pandas as pd

        if call.params or (call.response_format is not None
                           and not call.format_from_return_type):
            raise InferenceConfigError(
                f"{call.function}: '{model}' is an embedding model: it takes no "
                "modelParameters or responseFormat (only failOnError).")
        result = await self.client.aembed(
            pd.DataFrame({"text": texts}), input_column="text", model=model,
            output_column="output", error_column="error", partition_key=self.partition_key,
            scope=self.scope, run_id=self.run_id, logger=self.logger)
        self._add(result.stats)
        return [(None if vector is None else vector.tolist(), error)
                for vector, error in zip(result.df["output"], result.df["error"], strict=True)]

    async def _infer_chat(self, call: BoundCall, keys: list[Key]
                          ) -> list[tuple[Any, str | None]]:
        """One ``infer`` for the rows without a file, one for those with one (images=)."""
        with_file = [i for i, key in enumerate(keys) if key[3] is not None]
        if not with_file:
            return await self._infer_frame(call, keys, images=False)
        if len(with_file) == len(keys):
            return await self._infer_frame(call, keys, images=True)
        chosen = set(with_file)
        plain = [i for i in range(len(keys)) if i not in chosen]
        outcomes: list[tuple[Any, str | None]] = [NULL_OUTCOME] * len(keys)
        parts = await asyncio.gather(
            self._infer_frame(call, [keys[i] for i in plain], images=False),
            self._infer_frame(call, [keys[i] for i in with_file], images=True))
        for indices, answered in zip((plain, with_file), parts, strict=True):
            for i, outcome in zip(indices, answered, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _infer_frame(self, call: BoundCall, keys: list[Key], *, images: bool
                           ) -> list[tuple[Any, str | None]]:
        import pandas as pd

        columns = {"model": [k[1] for k in keys], "prompt": [k[2] for k in keys]}
        if images:
            columns[FILES_COLUMN] = [_file_cell(k[3]) for k in keys]
        frame = pd.DataFrame(columns)
        models = set(frame["model"])
        route = {"model": next(iter(models))} if len(models) == 1 else {"model_column": "model"}
        if images:
            route["images"] = FILES_COLUMN
        inference_call = call.inference_call(
            prompt_column="prompt", output_column="output", error_column="error",
            partition_key=self.partition_key, scope=self.scope, **route)
        result = await self.client.ainfer(frame, inference_call, run_id=self.run_id,
                                          logger=self.logger)
        self._add(result.stats)
        return list(zip(result.df["output"].tolist(), result.df["error"].tolist(),
                        strict=True))

    # -- figures ----------------------------------------------------------------------------
    @property
    def stats(self) -> InferenceStats:
        """Figures summed over every batch so far (latency percentiles are not kept)."""
        with self._stats_lock:
            return dataclasses.replace(
                self._stats, endpoints=dict(self._stats.endpoints),
                tokens_by_model={k: dict(v) for k, v in self._stats.tokens_by_model.items()},
                errors_by_type=dict(self._stats.errors_by_type))

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the runtime's loop, where its batches run (the pool, its limits
        and breakers shared), and wait for its result: for work beside the per-row functions,
        such as the aggregates (:mod:`.aggregates`)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._ensure_loop()).result()

    def add_figures(self, stats: InferenceStats) -> None:
        """Count ``stats`` in the connection's figures (``AIFunctions.stats``)."""
        self._add(stats)

    def _add(self, stats: InferenceStats) -> None:
        with self._stats_lock:
            self._stats.add(stats)
            self._stats.endpoints = stats.endpoints

    # -- the loop ---------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="batchllm-sql",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                # Connections are often dropped without close(): stop the thread with them.
                weakref.finalize(self, _stop, loop, thread)
            return self._loop

    def close(self) -> None:
        """Stop the loop thread (and close the client if this runtime created it)."""
        with self._start_lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None:
            _stop(loop, thread)
        if self._owns_client:
            self.client.close()


# The frame column of ai_query's files argument: the name a bad file's row error shows.
FILES_COLUMN = "files"


def _file_key(value: Any) -> Any:
    """A row's file as a hashable key: bytes, a path or URL, or a tuple of those."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return tuple(_file_key(v) for v in value)
    return value


def _file_cell(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=10)
    if not thread.is_alive():
        loop.close()
