"""``mode="batch_api", deadline=D``: the batch API's half price, and the rows answered by D.

A provider's batch API costs half and promises only "within 24 h". With a deadline, every row
goes to the batch API first, and the call keeps, while the batches run, the time the online
endpoints would need for the rows still unanswered:

    need(rows) = rows / rate * SAFETY_FACTOR + MARGIN_S   (+ WAKE_S with wait=False)

``rate`` adds up, over the endpoints serving the model, the least of ``max_concurrency /
latency``, ``requests_per_minute / 60`` and ``tokens_per_minute / 60 / tokens a request``;
``latency`` is the median of the endpoint's last online answers of the model in the ledger
(``MEASURED_RECORDS``; batch lines excluded), or ``UNMEASURED_LATENCY_S`` plus
``UNMEASURED_S_PER_TOKEN`` per ``max_tokens`` where the ledger has none. The call polls the
batches no later than ``deadline - need``; once that time comes (the switch), the rows
still unanswered go online:

1. the partition's unfinished batches are cancelled, and the call waits up to
   ``CANCEL_WAIT_S`` for them to end: a cancelled batch keeps the lines it answered, which
   are collected and used (at the batch price), as every ended batch's are;
2. the rows none of them answered are sent to the online endpoints (at the online price),
   within the call's token budget and ``budget_usd``, what the batches were charged included;
3. a batch that ends after its rows went online (a cancel too late, a stalled batch that
   wakes) has answered rows twice: the ledger keeps the online answer, the first, and the
   batch's lines are counted with their cost as duplicates (``stats.deadline``), from the
   batch book (:func:`duplicates`), also where a later run collects them.

A deadline the online endpoints cannot meet even at the start (``need`` without the margins
is more than the time left) is said at the start, as a WARNING with the figures, and every row
goes online at once. With ``wait=False`` the call returns after submitting and records the
switch time on the partition's batches (``switch_at``): the batch-collect sensor launches a
run of the partition at that time, which does the switch; ``WAKE_S`` makes the switch that
much earlier, for a sensor tick and a run's start.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ..delivery.batch_api.book import COLLECTED, SUBMIT_FAILED, SUBMITTING, BatchBook
from ..errors import InferenceConfigError

#: The online need is taken this many times the estimate (latency varies, retries happen).
SAFETY_FACTOR = 1.5
#: Seconds added to it: the cancel wait, collecting what the batches answered, starting the
#: online requests and writing the last answers.
MARGIN_S = 10.0
#: Seconds added with ``wait=False``: the sensor's tick (60 s by default) and a run's start.
WAKE_S = 90.0
#: Seconds the switch waits for cancelled batches to end (their answered lines are used).
CANCEL_WAIT_S = 5.0
#: An endpoint's latency is the median of its last this many online answers of the model.
MEASURED_RECORDS = 200
#: A request's latency where the ledger has no online answer of the endpoint and model: a
#: slow start plus a slow stream (20 tokens a second) for each of ``max_tokens``.
UNMEASURED_LATENCY_S = 2.0
UNMEASURED_S_PER_TOKEN = 0.05


def deadline_at(deadline: Any, *, now: float | None = None) -> float | None:
    """The epoch seconds of ``deadline``: a ``datetime`` (naive: local time), a ``timedelta``
    from now, a number of epoch seconds, or None."""
    if deadline is None:
        return None
    now = time.time() if now is None else now
    if isinstance(deadline, dt.datetime):
        return deadline.timestamp()  # a naive datetime is local time, as Python reads it
    if isinstance(deadline, dt.timedelta):
        return now + deadline.total_seconds()
    if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
        return float(deadline)
    raise InferenceConfigError(
        f"deadline must be a datetime (naive: local time) or a timedelta from now, got "
        f"{type(deadline).__name__} {deadline!r}.")


def iso(epoch: float | None) -> str | None:
    return (dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")
            if epoch is not None else None)


@dataclass
class OnlineRate:
    """How fast the online endpoints answer a model's requests: requests a second, and how
    each endpoint's part was found (``basis``)."""

    requests_per_s: float
    basis: list[str] = field(default_factory=list)

    def seconds_for(self, rows: int) -> float:
        return rows / self.requests_per_s if self.requests_per_s > 0 else float("inf")


