"""Scoring a whole batch of rows with in-process models, each prediction kept in the ledger.

What ``predict()`` does per row through the engine (a request key, a ledger lookup, the model,
a ledger record), done per batch instead: a Spark Arrow batch of 10,000 rows costs the engine
tens of microseconds of Python per row (its per-key state, deduplication, journal), while the
model costs a fraction of one. Here the keys of a batch are computed in one pass over plain
Python values, looked up with :meth:`~.table.Ledger.lookup_ok`, the missing rows scored in one
``pyfunc.predict`` per model (a rejected batch halved until each bad row fails alone, as
:func:`~.scoring.predict_isolating_errors` does) and the outcomes written with one
:meth:`~.table.Ledger.upsert`.

The keys are :class:`~.predict.task.PredictTask`'s, byte for byte (numeric columns take a faster
road to the same values; any other column goes through ``PredictTask.requests`` itself), so
``predict()`` and ``model_udf(..., use_ledger=True)`` answer each other's rows from the ledger.

What the engine gives that this leaves out, and why that is right for in-process models: no
journal (an answer costs no money; one lost in a crash between the model and the write is
scored again by the rerun), no claims between concurrent runs (the Spark driver turns them off:
a task's rows are its own), no token budget (no tokens).

The writes can go on a thread (:class:`BackgroundWrites`, ``score_keyed(writes=...)``): a
Spark task's batches come one after another, and with the write on the task's own thread each
batch waits for SQLite (a few microseconds per row, and the other workers' write locks, which
SQLite waits out by sleeping). There the write of batch k runs while batch k+1 is transferred
and scored. ``drain`` waits until everything handed over is written and raises the first failure:
the task calls it before it ends, so a task that succeeds has every prediction in the ledger
and a retried or rerun task scores none of them again. What a crash loses before the write
(at most ``max_pending`` batches and the one being written) is scored again by the retry:
in-process models cost nothing per call, so no journal is kept.

While a batch's records wait, its answers are held here too: a later batch of the same task
asking for the same key takes the answer instead of scoring it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import tenacity

from ...errors import InvalidInputError, RowError, UnsupportedModelError
from ...ledger.table import FAILED, OK, Ledger, new_record
from ...ledger.writer import database_away
from ..chat.rendering import row_tuples
from .models import IN_PROCESS, ResolvedModel, load_model, short_error
from .scoring import IN_PROCESS_ENDPOINT, predict_rows
from .task import PredictCall, PredictTask

#: What this process scored this way (a Spark Python worker's own figures; tests read them).
counters: Counter[str] = Counter()
_NUMERIC = "biuf"  # numpy kinds whose cells become the same Python numbers either way
MISSING = object()


@dataclass
class KeyedBatch:
    """A batch's outcome, one entry per input row."""

    values: list[Any]
    errors: list[str | None]
    scored: int = 0  # distinct requests the model scored now
    cached: int = 0  # rows answered from the ledger
    failed: int = 0  # rows with an error


def request_keys(frame: Any, call: PredictCall, models: dict[str, ResolvedModel]
                 ) -> list[str | RowError]:
    """Each row's request key as :class:`~.predict.task.PredictTask` makes it, or its error."""
    columns = list(call.input_columns)
    features = frame[columns]
    if not all(dtype.kind in _NUMERIC and not hasattr(dtype, "na_value")
               for dtype in features.dtypes):
        # Text, dates, nullable extension types: PredictTask's own per-row conversion.
        task = PredictTask(call, models)
        return [item if isinstance(item, RowError) else item.key
                for item in task.requests(row_tuples(frame[call.columns_read()]))]
    # A numpy column cast to object holds the Python numbers itertuples gives PredictTask
    # (float, int, bool), so repr of a row's list is the text its key hashes.
    rows = features.to_numpy(dtype=object).tolist() if len(columns) > 1 else \
        [[v] for v in features.iloc[:, 0].tolist()]
    prefixes = {name: f"predict|{model.identity}|{columns!r}|"
                for name, model in models.items() if not model.error}
    sha = hashlib.sha256
    if call.model is not None:
        prefix = prefixes.get(call.model)
        if prefix is None:
            return [_unusable(call.model, models.get(call.model))] * len(rows)
        return [sha(f"{prefix}{values!r}".encode()).hexdigest() for values in rows]
    keys: list[str | RowError] = []
    for ref, values in zip(frame[call.model_column].tolist(), rows, strict=True):
        if ref is None or (isinstance(ref, float) and math.isnan(ref)):
            keys.append(InvalidInputError(f"model column '{call.model_column}' is empty"))
            continue
        ref = ref if isinstance(ref, str) else str(ref)
        prefix = prefixes.get(ref)
        keys.append(_unusable(ref, models.get(ref)) if prefix is None else
                    sha(f"{prefix}{values!r}".encode()).hexdigest())
    return keys


