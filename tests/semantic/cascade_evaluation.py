"""The cascade's threshold learning, evaluated in-process on the labelled simulator's proxy.

:class:`~dagster_batchllm.simulator.labelled.LabelledResponder` decides, for each row text,
whether the proxy is right (``proxy_is_right``) and how sure it says it is (``confidence``):
that IS the simulated proxy, here without the HTTP around it. Each run generates tickets
(cascade_helpers), asks the proxy's answer on every row and the truth (the oracle's answer) on
the sample, learns the thresholds with the same :func:`~dagster_batchllm.semantic.cascade.learn`
that ``acascade`` runs, and measures the call's precision and recall against the truth and its
cost: the proxy on every row plus the oracle on the sample and the uncertain rows, at prices
20:1, as a share of asking the oracle alone.

The **floor** is the cheapest a cascade could be: the thresholds picked knowing every label
(the fewest rows between them that still meet both targets), with no sample.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import numpy as np

from dagster_batchllm import Cascade
from dagster_batchllm.semantic.cascade import (
    FILTER,
    _decide,
    _p_true,
    _Point,
    learn,
    sample_indices,
    sample_size,
)
from dagster_batchllm.simulator.labelled import LabelledResponder
from tests.semantic.cascade_helpers import ORACLE, PROXY, TRUTH, tickets

PROXY_PRICE = 1 / 20  # of the oracle's, a row each
CASCADE = Cascade(proxy=PROXY, oracle=ORACLE, target_precision=0.9, target_recall=0.9,
                  sample=500, delta=0.05)


@dataclasses.dataclass(frozen=True)
class Run:
    precision: float
    recall: float
    cost: float  # of oracle-only
    floor: float  # the known-labels floor's cost, of oracle-only (proxy included, no sample)
    sample_share: float

    def met(self, cascade: Cascade) -> bool:
        return (self.precision >= cascade.target_precision
                and self.recall >= cascade.target_recall)


@dataclasses.dataclass(frozen=True)
class Figures:
    profile: str
    runs: list[Run]
    cascade: Cascade

    @property
    def met(self) -> int:
        return sum(run.met(self.cascade) for run in self.runs)

    @property
    def mean_cost(self) -> float:
        return statistics.fmean(run.cost for run in self.runs)

    @property
    def mean_floor(self) -> float:
        return statistics.fmean(run.floor for run in self.runs)

    @property
    def mean_floor_plus_sample(self) -> float:
        return statistics.fmean(run.floor + run.sample_share for run in self.runs)

    def line(self) -> str:
        low = min(min(run.precision, run.recall) for run in self.runs)
        return (f"{self.profile}: met {self.met}/{len(self.runs)}, mean cost "
                f"{self.mean_cost:.3f} of oracle-only; floor {self.mean_floor:.3f}, floor + "
                f"sample {self.mean_floor_plus_sample:.3f}; worst precision/recall {low:.3f}")


Learner = Callable[[str, list, list, Cascade], object]


def one_run(profile: str, seed: int, rows: int, cascade: Cascade,
            learner: Learner = learn) -> Run:
    texts = tickets(rows, seed=seed)["body"].tolist()
    truth = [TRUTH(text) == "refund" for text in texts]
    responder = LabelledResponder(TRUTH, oracle_models=[ORACLE], proxy_models=[PROXY],
                                  profile=profile, seed=seed)
    proxied = [_Point(answer != (not responder.proxy_is_right(text)),
                      responder.confidence(PROXY, text))
               for text, answer in zip(texts, truth, strict=True)]
    cascade = dataclasses.replace(cascade, seed=seed)
    sample = set(sample_indices(texts, sample_size(rows, cascade.sample), cascade.seed))
    learned = learner(FILTER, [(proxied[i], truth[i]) for i in sorted(sample)], proxied,
                      cascade)
    answers, oracle_rows = [], 0
    for i, point in enumerate(proxied):
        decided = None if i in sample else _decide(FILTER, learned.thresholds, point)
        oracle_rows += decided is None
        answers.append(truth[i] if decided is None else decided)
    hits = sum(a and t for a, t in zip(answers, truth, strict=True))
    return Run(precision=hits / max(sum(answers), 1), recall=hits / max(sum(truth), 1),
               cost=PROXY_PRICE + oracle_rows / rows,
               floor=PROXY_PRICE + known_labels_floor(proxied, truth, cascade) / rows,
               sample_share=len(sample) / rows)


def known_labels_floor(proxied: list[_Point], truth: list[bool], cascade: Cascade) -> int:
    """The fewest rows the oracle must answer when the thresholds are picked knowing every
    label: over every ``false_at_or_below`` that keeps recall, the smallest
    ``true_at_or_above`` that keeps precision, and the pair with the fewest rows between."""
    p = np.array([_p_true(point) for point in proxied], dtype=float)
    y = np.array(truth, dtype=bool)
    values, where = np.unique(p, return_inverse=True)
    positives = np.bincount(where, weights=y, minlength=len(values))
    negatives = np.bincount(where, weights=~y, minlength=len(values))
    counts = positives + negatives
    total = positives.sum()
    # index i: rows at values[0..i] are false (i = -1: none); j: rows at values[j..] true
    missed = np.concatenate([[0.0], np.cumsum(positives)])  # missed[i + 1]
    false_from = np.concatenate([np.cumsum(negatives[::-1])[::-1], [0.0]])  # false_from[j]
    rows_before = np.concatenate([[0.0], np.cumsum(counts)])
    best = len(proxied)
    for i in range(-1, len(values)):
        kept = total - missed[i + 1]
        if kept < cascade.target_recall * total - 1e-9:
            break
        allowed = kept * (1 - cascade.target_precision) / cascade.target_precision + 1e-9
        # the smallest j > i with false_from[j] <= allowed (false_from falls as j rises)
        j = max(i + 1, int(np.searchsorted(-false_from, -allowed, side="left")))
        best = min(best, int(rows_before[j] - rows_before[i + 1]))
    return best


def evaluate(profile: str, runs: int = 100, rows: int = 4000, cascade: Cascade = CASCADE,
             learner: Learner = learn) -> Figures:
    return Figures(profile, [one_run(profile, seed, rows, cascade, learner)
                             for seed in range(runs)], cascade)
