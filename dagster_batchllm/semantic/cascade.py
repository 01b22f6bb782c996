"""Model cascades (LOTUS-style): a cheap proxy answers every row, the oracle only the unsure.

For one call's rows (every distinct text of it, at once: thresholds are learned over them):

1. the **proxy** answers every row with its confidence, read from the reply's logprobs
   (:mod:`.scored`). Where the endpoint gives none, or the reply is unreadable or failed, the
   row has no confidence: it is uncertain and goes to the oracle (the documented fallback: no
   savings, but the oracle's answers);
2. a seeded random **sample** of ``Cascade.sample`` rows, at most a third of the distinct rows
   (:data:`SAMPLE_SHARE`), is also answered by the **oracle**: the rows whose SHA-256 of seed
   and text is smallest, so the same rows in any order or engine;
3. thresholds are learned on the sample (:func:`learn`) with exact (Clopper-Pearson) bounds
   (:mod:`.guarantee`), so that the **guarantee** holds: *with probability at least
   1 - delta over the sample, the call's precision and recall against the oracle's answers
   meet the targets* (``ai_classify``: its accuracy meets the larger target). ``ai_filter``:
   with ``p`` the proxy's probability of *true*, rows with ``p >= true_at_or_above`` are true,
   rows with ``p <= false_at_or_below`` false; ``false_at_or_below`` is the largest value at
   which the bound on the share of positives missed stays within 1 - ``target_recall``, then
   ``true_at_or_above`` the smallest at which the bound on the share of false positives among
   the rows called true stays within 1 - ``target_precision`` (``delta / 2`` each: a union
   bound). ``ai_classify``: rows whose label has confidence ``>= accept_at_or_above`` keep the
   proxy's label, the smallest value at which the bound on their wrong labels stays within
   1 - target of every row. Each threshold is scanned from the safe end and stops at the first
   value that fails (a fixed sequence of tests), so trying many values costs no extra error;
   the precision threshold is learned given the recall one, on the same sample;
4. the rows between the thresholds go to the oracle; sample rows take the oracle's answer.

Where the sample is too small for the targets even with a proxy never wrong, the call's logger
warns (every row is then likely to go to the oracle, the proxy and the sample paid for
nothing), and ``CascadeReport.warning`` says so too.

Every request goes through :meth:`InferenceClient.arun_call`: the pool, ledger and budgets,
so a rerun pays nothing. The :class:`CascadeReport` says what was chosen and measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Any

from ..ai_functions.calls import BoundCall, read_outcome
from ..ai_functions.cascade_options import Cascade
from ..core import InferenceStats, run_sync
from . import guarantee
from .scored import ScoredCall, ScoredReply, answer_confidence

Outcome = tuple[Any, "str | None"]  # (value, "<error_type>: <reason>" or None)
FILTER, CLASSIFY = "filter", "classify"
# The sample is paid at the oracle's price whatever the proxy does: at a third of the rows the
# best a cascade can do is about 0.33 of oracle-only plus the proxy, and a larger share spends
# more on measuring the proxy than the tighter bounds can give back.
SAMPLE_SHARE = 1 / 3
_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CascadeReport:
    """What one cascade chose and measured (``as_metadata()`` for Dagster metadata: put it in
    an asset's ``MaterializeResult(metadata=...)`` or ``context.add_output_metadata``)."""

    proxy: str
    oracle: str
    rows: int  # distinct row texts the cascade answered
    sample_size: int  # the rows the oracle sampled: the sample asked, at most a third of rows
    thresholds: dict[str, float | None]
    sample_precision: float | None  # of the thresholds' rule on the sample, against the oracle
    sample_recall: float | None
    oracle_rows: int  # rows the oracle answered: the sample and the uncertain rows
    proxy_cost_usd: float | None  # what this call paid (0 where the ledger answered)
    oracle_cost_usd: float | None
    # The oracle's cost per row this call paid, times every row: what oracle-only would cost
    oracle_only_cost_usd: float | None
    delta: float | None = None  # the guarantee's chance of failing
    # The call's precision and recall (classify: accuracy) are at least these, with
    # probability >= 1 - delta; None where the sample held none of the kind to measure
    precision_bound: float | None = None
    recall_bound: float | None = None
    sample_requested: int | None = None  # Cascade.sample, before the cap on the rows
    warning: str | None = None  # why the cascade could not save (see too_few_rows)

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
    warning = too_few_rows(kind, len(distinct), cascade)
    if warning:
        (logger or _LOG).warning(warning)
    proxy_answers = await ask(cascade.proxy, everyone, scored=True)
    proxied = [_proxy_point(strict, reply, error) for reply, error in proxy_answers]
    sample = sample_indices(distinct, sample_size(len(distinct), cascade.sample), cascade.seed)
    oracle: dict[int, Outcome] = dict(zip(sample, [read_outcome(strict, raw) for raw in
                                                   await ask(cascade.oracle, sample, False)],
                                          strict=True))
    points = [(proxied[i], oracle[i][0]) for i in sample if oracle[i][1] is None]
    learned = learn(kind, points, proxied, cascade)
    thresholds = learned.thresholds
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
        sample_size=len(sample), thresholds=thresholds,
        sample_precision=learned.sample_precision, sample_recall=learned.sample_recall,
        oracle_rows=len(oracle), proxy_cost_usd=proxy_cost, oracle_cost_usd=oracle_cost,
        oracle_only_cost_usd=oracle_only, delta=cascade.delta,
        precision_bound=learned.precision_bound, recall_bound=learned.recall_bound,
        sample_requested=cascade.sample, warning=warning)
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
@dataclasses.dataclass(frozen=True)
class Learned:
    """The thresholds learned from a sample, and what they are worth."""

    thresholds: dict[str, float | None]
    sample_precision: float | None  # of the thresholds' rule on the sample, against the oracle
    sample_recall: float | None
    # Lower bounds on the call's precision and recall (classify: both its accuracy) that hold
    # with probability >= 1 - delta; None where the sample had none of the kind to measure
    precision_bound: float | None
    recall_bound: float | None


