"""Cascades against the simulated proxy and oracle: targets met, the ledger, the fallback."""

from __future__ import annotations

import pytest

from dagster_batchllm import Cascade, InferenceConfigError
from dagster_batchllm.semantic.cascade import _Point, learn_filter, learn_label, sample_indices
from dagster_batchllm.semantic.filter import classify_rows, filter_rows
from dagster_batchllm.testing import SimulatedEndpoint
from tests.semantic.cascade_helpers import LABELS, ORACLE, PROXY, TRUTH, tickets

PREDICATE = "The customer asks for a refund."
CASCADE = Cascade(proxy=PROXY, oracle=ORACLE, sample=300)


def _precision_recall(answer, truth):
    hits = int((answer.eq(True) & truth.eq(True)).sum())
    return hits / max(int(answer.eq(True).sum()), 1), hits / max(int(truth.eq(True).sum()), 1)


@pytest.mark.slow
def test_a_filter_cascade_meets_its_targets_and_a_rerun_sends_nothing(labelled_sim,
                                                                      make_client):
    df = tickets(3000)
    client = make_client(labelled_sim)
    kept = filter_rows(client, df, predicate=PREDICATE, columns=["body"], cascade=CASCADE)
    truth = df["body"].map(lambda t: TRUTH(t) == "refund")
    precision, recall = _precision_recall(kept.table["passes"], truth)
    report = kept.cascade
    assert precision >= 0.9 and recall >= 0.9, (precision, recall, report)
    assert report.sample_size == 300 and report.rows == 3000
    assert report.sample_precision >= 0.9 and report.sample_recall >= 0.9
    assert 0.0 < report.oracle_share < 0.6  # most rows stayed with the proxy
    low, high = report.thresholds["false_at_or_below"], report.thresholds["true_at_or_above"]
    assert low < high
    # the server saw every row once from the proxy and only the oracle's share from the oracle
    assert labelled_sim.stats()["requests"] == 3000 + report.oracle_rows
    assert set(kept.df.index) == set(kept.table.index[kept.table["passes"].eq(True)])
    labelled_sim.reset_stats()
    again = filter_rows(client, df, predicate=PREDICATE, columns=["body"], cascade=CASCADE)
    assert labelled_sim.stats()["requests"] == 0
    assert again.cascade.thresholds == report.thresholds
    assert again.table["passes"].tolist() == kept.table["passes"].tolist()


@pytest.mark.slow
def test_a_classify_cascade_meets_its_target(labelled_sim, make_client):
    df = tickets(2000, seed=5)
    result = classify_rows(make_client(labelled_sim), df, labels=LABELS, column="body",
                           cascade=CASCADE)
    accuracy = (result.table["label"] == df["body"].map(TRUTH)).mean()
    assert accuracy >= 0.9, (accuracy, result.cascade)
    assert result.cascade.sample_precision == result.cascade.sample_recall >= 0.9
    assert result.cascade.oracle_share < 0.6


def test_without_logprobs_every_row_goes_to_the_oracle(make_client):
    # EchoResponder gives no logprobs: the documented fallback asks the oracle for every row
    with SimulatedEndpoint(models=(ORACLE, PROXY)) as sim:
        df = tickets(40)
        result = filter_rows(make_client(sim), df, predicate=PREDICATE, columns=["body"],
                             cascade=Cascade(proxy=PROXY, oracle=ORACLE, sample=10))
        assert result.cascade.oracle_rows == 40 and result.cascade.oracle_share == 1.0
        assert sim.stats()["requests"] == 80


def test_the_sample_is_the_same_rows_in_any_order():
    texts = [f"row {i}" for i in range(500)]
    chosen = {texts[i] for i in sample_indices(texts, 50, seed=1)}
    assert {texts[::-1][i] for i in sample_indices(texts[::-1], 50, seed=1)} == chosen
    assert {texts[i] for i in sample_indices(texts, 50, seed=2)} != chosen


def test_thresholds_are_the_widest_that_meet_the_targets(monkeypatch):
    from dagster_batchllm.semantic import cascade

    assert cascade.with_margin(0.9, 100) == pytest.approx(0.9 + 1.645 * 0.03)
    assert cascade.with_margin(0.9, 10) == 1.0  # too few rows to trust: no row is missed
    monkeypatch.setattr(cascade, "MARGIN_Z", 0.0)  # the rule itself, targets met exactly
    # p(true) and the oracle's answer: 10 positives, 10 negatives
    points = [(_Point(p >= 0.5, max(p, 1 - p)), truth) for p, truth in
              [(0.95, True)] * 8 + [(0.6, True), (0.3, True)]
              + [(0.05, False)] * 8 + [(0.55, False), (0.7, False)]]
    thresholds, precision, recall = learn_filter(points, 0.9, 0.9)
    # one positive may be missed (p 0.3): every row below the next positive (0.6) is false
    assert thresholds["false_at_or_below"] == pytest.approx(0.55)
    assert recall == 0.9
    # with 9 kept positives one false positive is allowed: 0.7 may be true, 0.6 then too
    assert thresholds["true_at_or_above"] == pytest.approx(0.6)
    assert precision == 0.9
    label_points = [(_Point("a", c), "a" if right else "b") for c, right in
                    [(0.99, True)] * 9 + [(0.8, False)] + [(0.7, False)] * 5]
    thresholds, accuracy, _ = learn_label(label_points, 0.9)
    assert thresholds["accept_at_or_above"] == 0.8  # one error of 15 allowed
    assert accuracy == pytest.approx(1 - 1 / 15, abs=1e-6)


def test_mistakes_in_a_cascade_raise_before_anything_is_sent(labelled_sim, make_client):
    client = make_client(labelled_sim)
    df = tickets(5)
    with pytest.raises(InferenceConfigError, match="proxy and oracle are both"):
        Cascade(proxy=ORACLE, oracle=ORACLE)
    with pytest.raises(InferenceConfigError, match="target_recall"):
        Cascade(proxy=PROXY, oracle=ORACLE, target_recall=1.5)
    with pytest.raises(InferenceConfigError, match="'gpt-9' is not served"):
        filter_rows(client, df, predicate=PREDICATE, columns=["body"],
                    cascade=Cascade(proxy="gpt-9", oracle=ORACLE))
    with pytest.raises(InferenceConfigError, match="model= or cascade=, not both"):
        filter_rows(client, df, predicate=PREDICATE, columns=["body"], model=ORACLE,
                    cascade=CASCADE)
    assert labelled_sim.stats()["requests"] == 0


def test_the_confidence_is_read_past_a_stop_token_the_server_lists():
    """vLLM's logprobs end with the stop token it sampled (Gemma's ``<eos>``), which the reply's
    text leaves out: the answer's probability is still read; tokens that spell another text
    still give none."""
    from dagster_batchllm.semantic.scored import ScoredReply, answer_confidence

    content = '{"answer":false}'
    tokens = [["{", -0.05], ['"', 0.0], ["answer", -0.9], ['":', -0.05], ["false", -0.7],
              ["}", 0.0], ["<eos>", 0.0]]
    confidence = answer_confidence(ScoredReply({"answer": False}, tokens, content), False)
    assert confidence == pytest.approx(2.718281828 ** -0.7)
    other = [["{", 0.0], ["x", 0.0]]
    assert answer_confidence(ScoredReply({"answer": False}, other, content), False) is None
