"""The exact bounds behind the cascade's guarantee, against scipy's where it is installed."""

from __future__ import annotations

import pytest

from dagster_batchllm.semantic.guarantee import (
    binomial_cdf,
    least_sample,
    most_allowed,
    share_upper_bound,
)


def test_the_upper_bound_is_clopper_pearsons():
    stats = pytest.importorskip("scipy.stats")
    for k, n, alpha in [(0, 10, 0.05), (3, 40, 0.025), (17, 167, 0.025), (60, 360, 0.05),
                        (200, 1500, 0.001)]:
        assert share_upper_bound(k, n, alpha) == pytest.approx(
            stats.beta.ppf(1 - alpha, k + 1, n - k), abs=1e-9)
        assert binomial_cdf(k, n, 0.2) == pytest.approx(stats.binom.cdf(k, n, 0.2), abs=1e-12)
    assert share_upper_bound(5, 5, 0.05) == share_upper_bound(0, 0, 0.05) == 1.0


def test_the_bound_holds_as_often_as_it_says():
    import random

    rng = random.Random(1)
    share, n, alpha = 0.08, 150, 0.05
    misses = sum(share_upper_bound(sum(rng.random() < share for _ in range(n)), n, alpha)
                 < share for _ in range(2000))
    assert misses / 2000 <= alpha + 0.015  # exact bounds are conservative: about 3% here


def test_the_counts_allowed_and_the_least_sample():
    assert most_allowed(200, 0.1, 0.025) == 11  # CP(11 of 200) <= 0.1 < CP(12 of 200)
    assert share_upper_bound(11, 200, 0.025) <= 0.1 < share_upper_bound(12, 200, 0.025)
    assert most_allowed(20, 0.1, 0.025) == -1  # 20 rows cannot bound a share at 0.1
    assert least_sample(0.1, 0.025) == 36  # 0.9^36 <= 0.025 < 0.9^35
    assert 0.9 ** 36 <= 0.025 < 0.9 ** 35
    assert least_sample(0.0, 0.05) is None and least_sample(1.0, 0.05) == 0
