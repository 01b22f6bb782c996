"""Model cascades (LOTUS-style): a cheap proxy answers every row, the oracle only the unsure.

For one call's rows (every distinct text of it, at once: thresholds are learned over them):

1. the **proxy** answers every row with its confidence, read from the reply's logprobs
   (:mod:`.scored`). Where the endpoint gives none, or the reply is unreadable or failed, the
   row has no confidence: it is uncertain and goes to the oracle (the documented fallback: no
   savings, but the oracle's answers);
2. a seeded random **sample** of ``Cascade.sample`` rows (the rows whose SHA-256 of seed and
   text is smallest, so the same rows in any order or engine) is also answered by the
   **oracle**;
3. thresholds are learned on the sample against the oracle's answers, with a margin: the
   sample must reach each target plus 1.645 standard errors (:func:`with_margin`), so the
   whole call reaches it too, not only the sample. ``ai_filter``: with
   ``p`` the proxy's probability of *true*, rows with ``p >= true_at_or_above`` are true, rows
   with ``p <= false_at_or_below`` false: ``false_at_or_below`` is the largest value that keeps
   the sample's recall at ``target_recall``, then ``true_at_or_above`` the smallest that keeps
   its precision at ``target_precision``. ``ai_classify``: rows whose label has confidence
   ``>= accept_at_or_above`` keep the proxy's label, the smallest value at which the sample's
   accuracy (micro precision = micro recall, one label a row) reaches the larger target;
4. the rows between the thresholds go to the oracle; sample rows take the oracle's answer.

Every request goes through :meth:`InferenceClient.arun_call`: the pool, ledger and budgets,
so a rerun pays nothing. The :class:`CascadeReport` says what was chosen and measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

from ..ai_functions.calls import BoundCall, read_outcome
from ..ai_functions.cascade_options import Cascade
from ..core import InferenceStats, run_sync
from .scored import ScoredCall, ScoredReply, answer_confidence

Outcome = tuple[Any, "str | None"]  # (value, "<error_type>: <reason>" or None)
FILTER, CLASSIFY = "filter", "classify"
MARGIN_Z = 1.645  # see with_margin


@dataclasses.dataclass(frozen=True)
class CascadeReport:
    """What one cascade chose and measured (``as_metadata()`` for Dagster metadata: put it in
    an asset's ``MaterializeResult(metadata=...)`` or ``context.add_output_metadata``)."""

    proxy: str
    oracle: str
    rows: int  # distinct row texts the cascade answered
    sample_size: int
    thresholds: dict[str, float | None]
    sample_precision: float | None  # of the thresholds' rule on the sample, against the oracle
    sample_recall: float | None
    oracle_rows: int  # rows the oracle answered: the sample and the uncertain rows
    proxy_cost_usd: float | None  # what this call paid (0 where the ledger answered)
    oracle_cost_usd: float | None
    # The oracle's cost per row this call paid, times every row: what oracle-only would cost
    oracle_only_cost_usd: float | None

    @property
    def oracle_share(self) -> float:
        return self.oracle_rows / self.rows if self.rows else 0.0

    @property
    def cost_usd(self) -> float | None:
        if self.proxy_cost_usd is None or self.oracle_cost_usd is None:
            return None
        return round(self.proxy_cost_usd + self.oracle_cost_usd, 9)

    @property
    def cost_ratio(self) -> float | None:
        """Cascade cost over the oracle-only estimate (None where this call paid nothing)."""
        if not self.oracle_only_cost_usd or self.cost_usd is None:
            return None
        return self.cost_usd / self.oracle_only_cost_usd

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(oracle_share=round(self.oracle_share, 6), cost_usd=self.cost_usd,
                    cost_ratio=None if self.cost_ratio is None else round(self.cost_ratio, 6))
        return data

    def as_metadata(self, prefix: str = "cascade/") -> dict[str, Any]:
        """Flat ``{"cascade/<figure>": value}`` for Dagster materialization metadata (the
        thresholds by name, figures that are None left out)."""
        data = self.as_dict()
        data.update(data.pop("thresholds"))
        return {prefix + key: value for key, value in data.items() if value is not None}


@dataclasses.dataclass
class CascadeResult:
    outcomes: list[Outcome]  # one per input text, in input order
    report: CascadeReport
    stats: InferenceStats  # the proxy's and the oracle's calls added up


def sample_indices(texts: Sequence[str], size: int, seed: int) -> list[int]:
    """The ``size`` texts whose SHA-256 of (seed, text) is smallest: a uniform random sample
    that does not depend on the rows' order."""
    def rank(i: int) -> bytes:
        return hashlib.sha256(f"{seed}\x00{texts[i]}".encode()).digest()
    return sorted(sorted(range(len(texts)), key=rank)[:size])


async def acascade(client: Any, bound: BoundCall, texts: Sequence[str], cascade: Cascade, *,
                   kind: str, partition_key: str | None = None, scope: str | None = None,
                   run_id: str | None = None, logger: Any = None,
                   oracle_delivery: dict[str, Any] | None = None) -> CascadeResult:
    """Answer ``texts`` (user messages, each sendable) through the cascade; see the module.

    ``oracle_delivery``: how the oracle's requests go (``arun_call``'s ``mode``, ``wait``,
    ``deadline``): ``{"mode": "batch_api", "wait": True}`` sends the sample, then the
    uncertain rows, each as a batch at the batch price. The proxy always answers online: its
    confidence comes from logprobs, which batch result lines are not read for."""
    import pandas as pd

    distinct = list(dict.fromkeys(texts))
    base = bound.inference_call(prompt_column="prompt", output_column="output",
                                error_column="error", partition_key=partition_key, scope=scope)
    strict = dataclasses.replace(bound, null_when_unreadable=False)  # keep every reason
    stats = InferenceStats()
    paid: dict[str, list] = {cascade.proxy: [], cascade.oracle: []}  # (cost, fresh rows)

    async def ask(model: str, indices: list[int], scored: bool) -> list[tuple[Any, Any]]:
        if not indices:
            return []
        call = ScoredCall.scoring(base, model=model) if scored else type(base).of(
            base, model=model)
        frame = pd.DataFrame({"prompt": [distinct[i] for i in indices]})
        delivery = {} if scored else oracle_delivery or {}
        result = await client.arun_call(frame, call, run_id=run_id, logger=logger, **delivery)
        stats.add(result.stats)
        paid[model].append((result.stats.cost_usd, int((result.statuses == "ok").sum())))
        return list(zip(result.df["output"].tolist(), result.df["error"].tolist(),
                        strict=True))

    everyone = list(range(len(distinct)))
    proxy_answers = await ask(cascade.proxy, everyone, scored=True)
    proxied = [_proxy_point(strict, reply, error) for reply, error in proxy_answers]
    sample = sample_indices(distinct, cascade.sample, cascade.seed)
    oracle: dict[int, Outcome] = dict(zip(sample, [read_outcome(strict, raw) for raw in
                                                   await ask(cascade.oracle, sample, False)],
                                          strict=True))
    points = [(proxied[i], oracle[i][0]) for i in sample if oracle[i][1] is None]
    if kind == FILTER:
        thresholds, precision, recall = learn_filter(points, cascade.target_precision,
                                                     cascade.target_recall)
    else:
        thresholds, precision, recall = learn_label(
            points, max(cascade.target_precision, cascade.target_recall))
    decided = [_decide(kind, thresholds, point) for point in proxied]
    unsure = [i for i in everyone if i not in oracle and decided[i] is None]
    for i, raw in zip(unsure, await ask(cascade.oracle, unsure, False), strict=True):
        oracle[i] = read_outcome(strict, raw)
    by_text = {distinct[i]: oracle[i] if i in oracle else (decided[i], None) for i in everyone}
    proxy_cost, _ = _paid(paid[cascade.proxy])
    oracle_cost, oracle_fresh = _paid(paid[cascade.oracle])
    oracle_only = (round(oracle_cost / oracle_fresh * len(distinct), 9)
                   if oracle_cost is not None and oracle_fresh else None)
    stats.cost_usd = (None if proxy_cost is None or oracle_cost is None
                      else round(proxy_cost + oracle_cost, 9))
    report = CascadeReport(
        proxy=cascade.proxy, oracle=cascade.oracle, rows=len(distinct),
        sample_size=len(sample), thresholds=thresholds, sample_precision=precision,
        sample_recall=recall, oracle_rows=len(oracle), proxy_cost_usd=proxy_cost,
        oracle_cost_usd=oracle_cost, oracle_only_cost_usd=oracle_only)
    return CascadeResult([by_text[t] for t in texts], report, stats)


def cascade_outcomes(client: Any, call: BoundCall, texts: Sequence[str], **where: Any
                     ) -> list[Outcome]:
    """Sync: ``texts`` through ``call``'s cascade, each outcome as SQL reads it (an unreadable
    reply is NULL where the call says so); the report goes nowhere (Spark's executors)."""
    result = run_sync(acascade(client, call, texts, call.cascade, kind=kind_of(call), **where))
    reading = dataclasses.replace(call, reader=None)
    return [read_outcome(reading, outcome) for outcome in result.outcomes]


def kind_of(call: BoundCall) -> str:
    return FILTER if call.function == "ai_filter" else CLASSIFY


# -- one proxy answer ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Point:
    value: Any  # the proxy's answer (bool or label), None when unreadable or failed
    confidence: float | None  # its probability for that answer; None: ask the oracle


def _proxy_point(bound: BoundCall, reply: ScoredReply | None, error: str | None) -> _Point:
    if error is not None or reply is None:
        return _Point(None, None)
    value, problem = read_outcome(bound, (reply.value, None))
    if problem is not None or value is None:
        return _Point(None, None)
    return _Point(value, answer_confidence(reply, value))


def _p_true(point: _Point) -> float | None:
    if point.confidence is None or not isinstance(point.value, bool):
        return None
    return point.confidence if point.value else 1.0 - point.confidence


def _decide(kind: str, thresholds: dict[str, float | None], point: _Point) -> Any:
    """The proxy's answer where the thresholds trust it, else None (the oracle's row)."""
    if kind == FILTER:
        p = _p_true(point)
        high, low = thresholds["true_at_or_above"], thresholds["false_at_or_below"]
        if p is None:
            return None
        if high is not None and p >= high:
            return True
        if low is not None and p <= low:
            return False
        return None
    accept = thresholds["accept_at_or_above"]
    if point.confidence is None or accept is None or point.confidence < accept:
        return None
    return point.value


# -- learning the thresholds ------------------------------------------------------------------
def learn_filter(points: list[tuple[_Point, Any]], target_precision: float,
                 target_recall: float) -> tuple[dict[str, float | None], float | None,
                                                float | None]:
    """(thresholds, the sample's precision, its recall) for a yes/no predicate."""
    scored = [(_p_true(point), truth is True) for point, truth in points]
    positives = sum(truth for _, truth in scored)
    values = sorted({p for p, _ in scored if p is not None})
    positive_ps = sorted(p for p, truth in scored if truth and p is not None)
    allowed_misses = math.floor((1.0 - with_margin(target_recall, positives)) * positives
                                + 1e-9)
    if len(positive_ps) <= allowed_misses:  # every proxy "no" may stand
        low = values[-1] if values else None
    else:
        bound = positive_ps[allowed_misses]
        below = [v for v in values if v < bound]
        low = below[-1] if below else None
    missed = sum(1 for p, truth in scored if truth and p is not None and low is not None
                 and p <= low)
    kept = positives - missed
    negative_ps = sorted((p for p, truth in scored if not truth and p is not None
                          and (low is None or p > low)), reverse=True)
    aim = with_margin(target_precision, kept)
    allowed_false = math.floor(kept * (1.0 - aim) / aim + 1e-9)
    above = [v for v in values if low is None or v > low]
    if len(negative_ps) <= allowed_false:
        high = above[0] if above else None
    else:
        over = [v for v in above if v > negative_ps[allowed_false]]
        high = over[0] if over else None
    false_positives = sum(1 for p, truth in scored if not truth and p is not None
                          and high is not None and p >= high)
    precision = kept / (kept + false_positives) if kept + false_positives else None
    recall = kept / positives if positives else None
    return ({"true_at_or_above": high, "false_at_or_below": low}, _round(precision),
            _round(recall))


def learn_label(points: list[tuple[_Point, Any]], target: float
                ) -> tuple[dict[str, float | None], float | None, float | None]:
    """(thresholds, the sample's precision, its recall) for one label a row (both: accuracy)."""
    if not points:
        return {"accept_at_or_above": None}, None, None
    allowed = math.floor((1.0 - with_margin(target, len(points))) * len(points) + 1e-9)
    by_confidence: dict[float, int] = {}
    for point, truth in points:
        if point.confidence is not None:
            wrong = int(point.value != truth)
            by_confidence[point.confidence] = by_confidence.get(point.confidence, 0) + wrong
    accept, errors = None, 0
    for confidence in sorted(by_confidence, reverse=True):
        if errors + by_confidence[confidence] > allowed:
            break
        errors += by_confidence[confidence]
        accept = confidence
    accuracy = _round(1.0 - errors / len(points))
    return {"accept_at_or_above": accept}, accuracy, accuracy


def with_margin(target: float, rows: int) -> float:
    """What the sample must reach so that the whole call reaches ``target``: the target plus
    1.645 standard errors of a share measured on ``rows`` rows (a 95% one-sided bound, normal
    approximation). Met exactly on the sample, a target is missed on the rest about half the
    time."""
    if rows <= 0:
        return target
    return min(1.0, target + MARGIN_Z * math.sqrt(target * (1.0 - target) / rows))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- figures ------------------------------------------------------------------------------------
def _paid(calls: list[tuple[float | None, int]]) -> tuple[float | None, int]:
    """(what a model's calls paid, None where one had no price; the rows they sent)."""
    rows = sum(fresh for _, fresh in calls)
    if any(cost is None for cost, _ in calls):
        return None, rows
    return round(sum(cost for cost, _ in calls), 9), rows