def score_keyed(ledger: Ledger, frame: Any, call: PredictCall,
                models: dict[str, ResolvedModel], *, run_id: str | None = None,
                outage_s: float = 60.0, writes: BackgroundWrites | None = None) -> KeyedBatch:
    """Every row of ``frame`` (a 0..n-1 index) answered: from the ledger where it holds an
    ``ok`` answer for the row's key, else scored now and written. Rows that share a key are
    scored once. ``models``: in-process models only (served ones go through the engine).
    ``writes``: write on that thread (and take its answers not written yet); else now."""
    n = len(frame)
    values: list[Any] = [None] * n
    errors: list[str | None] = [None] * n
    out = KeyedBatch(values, errors)
    keys = request_keys(frame, call, models)
    # key -> the rows asking for it, grouped by model (dicts keep the input order)
    wanted: dict[str, dict[str, list[int]]] = {}
    names = [call.model] * n if call.model is not None else \
        [r if isinstance(r, str) else str(r) for r in frame[call.model_column].tolist()]
    for row, key in enumerate(keys):
        if isinstance(key, RowError):
            errors[row] = key.as_cell()
            out.failed += 1
            continue
        wanted.setdefault(names[row], {}).setdefault(key, []).append(row)
    if not wanted:
        counters["rows"] += n
        return out
    scope, partition = call.scope, call.partition_key
    records: list[dict[str, Any]] = []
    queued = _queued_answers(writes, wanted, values)
    out.cached += queued
    every_key = [key for by_key in wanted.values() for key in by_key]
    hits = ledger.lookup_ok(every_key, partition, scope) if every_key else {}
    answers: dict[str, Any] = {}
    for name, by_key in wanted.items():
        missing: dict[str, list[int]] = {}
        for key, rows in by_key.items():
            hit = hits.get(key)
            value = _stored_value(hit) if hit is not None else MISSING
            if value is MISSING:
                missing[key] = rows
                continue
            for row in rows:
                values[row] = value
            out.cached += len(rows)
            if hit["partition_key"] != partition or hit["scope"] != scope:
                # As the engine does: the answer recorded under this partition too.
                records.append(_record(key, name, OK, call, run_id, response=hit["response"],
                                       attempts=0, endpoint="ledger"))
        if missing:
            _score_missing(models[name], frame, call, missing, out, records, run_id, answers)
    if records and writes is not None:
        writes.put(records, answers)
    elif records:
        write_records(ledger, records, outage_s)
    counters["rows"] += n
    counters["scored"] += out.scored
    counters["cached"] += out.cached
    return out


def _queued_answers(writes: BackgroundWrites | None, wanted: dict[str, dict[str, list[int]]],
                    values: list[Any]) -> int:
    """Rows answered by an earlier batch's records still waiting for the writer (taken out of
    ``wanted``); their records are that batch's."""
    if writes is None:
        return 0
    answered = 0
    for by_key in wanted.values():
        for key, value in writes.answers_for(by_key).items():
            for row in by_key.pop(key):
                values[row] = value
                answered += 1
    return answered


def _stored_value(hit: dict[str, Any]) -> Any:
    try:
        return json.loads(hit["response"])
    except (TypeError, ValueError):  # a hand-edited record: score the row again, as the engine
        return MISSING


def _score_missing(model: ResolvedModel, frame: Any, call: PredictCall,
                   missing: dict[str, list[int]], out: KeyedBatch,
                   records: list[dict[str, Any]], run_id: str | None,
                   answers: dict[str, Any]) -> None:
    """One model call for the distinct requests ``missing`` names (the first row of each)."""
    keys = list(missing)
    started = time.perf_counter()
    try:
        if model.kind != IN_PROCESS:
            raise UnsupportedModelError(f"'{model.name}' is served, not an in-process model")
        pyfunc = load_model(model)
    except RowError as exc:
        predictions, problems = [None] * len(keys), [exc] * len(keys)
    except Exception as exc:  # every row of the model fails with this; no split helps
        problem = UnsupportedModelError(
            f"model '{model.name}' ({model.uri}) could not be loaded: {short_error(exc)}")
        predictions, problems = [None] * len(keys), [problem] * len(keys)
    else:
        first_rows = [rows[0] for rows in missing.values()]
        features = frame[list(call.input_columns)]
        if len(first_rows) != len(frame):
            features = features.iloc[first_rows]
        predictions, problems = predict_rows(pyfunc, features.reset_index(drop=True),
                                             model.name)
        counters["predict_calls"] += 1
    latency_ms = round((time.perf_counter() - started) * 1000, 3)
    dumps = json.dumps
    for key, prediction, problem in zip(keys, predictions, problems, strict=True):
        rows = missing[key]
        response = None
        kind = type(prediction)
        if kind is int or (kind is float and math.isfinite(prediction)):
            response = repr(prediction)  # what json.dumps writes for these, at a third the cost
        elif problem is None:
            try:
                response = dumps(prediction)
            except (TypeError, ValueError) as exc:
                from ...errors import MalformedResponseError

                problem = MalformedResponseError(f"a prediction is not JSON data: {exc}")
        if problem is None:
            for row in rows:
                out.values[row] = prediction
            answers[key] = prediction
            records.append(_record(key, model.name, OK, call, run_id, response=response,
                                   attempts=1, endpoint=IN_PROCESS_ENDPOINT,
                                   latency_ms=latency_ms))
        else:
            cell = problem.as_cell()
            for row in rows:
                out.errors[row] = cell
            out.failed += len(rows)
            records.append(_record(key, model.name, FAILED, call, run_id, error=cell,
                                   error_type=problem.error_type.value, attempts=1,
                                   endpoint=IN_PROCESS_ENDPOINT, latency_ms=latency_ms))
    out.scored += len(keys)


