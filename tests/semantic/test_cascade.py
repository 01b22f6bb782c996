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
    assert report.delta == 0.05 and report.warning is None
    assert 0.0 < report.recall_bound <= report.sample_recall
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
        # 10 of 40 rows is too few for targets 0.9 to vouch for any proxy answer: it says so
        assert "every row is likely to go to the oracle" in result.cascade.warning.lower()


def test_the_sample_is_the_same_rows_in_any_order():
    texts = [f"row {i}" for i in range(500)]
    chosen = {texts[i] for i in sample_indices(texts, 50, seed=1)}
    assert {texts[::-1][i] for i in sample_indices(texts[::-1], 50, seed=1)} == chosen
    assert {texts[i] for i in sample_indices(texts, 50, seed=2)} != chosen


def test_thresholds_are_the_widest_the_exact_bounds_allow():
    from dagster_batchllm.semantic.guarantee import most_allowed, share_upper_bound

    # p(true) and the oracle's answer: 200 positives (10 at p 0.3), 200 negatives (10 at 0.7)
    points = [(_Point(p >= 0.5, max(p, 1 - p)), truth) for p, truth in
              [(0.95, True)] * 190 + [(0.3, True)] * 10
              + [(0.05, False)] * 190 + [(0.7, False)] * 10]
    population = [point for point, _ in points] + [_Point(True, 0.6), _Point(False, 0.6)]
    learned = learn_filter(points, population, 0.9, 0.9, delta=0.05)
    # up to 11 of 200 positives missed bounds the miss rate at <= 0.1 (at delta/2): all of 0.3
    # may be false, and the rows up to just below the next positive's value (0.95) too
    assert most_allowed(200, 0.1, 0.025) == 11
    assert share_upper_bound(11, 200, 0.025) <= 0.1 < share_upper_bound(12, 200, 0.025)
    assert learned.thresholds["false_at_or_below"] == pytest.approx(0.7)
    assert learned.recall_bound == pytest.approx(1 - share_upper_bound(10, 200, 0.025), abs=1e-6)
    assert learned.sample_recall == 0.95
    # the positives kept (190) need no false positive: true from the next value above 0.7
    assert learned.thresholds["true_at_or_above"] == pytest.approx(0.95)
    assert learned.precision_bound == pytest.approx(1 - share_upper_bound(0, 190, 0.025),
                                                    abs=1e-6)
    # a surer guarantee (smaller delta) allows fewer misses: 0.3 stays false, 0.7 goes up
    surer = learn_filter(points, population, 0.9, 0.9, delta=1e-6)
    assert most_allowed(200, 0.1, 0.5e-6) < 10
    assert surer.thresholds["false_at_or_below"] < 0.3
    # one label a row: 300 right at 0.99, 15 wrong at 0.8, 15 wrong at 0.7; the call's wrong
    # labels (rows at >= t times the bound on their share) must stay within 10% of all 330
    label_points = [(_Point("a", c), "a" if right else "b") for c, right in
                    [(0.99, True)] * 300 + [(0.8, False)] * 15 + [(0.7, False)] * 15]
    learned = learn_label(label_points, [p for p, _ in label_points], 0.9, delta=0.05)
    assert learned.thresholds["accept_at_or_above"] == 0.8
    assert 315 * share_upper_bound(15, 315, 0.05) <= 33 < 330 * share_upper_bound(30, 330, 0.05)
    assert learned.sample_precision == learned.sample_recall == pytest.approx(1 - 15 / 330,
                                                                             abs=1e-6)
    assert learned.precision_bound == learned.recall_bound >= 0.9


def test_a_sample_is_at_most_a_third_of_the_rows_and_too_few_rows_warn(caplog):
    from dagster_batchllm.semantic.cascade import FILTER, sample_size, too_few_rows

    assert sample_size(50, 500) == 16 and sample_size(4000, 500) == 500
    cascade = Cascade(proxy=PROXY, oracle=ORACLE)
    warning = too_few_rows(FILTER, 50, cascade)
    assert "a sample of 16" in warning and "lower the targets" in warning
    assert too_few_rows(FILTER, 4000, cascade) is None
    assert "no mistake" in too_few_rows(FILTER, 4000, Cascade(proxy=PROXY, oracle=ORACLE,
                                                               target_recall=1.0))


def test_delta_is_checked_and_parsed():
    assert Cascade(proxy=PROXY, oracle=ORACLE).delta == 0.05
    assert Cascade.parse({"proxy": PROXY, "oracle": ORACLE, "delta": 0.01}).delta == 0.01
    assert Cascade.parse(f'{{"proxy": "{PROXY}", "oracle": "{ORACLE}", "delta": 0.2}}'
                         ).delta == 0.2
    for wrong in (0, 1, 1.5, True, "0.05"):
        with pytest.raises(InferenceConfigError, match="'delta'"):
            Cascade(proxy=PROXY, oracle=ORACLE, delta=wrong)


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