def sample_size(rows: int, requested: int) -> int:
    """How many of ``rows`` distinct rows the oracle samples: ``requested``, at most a share
    ``SAMPLE_SHARE`` of them (see there)."""
    return max(0, min(requested, math.floor(rows * SAMPLE_SHARE)))


def too_few_rows(kind: str, rows: int, cascade: Cascade) -> str | None:
    """Why the proxy cannot decide a single row (so every row goes to the oracle, and the proxy
    and the sample are paid for nothing), where the sample is too small for the targets even
    with a proxy that is never wrong; None where it may save."""
    size = sample_size(rows, cascade.sample)
    if kind == FILTER:
        target, alpha, of = max(cascade.target_precision, cascade.target_recall), \
            cascade.delta / 2, "rows of each answer"
    else:
        target = max(cascade.target_precision, cascade.target_recall)
        alpha, of = cascade.delta, "rows"
    least = guarantee.least_sample(1.0 - target, alpha)
    if least is not None and size >= least:
        return None
    needs = ("a target of 1.0 allows no mistake, so no sample can vouch for the proxy"
             if least is None else f"the targets need at least {least} sampled {of} before "
             f"the proxy may decide any row (delta {cascade.delta})")
    return (f"cascade: {rows} distinct rows allow a sample of {size} (at most "
            f"{SAMPLE_SHARE:.0%} of the rows, asked {cascade.sample}); {needs}. Every row is "
            "likely to go to the oracle: pass more rows at once, lower the targets or raise "
            "delta, or call the oracle alone (model=).")


def learn(kind: str, points: list[tuple[_Point, Any]], population: Sequence[_Point],
          cascade: Cascade) -> Learned:
    """The thresholds for ``kind`` from the sample's ``points`` (the proxy's answer, the
    oracle's) over the ``population`` (the proxy's answer on every row of the call, the sample
    among them): the one home of the rule, used by :func:`acascade` and its evaluations."""
    if kind == FILTER:
        return learn_filter(points, population, cascade.target_precision,
                            cascade.target_recall, cascade.delta)
    return learn_label(points, population,
                       max(cascade.target_precision, cascade.target_recall), cascade.delta)


