"""A model cascade against the oracle alone: cost, and precision and recall against the oracle.

From the repository root::

    .venv/bin/python -m bench.cascade                   # 10,000 rows (about a minute)
    .venv/bin/python -m bench.cascade --rows 3000

A labelled set of support tickets (generated from a fixed seed: a few sentences each from a
pool, some of which ask for a refund) and one simulated endpoint (its own process) serving
two models through :class:`~dagster_batchllm.simulator.labelled.LabelledResponder`:
``llama-70b`` (the oracle: the truth, "asks for a refund or money back") and ``llama-8b`` (the
proxy: right on 85% of the texts, with logprobs that say how sure it is), the proxy at 1/20th
of the oracle's price (``Endpoint(prices=...)``). For ``ai_filter`` ("The customer asks for
a refund") and ``ai_classify`` (refund / complaint / question), each on a fresh ledger:

* **oracle only**: every row to ``llama-70b`` (``llm.filter(model=...)``, ``llm.classify``);
* **cascade**, twice on the same rows, each on a fresh ledger: ``Cascade(proxy="llama-8b",
  oracle="llama-70b", target_precision=0.9, target_recall=0.9, sample=500, delta=0.05)`` with
  the thresholds learned the **old** way (before issue 44: the sample's own figures made to
  reach each target plus 1.645 standard errors, a normal approximation with no stated chance
  of failing; :func:`old_learn`, kept here only to compare) and the **new** (the library's:
  exact bounds that hold with probability >= 1 - delta); each once more, to show that a rerun
  sends nothing.

It prints, side by side: what each paid (the servers' ``usage`` at the prices), the ratio
(target <= 0.5x), the cascade's precision and recall against the oracle's labels over every
row (target >= 0.9 each; for classification both are the accuracy), the share of rows the
oracle answered, the thresholds, rows/s, and the rerun's requests (counted at the server).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import tempfile
import time

import pandas as pd

from dagster_batchllm import BatchInferenceResource, Cascade, Endpoint, Price
from dagster_batchllm.semantic import cascade as cascade_module
from dagster_batchllm.semantic.cascade import FILTER, Learned, _p_true
from dagster_batchllm.simulator.labelled import KeywordTruth, LabelledResponder
from dagster_batchllm.testing import SimulatedEndpoint

ORACLE, PROXY = "llama-70b", "llama-8b"
ORACLE_PRICE = Price(input_per_mtok=2.0, output_per_mtok=6.0)
PROXY_PRICE = Price(input_per_mtok=0.1, output_per_mtok=0.3)  # 1/20th
PREDICATE = "The customer asks for a refund or their money back."
LABELS = ["refund", "complaint", "question"]
RESPONDER = "bench.cascade:BenchModels"
_SENTENCES = {
    "refund": ["I want a refund for this order.", "Please give me my money back.",
               "Can I get a refund on the lamp?"],
    "complaint": ["The chair arrived broken.", "Your courier was rude to me.",
                  "The screen stopped working after a day."],
    "question": ["When does the Fairview store close?", "Do you ship to Canada?",
                 "How do I change my password?"],
}
_FILLER = ["Order number {n}.", "I called twice already.", "Thanks for your help.",
           "This is my second message.", "My name is Sam.", "It was a gift."]


class BenchModels(LabelledResponder):
    """The simulated models (a class, so the endpoint's own process can build it)."""

    def __init__(self):
        truth = KeywordTruth({"refund": "refund", "money back": "refund", "broken": "complaint",
                              "rude": "complaint", "stopped working": "complaint"},
                             default="question")
        super().__init__(truth, oracle_models=[ORACLE], proxy_models=[PROXY],
                         proxy_accuracy=0.85)


# -- the method before issue 44, kept only to compare against ----------------------------------
MARGIN_Z = 1.645


def with_margin(target: float, rows: int) -> float:
    """The target plus 1.645 standard errors of a share measured on ``rows`` rows (a normal
    approximation): what the old rule made the sample reach."""
    if rows <= 0:
        return target
    return min(1.0, target + MARGIN_Z * math.sqrt(target * (1.0 - target) / rows))


def old_learn(kind: str, points: list, population: list, cascade: Cascade) -> Learned:
    """The thresholds as learned before issue 44: the sample's own precision and recall made to
    reach each target plus a normal margin (no ``delta``; the population's values unused)."""
    if kind != FILTER:
        return _old_learn_label(points, max(cascade.target_precision, cascade.target_recall))
    scored = [(_p_true(point), truth is True) for point, truth in points]
    positives = sum(truth for _, truth in scored)
    values = sorted({p for p, _ in scored if p is not None})
    positive_ps = sorted(p for p, truth in scored if truth and p is not None)
    allowed_misses = math.floor(
        (1.0 - with_margin(cascade.target_recall, positives)) * positives + 1e-9)
    if len(positive_ps) <= allowed_misses:
        low = values[-1] if values else None
    else:
        below = [v for v in values if v < positive_ps[allowed_misses]]
        low = below[-1] if below else None
    missed = sum(1 for p, truth in scored if truth and p is not None and low is not None
                 and p <= low)
    kept = positives - missed
    negative_ps = sorted((p for p, truth in scored if not truth and p is not None
                          and (low is None or p > low)), reverse=True)
    aim = with_margin(cascade.target_precision, kept)
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
    return Learned({"true_at_or_above": high, "false_at_or_below": low}, precision, recall,
                   None, None)


def _old_learn_label(points: list, target: float) -> Learned:
    if not points:
        return Learned({"accept_at_or_above": None}, None, None, None, None)
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
    accuracy = 1.0 - errors / len(points)
    return Learned({"accept_at_or_above": accept}, accuracy, accuracy, None, None)


def tickets(rows: int, seed: int = 7) -> pd.DataFrame:
    rng = random.Random(seed)
    bodies = []
    for i in range(rows):
        kind = rng.choice(LABELS)
        parts = [rng.choice(_SENTENCES[kind])]
        parts += [rng.choice(_FILLER).format(n=rng.randint(1000, 99999)) for _ in range(2)]
        rng.shuffle(parts)
        bodies.append(f"Ticket {i}: " + " ".join(parts))
    return pd.DataFrame({"ticket_id": range(rows), "body": bodies})


def resource(sim: SimulatedEndpoint, ledger_dir: str, name: str) -> BatchInferenceResource:
    return BatchInferenceResource(
        endpoints=[Endpoint(name="gpu", base_url=sim.base_url, models=[ORACLE, PROXY],
                            max_concurrency=128,
                            prices={ORACLE: ORACLE_PRICE, PROXY: PROXY_PRICE})],
        store_url=f"sqlite:///{ledger_dir}/{name}.db")


@contextlib.contextmanager
def learning(method: str):
    """The cascade's threshold learning for ``method``: "new" (the library's) or "old" (the
    rule before issue 44, :func:`old_learn`, put in its place for the one call)."""
    if method == "new":
        yield
        return
    saved = cascade_module.learn
    cascade_module.learn = old_learn
    try:
        yield
    finally:
        cascade_module.learn = saved


def run(kind: str, df: pd.DataFrame, sim: SimulatedEndpoint, ledger_dir: str) -> list[dict]:
    cascade = Cascade(proxy=PROXY, oracle=ORACLE, target_precision=0.9, target_recall=0.9,
                      sample=500, delta=0.05)

    def call(llm: BatchInferenceResource, **how):
        if kind == "filter":
            return llm.filter(df, predicate=PREDICATE, columns=["body"], **how)
        return llm.classify(df, labels=LABELS, column="body", **how)

    oracle_llm = resource(sim, ledger_dir, f"{kind}-oracle")
    started = time.perf_counter()
    oracle = call(oracle_llm, model=ORACLE)
    oracle_s = time.perf_counter() - started
    oracle_llm.close()
    truth = oracle.table[oracle.output_column]
    rows = []
    for method in ("old", "new"):  # the same rows, each on a fresh ledger
        cascade_llm = resource(sim, ledger_dir, f"{kind}-cascade-{method}")
        with learning(method):
            started = time.perf_counter()
            cascaded = call(cascade_llm, cascade=cascade)
            cascade_s = time.perf_counter() - started
            sim.reset_stats()
            call(cascade_llm, cascade=cascade)
            rerun_requests = sim.stats(log=False)["requests"]
        cascade_llm.close()
        answer = cascaded.table[cascaded.output_column]
        if kind == "filter":
            true_positive = int((answer.eq(True) & truth.eq(True)).sum())
            precision = true_positive / max(int(answer.eq(True).sum()), 1)
            recall = true_positive / max(int(truth.eq(True).sum()), 1)
        else:
            precision = recall = float((answer == truth).mean())
        report = cascaded.cascade
        rows.append({
            "kind": kind, "method": method, "rows": len(df), "oracle_usd": oracle.stats.cost_usd,
            "cascade_usd": report.cost_usd, "estimate_usd": report.oracle_only_cost_usd,
            "precision": precision, "recall": recall, "oracle_share": report.oracle_share,
            "thresholds": report.thresholds, "sample_precision": report.sample_precision,
            "sample_recall": report.sample_recall, "bounds": (report.precision_bound,
                                                              report.recall_bound),
            "oracle_rows_s": len(df) / oracle_s, "cascade_rows_s": len(df) / cascade_s,
            "rerun_requests": rerun_requests})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    args = parser.parse_args()
    df = tickets(args.rows)
    with tempfile.TemporaryDirectory() as ledger_dir, SimulatedEndpoint(
            models=None, responder=RESPONDER, process=True, max_concurrency=256) as sim:
        results = [r for kind in ("filter", "classify") for r in run(kind, df, sim, ledger_dir)]
    print(f"{args.rows:,} labelled rows; proxy {PROXY} (85% right, 1/20th the price), oracle "
          f"{ORACLE}; Cascade(target_precision=0.9, target_recall=0.9, sample=500, "
          "delta=0.05); old: a uniform sample, the targets plus 1.645 standard errors (no "
          "delta); new: exact bounds at delta 0.05, the sample at most a third of the rows")
    header = ("job", "method", "oracle-only $", "cascade $", "ratio", "precision", "recall",
              "to oracle", "oracle rows/s", "cascade rows/s", "rerun requests")
    print(" | ".join(header))
    for r in results:
        print(" | ".join([
            r["kind"], r["method"], f"{r['oracle_usd']:.4f}", f"{r['cascade_usd']:.4f}",
            f"{r['cascade_usd'] / r['oracle_usd']:.3f}x", f"{r['precision']:.3f}",
            f"{r['recall']:.3f}", f"{r['oracle_share']:.1%}", f"{r['oracle_rows_s']:,.0f}",
            f"{r['cascade_rows_s']:,.0f}", str(r["rerun_requests"])]))
    for r in results:
        print(f"{r['kind']} ({r['method']}): thresholds {r['thresholds']}; on the sample "
              f"precision {r['sample_precision']}, recall {r['sample_recall']}; guaranteed "
              f"(precision, recall) >= {r['bounds']}; oracle-only estimated from the "
              f"cascade's oracle rows ${r['estimate_usd']:.4f}")


if __name__ == "__main__":
    main()
