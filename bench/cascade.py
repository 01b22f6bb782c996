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
* **cascade**: ``Cascade(proxy="llama-8b", oracle="llama-70b", target_precision=0.9,
  target_recall=0.9, sample=500)``; then once more, to show that a rerun sends nothing.

It prints, side by side: what each paid (the servers' ``usage`` at the prices), the ratio
(target <= 0.5x), the cascade's precision and recall against the oracle's labels over every
row (target >= 0.9 each; for classification both are the accuracy), the share of rows the
oracle answered, the thresholds, rows/s, and the rerun's requests (counted at the server).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import pandas as pd

from dagster_batchllm import BatchInferenceResource, Cascade, Endpoint, Price
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


def run(kind: str, df: pd.DataFrame, sim: SimulatedEndpoint, ledger_dir: str) -> dict:
    cascade = Cascade(proxy=PROXY, oracle=ORACLE, target_precision=0.9, target_recall=0.9,
                      sample=500)

    def call(llm: BatchInferenceResource, **how):
        if kind == "filter":
            return llm.filter(df, predicate=PREDICATE, columns=["body"], **how)
        return llm.classify(df, labels=LABELS, column="body", **how)

    oracle_llm = resource(sim, ledger_dir, f"{kind}-oracle")
    started = time.perf_counter()
    oracle = call(oracle_llm, model=ORACLE)
    oracle_s = time.perf_counter() - started
    cascade_llm = resource(sim, ledger_dir, f"{kind}-cascade")
    started = time.perf_counter()
    cascaded = call(cascade_llm, cascade=cascade)
    cascade_s = time.perf_counter() - started
    sim.reset_stats()
    call(cascade_llm, cascade=cascade)
    rerun_requests = sim.stats(log=False)["requests"]
    oracle_llm.close()
    cascade_llm.close()
    truth = oracle.table[oracle.output_column]
    answer = cascaded.table[cascaded.output_column]
    if kind == "filter":
        true_positive = int((answer.eq(True) & truth.eq(True)).sum())
        precision = true_positive / max(int(answer.eq(True).sum()), 1)
        recall = true_positive / max(int(truth.eq(True).sum()), 1)
    else:
        precision = recall = float((answer == truth).mean())
    report = cascaded.cascade
    return {"kind": kind, "rows": len(df), "oracle_usd": oracle.stats.cost_usd,
            "cascade_usd": report.cost_usd, "estimate_usd": report.oracle_only_cost_usd,
            "precision": precision, "recall": recall, "oracle_share": report.oracle_share,
            "thresholds": report.thresholds, "sample_precision": report.sample_precision,
            "sample_recall": report.sample_recall, "oracle_rows_s": len(df) / oracle_s,
            "cascade_rows_s": len(df) / cascade_s, "rerun_requests": rerun_requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    args = parser.parse_args()
    df = tickets(args.rows)
    with tempfile.TemporaryDirectory() as ledger_dir, SimulatedEndpoint(
            models=None, responder=RESPONDER, process=True, max_concurrency=256) as sim:
        results = [run(kind, df, sim, ledger_dir) for kind in ("filter", "classify")]
    print(f"{args.rows:,} labelled rows; proxy {PROXY} (85% right, 1/20th the price), oracle "
          f"{ORACLE}; Cascade(target_precision=0.9, target_recall=0.9, sample=500)")
    header = ("job", "oracle-only $", "cascade $", "ratio", "precision", "recall",
              "to oracle", "oracle rows/s", "cascade rows/s", "rerun requests")
    print(" | ".join(header))
    for r in results:
        print(" | ".join([
            r["kind"], f"{r['oracle_usd']:.4f}", f"{r['cascade_usd']:.4f}",
            f"{r['cascade_usd'] / r['oracle_usd']:.3f}x", f"{r['precision']:.3f}",
            f"{r['recall']:.3f}", f"{r['oracle_share']:.1%}", f"{r['oracle_rows_s']:,.0f}",
            f"{r['cascade_rows_s']:,.0f}", str(r["rerun_requests"])]))
    for r in results:
        print(f"{r['kind']}: thresholds {r['thresholds']}; on the sample precision "
              f"{r['sample_precision']}, recall {r['sample_recall']}; oracle-only estimated "
              f"from the cascade's oracle rows ${r['estimate_usd']:.4f}")


if __name__ == "__main__":
    main()