def learn_filter(points: list[tuple[_Point, Any]], population: Sequence[_Point],
                 target_precision: float, target_recall: float, delta: float) -> Learned:
    """Thresholds for a yes/no predicate whose precision and recall meet the targets with
    probability >= 1 - ``delta`` (``delta / 2`` for each bound).

    Recall: the sample's positives are a uniform sample of the call's, so the share of them
    the proxy misses (``p <= false_at_or_below``) bounds the call's miss rate; the threshold
    rises through the proxy's values while that bound stays <= 1 - target (and stops at the
    first value where it does not: a fixed sequence of tests, so the scan costs no extra
    error). Precision: among the sample rows the result calls true (positives not missed, and
    negatives at ``p >= true_at_or_above``), the share that are negatives bounds the call's;
    the threshold falls while that bound stays <= 1 - target. The rows the oracle answers add
    only true positives, so both bounds are conservative."""
    alpha = delta / 2
    scored = [(_p_true(point), truth is True) for point, truth in points]
    values = sorted({p for p in map(_p_true, population) if p is not None})
    positives = [p for p, truth in scored if truth]
    positive_ps = sorted(p for p in positives if p is not None)
    allowed_misses = guarantee.most_allowed(len(positives), 1.0 - target_recall, alpha)
    low: float | None = None
    if allowed_misses >= len(positive_ps):  # every proxy "no" may stand
        low = values[-1] if values and allowed_misses >= 0 else None
    elif allowed_misses >= 0:
        below = [v for v in values if v < positive_ps[allowed_misses]]
        low = below[-1] if below else None
    missed = sum(1 for p in positive_ps if low is not None and p <= low)
    kept = len(positives) - missed
    negative_ps = sorted((p for p, truth in scored if not truth and p is not None
                          and (low is None or p > low)), reverse=True)
    allowed_false = -1
    while allowed_false < len(negative_ps) and guarantee.share_upper_bound(
            allowed_false + 1, kept + allowed_false + 1, alpha) <= 1.0 - target_precision:
        allowed_false += 1
    above = [v for v in values if low is None or v > low]
    high: float | None = None
    if allowed_false >= len(negative_ps):
        high = above[0] if above else None
    elif allowed_false >= 0:
        over = [v for v in above if v > negative_ps[allowed_false]]
        high = over[0] if over else None
    false_positives = sum(1 for p in negative_ps if high is not None and p >= high)
    precision = kept / (kept + false_positives) if kept + false_positives else None
    recall = kept / len(positives) if positives else None
    return Learned(
        {"true_at_or_above": high, "false_at_or_below": low}, _round(precision),
        _round(recall),
        _round(1.0 - guarantee.share_upper_bound(false_positives, kept + false_positives,
                                                 alpha)) if kept + false_positives else None,
        _round(1.0 - guarantee.share_upper_bound(missed, len(positives), alpha))
        if positives else None)


def learn_label(points: list[tuple[_Point, Any]], population: Sequence[_Point], target: float,
                delta: float) -> Learned:
    """A threshold on the label's confidence whose accuracy (micro precision = micro recall,
    one label a row) meets ``target`` with probability >= 1 - ``delta``.

    The sample rows at confidence ``>= t`` are a uniform sample of the call's ``A(t)`` rows
    there, so their share of wrong labels bounds the call's; ``A(t)`` times that bound is at
    most ``(1 - target)`` of every row while ``t`` falls through the proxy's values (stopping at
    the first that fails)."""
    rows = len(population)
    budget = (1.0 - target) * rows  # wrong labels the call may keep
    confidences = sorted((p.confidence for p in population if p.confidence is not None),
                         reverse=True)
    wrong_at: dict[float, list[int]] = {}  # confidence -> [wrong, seen] in the sample
    for point, truth in points:
        if point.confidence is not None:
            counts = wrong_at.setdefault(point.confidence, [0, 0])
            counts[0] += int(point.value != truth)
            counts[1] += 1
    sampled = sorted(wrong_at, reverse=True)
    accept, bound, errors, seen, at, share = None, None, 0, 0, 0, 1.0
    for index, confidence in enumerate(confidences):
        if index + 1 < len(confidences) and confidences[index + 1] == confidence:
            continue  # a threshold takes every row at its value: A(t) counts them all
        changed = False
        while at < len(sampled) and sampled[at] >= confidence:
            errors, seen, at = errors + wrong_at[sampled[at]][0], seen + wrong_at[
                sampled[at]][1], at + 1
            changed = True
        if changed:
            share = guarantee.share_upper_bound(errors, seen, delta)
        if (index + 1) * share > budget + 1e-9:
            break
        accept, bound = confidence, 1.0 - (index + 1) * share / rows
    kept_errors = sum(w for c, (w, _) in wrong_at.items() if accept is not None and c >= accept)
    accuracy = _round(1.0 - kept_errors / len(points)) if points else None
    bound = _round(bound) if accept is not None else 1.0  # no row decided: the oracle's own
    return Learned({"accept_at_or_above": accept}, accuracy, accuracy, bound, bound)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- figures ------------------------------------------------------------------------------------
def _paid(calls: list[tuple[float | None, int]]) -> tuple[float | None, int]:
    """(what a model's calls paid, None where one had no price; the rows they sent)."""
    rows = sum(fresh for _, fresh in calls)
    if any(cost is None for cost, _ in calls):
        return None, rows
    return round(sum(cost for cost, _ in calls), 9), rows