def online_rate(settings: Any, ledger: Any, book_lines: sa.Table, model: str, *,
                max_tokens: int, tokens_per_request: float) -> OnlineRate:
    """The online endpoints' rate for ``model`` (see the module's docstring)."""
    total, basis = 0.0, []
    for endpoint in settings.endpoints:
        if model not in endpoint.served_models or endpoint.protocol != "openai":
            continue
        measured = measured_latency_s(ledger, book_lines, endpoint.name, model,
                                      timeout_s=settings.request_timeout_s)
        latency = measured if measured is not None else (
            UNMEASURED_LATENCY_S + UNMEASURED_S_PER_TOKEN * max_tokens)
        rates = [endpoint.max_concurrency / max(latency, 1e-3)]
        if endpoint.requests_per_minute:
            rates.append(endpoint.requests_per_minute / 60.0)
        if endpoint.tokens_per_minute and tokens_per_request > 0:
            rates.append(endpoint.tokens_per_minute / 60.0 / tokens_per_request)
        total += min(rates)
        how = (f"median of its last online answers {measured:.3f} s" if measured is not None
               else f"not measured yet, taken as {latency:.1f} s")
        basis.append(f"{endpoint.name}: {min(rates):.1f} requests/s ({how}, "
                     f"max_concurrency {endpoint.max_concurrency})")
    return OnlineRate(total, basis)


def measured_latency_s(ledger: Any, book_lines: sa.Table, endpoint: str, model: str, *,
                       timeout_s: float) -> float | None:
    """The median latency of the endpoint's last online answers of ``model`` in the ledger
    (records of keys with a line in the batch book, whose latency is their batch's, left
    out), or None."""
    table = ledger.table
    query = (sa.select(table.c.latency_ms)
             .where(table.c.endpoint == endpoint, table.c.model == model,
                    table.c.status == "ok", table.c.latency_ms.is_not(None),
                    table.c.latency_ms <= timeout_s * 1000.0,
                    ~sa.exists().where(book_lines.c.request_key == table.c.request_key))
             .order_by(table.c.updated_at.desc()).limit(MEASURED_RECORDS))
    with ledger.engine.connect() as conn:
        found = [float(v) for v in conn.execute(query).scalars()]
    return statistics.median(found) / 1000.0 if found else None


