"""A run's figures: the progress line it logs as it goes, what its replies cost, and its stats
when it ends."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..pricing import cost_at
from ..results import InferenceStats, RowStatus
from ..settings import InferenceSettings


class Progress:
    """The progress line: rows done, rates, failures and an outlook that says when it stalls."""

    def __init__(self, *, total: int, started: float, interval_s: float):
        self.total = total
        self.started = started
        self.interval_s = interval_s
        self._last_done, self._last_change = 0, time.perf_counter()

    def line(self, done: int, stats: InferenceStats) -> str:
        now = time.perf_counter()
        elapsed = now - self.started
        if done != self._last_done:
            self._last_done, self._last_change = done, now
        rate = done / elapsed if elapsed > 0 else 0.0
        tokens = stats.prompt_tokens + stats.completion_tokens
        failed = sum(stats.errors_by_type.values())
        total = self.total
        if now - self._last_change >= self.interval_s and done < total:
            # An ETA from a rate that has stopped grows without bound: say what happens.
            outlook = f"no row finished in the last {now - self._last_change:.0f} s"
        else:
            eta = (total - done) / rate if rate > 0 else float("inf")
            outlook = f"ETA {eta:.0f} s"
        return (f"batchllm: {done}/{total} rows ({100 * done / max(total, 1):.0f}%), "
                f"{rate:.0f} rows/s, {tokens / max(elapsed, 1e-9):.0f} tokens/s, "
                f"{failed} failed rows, {outlook}")


class ReplyPrices:
    """What a run's replies cost, each at its model's price at the endpoint that answered it
    (online, or a batch line at the batch price: ``batch``), looked up once per endpoint and
    model; and what the run paid, per model (``paid``, for :func:`add_paid`). The run's
    records (:meth:`pay`) and its USD budget (:meth:`cost`) price a reply alike."""

    __slots__ = ("settings", "batch", "paid", "_rates")

    def __init__(self, settings: InferenceSettings, *, batch: bool):
        self.settings, self.batch = settings, batch
        #: per model: [USD of the priced replies, cached tokens, unpriced replies]
        self.paid: dict[str, list] = {}
        self._rates: dict[str | None, dict[str, tuple[float, float, float] | None]] = {}

    def rates(self, model: str, endpoint: str | None) -> tuple[float, float, float] | None:
        """The model's per-token prices at ``endpoint`` (:meth:`~..pricing.Price.per_token`);
        None where it has no price."""
        at_endpoint = self._rates.get(endpoint)
        if at_endpoint is None:
            at_endpoint = self._rates[endpoint] = {}
        rates = at_endpoint.get(model, False)
        if rates is False:
            price = self.settings.price_at(model, endpoint)
            rates = at_endpoint[model] = (price.per_token(batch=self.batch)
                                          if price is not None else None)
        return rates

    def cost(self, model: str, endpoint: str | None, reply: Any) -> float:
        """What ``reply`` (a Completion) cost; 0 where its model has no price."""
        rates = self.rates(model, endpoint)
        if rates is None:
            return 0.0
        return cost_at(rates, reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)

    def pay(self, model: str, endpoint: str | None, prompt_tokens: int, completion_tokens: int,
            cached_tokens: int) -> float | None:
        """What a reply with this usage cost, added to what the run paid; None where its model
        has no price."""
        paid = self.paid.get(model)
        if paid is None:
            paid = self.paid[model] = [0.0, 0, 0]
        paid[1] += cached_tokens
        rates = self.rates(model, endpoint)
        if rates is None:
            paid[2] += 1
            return None
        cost = cost_at(rates, prompt_tokens, completion_tokens, cached_tokens)
        paid[0] += cost
        return cost


def finish_stats(stats: InferenceStats, row_status: bytearray, latencies: Sequence[float], *,
                 started: float) -> None:
    """Count the rows' outcomes into ``stats``; every row must have one."""
    stats.elapsed_s = time.perf_counter() - started
    counts = [0] * len(RowStatus)
    for status in row_status:
        counts[status] += 1
    if counts[RowStatus.PENDING]:
        raise RuntimeError(
            f"internal error: {counts[RowStatus.PENDING]} rows ended without an outcome; "
            "nothing was written for them, a rerun will send them"
        )
    stats.cached = counts[RowStatus.CACHED]
    stats.succeeded = counts[RowStatus.OK] + counts[RowStatus.CACHED]
    stats.failed = counts[RowStatus.FAILED]
    stats.deferred = counts[RowStatus.DEFERRED]
    if latencies:
        ordered = sorted(latencies)
        stats.latency_p50_s = round(ordered[len(ordered) // 2], 4)
        stats.latency_p95_s = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 4)


def estimate_cost(settings: InferenceSettings, tokens_by_model: dict[str, dict[str, int]],
                  *, batch: bool = False) -> float | None:
    """What the tokens cost at each model's online price (``batch``: its batch price); None
    when no model has a price."""
    price_for = settings.batch_price_for if batch else settings.price_for
    total = None
    for model, tokens in tokens_by_model.items():
        price = price_for(model)
        if price is None:
            continue
        total = (total or 0.0) + (tokens["prompt_tokens"] * price[0]
                                  + tokens["completion_tokens"] * price[1]) / 1e6
    return round(total, 6) if total is not None else None


def add_paid(stats: InferenceStats, paid: dict[str, list]) -> None:
    """Put what the run's replies cost and the cached tokens among their prompt tokens
    (``paid``: per model, [USD of the priced replies, cached tokens, unpriced replies]) in
    ``stats.tokens_by_model`` (a model's ``cost_usd`` where every reply of it was priced),
    and their totals in ``stats``."""
    for model, (cost, cached, unpriced) in paid.items():
        per_model = stats.tokens_by_model.setdefault(
            model, {"prompt_tokens": 0, "completion_tokens": 0})
        if cached:  # (a model's figures say nothing of caches that answered nothing)
            per_model["cached_tokens"] = cached
        if not unpriced:
            # To the nano-dollar: a sum of many rows' float costs then rounds (to the
            # micro-dollar, in metadata) as the same tokens at the same price do.
            per_model["cost_usd"] = round(cost, 9)
    paid_totals(stats)


def paid_totals(stats: InferenceStats) -> None:
    """``stats.cost_usd`` and ``stats.cached_tokens`` from its ``tokens_by_model`` (also of a
    call whose figures are several runs' added up): the cost is None where a model's replies
    were not all priced, 0 where nothing was paid."""
    by_model = stats.tokens_by_model.values()
    stats.cached_tokens = sum(t.get("cached_tokens", 0) for t in by_model)
    paid = [t for t in by_model if t.get("prompt_tokens") or t.get("completion_tokens")]
    stats.cost_usd = (round(sum(t["cost_usd"] for t in paid), 9)
                      if all("cost_usd" in t for t in paid) else None)