def _record(key: str, model: str, status: str, call: PredictCall, run_id: str | None, *,
            response: str | None = None, error: str | None = None,
            error_type: str | None = None, attempts: int, endpoint: str,
            latency_ms: float | None = None) -> dict[str, Any]:
    """The ledger record of one scored row (no tokens: a model is not billed by them)."""
    return new_record(key, call.scope, call.partition_key, model, status, response, error,
                      error_type, 0, 0, attempts, endpoint, latency_ms, run_id)


def _unusable(ref: str, model: ResolvedModel | None) -> RowError:
    return UnsupportedModelError(model.error if model is not None and model.error else
                                 f"unknown model '{ref}'")


# -- the ledger writes, on a thread -----------------------------------------------------------
class BackgroundWrites:
    """One writer thread for one task's batches (one call: one scope and partition)."""

    def __init__(self, ledger: Ledger, *, outage_s: float, max_pending: int = 4):
        self.ledger = ledger
        self.outage_s = outage_s
        # Bounded: a slow database holds the task back instead of piling records up in memory.
        self._queue: queue.Queue[tuple[list[dict[str, Any]], list[str]] | None] = \
            queue.Queue(maxsize=max_pending)
        self._answers: dict[str, Any] = {}  # key -> value of an ok record queued, not written
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="batchllm-ledger-writes",
                                        daemon=True)
        self._thread.start()

    def answers_for(self, keys: Any) -> dict[str, Any]:
        """The values of queued ok records for any of ``keys``."""
        with self._lock:
            if not self._answers:
                return {}
            answers = self._answers
            return {key: answers[key] for key in keys if key in answers}

    def put(self, records: list[dict[str, Any]], answers: dict[str, Any]) -> None:
        """Write ``records`` soon; ``answers``: the values of their ok records, by key."""
        self._raise_if_failed()
        with self._lock:
            self._answers.update(answers)
        self._queue.put((records, list(answers)))

    def drain(self) -> None:
        """Block until every record handed over is written; raise the first write's failure."""
        self._queue.join()
        self._raise_if_failed()

    def close(self) -> None:
        """Drain, then end the thread (also when draining raises)."""
        try:
            self.drain()
        finally:
            self._queue.put(None)
            self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"batchllm: predictions could not be written to the ledger: {self._error}"
            ) from self._error

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            # Everything queued meanwhile in the same transaction: fewer waits for the other
            # workers' write locks, which SQLite sleeps out in steps of milliseconds.
            while items[-1] is not None:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is None
            batches = [item for item in items if item is not None]
            try:
                if batches and self._error is None:  # after a failure the task fails
                    records = batches[0][0] if len(batches) == 1 else \
                        [r for records, _ in batches for r in records]
                    write_records(self.ledger, records, self.outage_s)
            except BaseException as exc:  # handed to the task's thread by drain() / put()
                self._error = exc
            finally:
                with self._lock:
                    for _, keys in batches:
                        for key in keys:
                            self._answers.pop(key, None)
                for _ in items:
                    self._queue.task_done()
            if stop:
                return


def write_records(ledger: Ledger, records: list[dict[str, Any]], outage_s: float) -> None:
    """One upsert; a database that is away (a restart, a cut) is waited for up to
    ``outage_s``, as the engine's writer does, and then the batch fails (the task's retry
    scores what was not written)."""
    for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_delay(outage_s),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            retry=tenacity.retry_if_exception(database_away), reraise=True):
        with attempt:
            ledger.upsert(records)