class DeadlineKeeper:
    """The deadline of one batch-mode call: when to switch, and the figures it reports.

    Its policy reads the time only through ``clock`` (epoch seconds; ``time.time`` unless a
    test gives its own) and the online endpoints' ``rate``; :meth:`measured` makes one with the
    rate measured from the ledger."""

    def __init__(self, deadline: float, rate: OnlineRate, *, book: BatchBook | None, wait: bool,
                 scope: str = "", partition_key: str = "", log: Any = None,
                 clock: Callable[[], float] = time.time):
        self.deadline = deadline
        self.rate = rate
        self.book, self.scope, self.partition_key = book, scope, partition_key
        self.wait = wait
        self.log = log or logging.getLogger("dagster_batchllm")
        self.clock = clock
        self.switched_at: float | None = None
        self.switch_planned: float | None = None
        self.online_rows = 0
        self.batch_rows = 0
        self.duplicate_rows = 0
        self.duplicate_cost_usd = 0.0

    @classmethod
    def measured(cls, deadline: float, *, settings: Any, ledger: Any, book: BatchBook,
                 model: str | None, max_tokens: int, tokens_per_request: float, wait: bool,
                 scope: str, partition_key: str, log: Any = None) -> DeadlineKeeper:
        """The keeper of a call of ``model`` (None: a model column), its online rate measured
        from the ledger's past answers (see :func:`online_rate`)."""
        models = [model] if model is not None else sorted(
            {m for e in settings.endpoints if e.batch_api for m in e.models})
        rates = [online_rate(settings, ledger, book.lines, m, max_tokens=max_tokens,
                             tokens_per_request=tokens_per_request) for m in models]
        # A model column: the slowest model's rate (its rows may be all of them).
        rate = min(rates, key=lambda r: r.requests_per_s) if rates else OnlineRate(0.0)
        return cls(deadline, rate, book=book, wait=wait, scope=scope,
                   partition_key=partition_key, log=log)

    def need_s(self, rows: int) -> float:
        """Seconds the online endpoints need for ``rows``, margins included."""
        if rows <= 0:
            return 0.0
        return (self.rate.seconds_for(rows) * SAFETY_FACTOR + MARGIN_S
                + (0.0 if self.wait else WAKE_S))

    def switch_at(self, rows: int) -> float:
        return self.deadline - self.need_s(rows)

    def due(self, rows: int, now: float | None = None) -> bool:
        return rows > 0 and (self.clock() if now is None else now) >= self.switch_at(rows)

    def say_if_out_of_reach(self, rows: int) -> bool:
        """At the start: whether even the online endpoints cannot answer ``rows`` by the
        deadline (a WARNING with the figures, once)."""
        left = self.deadline - self.clock()
        bare = self.rate.seconds_for(rows)
        if rows and bare > left:
            self.log.warning(
                f"batchllm: the deadline {iso(self.deadline)} cannot be met even online: "
                f"{rows} rows need about {bare:.0f} s at {self.rate.requests_per_s:.1f} "
                f"requests/s ({'; '.join(self.rate.basis) or 'no online endpoint serves the model'}"
                f"), {max(0.0, left):.0f} s are left; sending them online now, as fast as the "
                "endpoints allow")
            return True
        return False

    def record_switch_time(self, rows: int) -> None:
        """With wait=False: when the partition's rows must go online, on its batches (the
        batch-collect sensor launches a run then)."""
        self.switch_planned = self.switch_at(rows)
        assert self.book is not None, "a keeper without a book records no switch time"
        self.book.set_switch_at(self.scope, self.partition_key, self.switch_planned)

    def figures(self, *, finished_at: float, unanswered: int) -> dict[str, Any]:
        """``status``: "met" (every row answered by the deadline), "pending" (rows still
        wait for batches and the deadline is ahead: a ``wait=False`` call) or "missed"."""
        met = finished_at <= self.deadline and unanswered == 0
        pending = (not met and finished_at <= self.deadline and self.switched_at is None
                   and self.switch_planned is not None)
        return {
            "deadline": iso(self.deadline),
            "finished_at": iso(finished_at),
            "met": met,
            "status": "met" if met else "pending" if pending else "missed",
            "switched_online_at": iso(self.switched_at),
            "switch_planned_at": iso(self.switch_planned),
            "rows_by_batch": self.batch_rows,
            "rows_online": self.online_rows,
            "duplicate_rows": self.duplicate_rows,
            "duplicate_cost_usd": round(self.duplicate_cost_usd, 9),
            "online_requests_per_s": round(self.rate.requests_per_s, 3),
        }


async def cancel_unfinished(book: BatchBook, protocols: dict[str, Any], scope: str,
                            partition_key: str, log: Any) -> list[str]:
    """Cancel the partition's batches not yet ended (and not yet delivered); their
    submission ids."""
    def cancel() -> list[str]:
        subs = []
        for row in book.all_batches(scope, partition_key):
            if row["status"] in (COLLECTED, SUBMIT_FAILED) or row["delivered_at"] is not None:
                continue
            subs.append(row["submission_id"])
            if row["batch_id"] is None or row["status"] == SUBMITTING:
                continue  # nothing at the provider yet to cancel
            try:
                protocols[row["endpoint"]].cancel(row["batch_id"])
            except Exception as exc:  # ended meanwhile, or the provider refuses: it may answer
                reason = protocols[row["endpoint"]].redact.describe(exc, 200)
                log.warning(f"batchllm: cancelling batch {row['batch_id']} failed "
                            f"({reason}); its answers after "
                            "the switch count as duplicates")
        return subs
    return await asyncio.to_thread(cancel)


def duplicates(book: BatchBook, settings: Any, scope: str, partition_key: str
               ) -> tuple[int, float]:
    """The lines that batches of the partition answered after its rows went online (batches
    marked ``overtaken_at``): how many, and what they cost at the batch price."""
    count, cost = 0, 0.0
    for model, endpoint, lines, prompt, completion in book.overtaken_answers(
            scope, partition_key):
        count += lines
        price = settings.price_at(model, endpoint)
        if price is not None:
            prompt_rate, _cached, completion_rate = price.per_mtok(batch=True)
            cost += (prompt * prompt_rate + completion * completion_rate) / 1e6
    return count, cost


__all__ = ["CANCEL_WAIT_S", "MARGIN_S", "SAFETY_FACTOR", "WAKE_S",
           "DeadlineKeeper", "OnlineRate", "cancel_unfinished", "deadline_at", "duplicates",
           "iso", "measured_latency_s", "online_rate"]
