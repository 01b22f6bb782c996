"""Exact (Clopper-Pearson) bounds on a share, for the cascade's guarantee (:mod:`.cascade`).

A cascade's sample is a uniform random subset of the rows, so the sample rows of any one kind
(the positives, say) are a uniform random subset of the call's rows of that kind, and the
number of them that the proxy gets wrong is hypergeometric. The binomial's Clopper-Pearson
bound holds for it too (sampling without replacement varies less than with), so
:func:`share_upper_bound` is a valid one-sided bound: the true share exceeds it with
probability at most ``alpha``.

Written without scipy (not a dependency of the package): the binomial's distribution function
summed term by term, and a bisection on the share. Every count here is at most the sample's
size, so a bound costs a few thousand multiplications.
"""

from __future__ import annotations

import math


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    # each term from the one before: P(j+1) = P(j) * (n-j)/(j+1) * p/(1-p), in logs so that
    # P(0) = (1-p)^n does not underflow for large n
    log_term = n * math.log1p(-p)
    log_ratio = math.log(p) - math.log1p(-p)
    total = 0.0
    for j in range(k + 1):
        total += math.exp(log_term)
        log_term += math.log(n - j) - math.log(j + 1) + log_ratio
    return min(total, 1.0)


def share_upper_bound(k: int, n: int, alpha: float) -> float:
    """The Clopper-Pearson upper bound on a share seen ``k`` times in ``n``: the largest share
    ``q`` with P(X <= k | q) >= alpha. 1.0 when ``n`` is 0 (nothing seen: anything goes) or
    every one was seen."""
    if n <= 0 or k >= n:
        return 1.0
    if k < 0:
        raise ValueError(f"a count is >= 0, got {k}")
    if k == 0:  # closed form: (1-q)^n = alpha
        return 1.0 - alpha ** (1.0 / n)
    low, high = k / n, 1.0  # the cdf falls as q rises; the bound is above the estimate
    for _ in range(50):  # 2^-50: far below any share's meaning
        middle = (low + high) / 2
        if binomial_cdf(k, n, middle) >= alpha:
            low = middle
        else:
            high = middle
    return high


def most_allowed(n: int, limit: float, alpha: float) -> int:
    """The largest count ``k`` of ``n`` whose upper bound on the share stays <= ``limit``;
    -1 where even none seen does not bound it that low (the sample is too small)."""
    if n <= 0 or share_upper_bound(0, n, alpha) > limit:
        return -1
    low, high = 0, n  # the bound rises with k: bisect on it
    while low < high:
        middle = (low + high + 1) // 2
        if share_upper_bound(middle, n, alpha) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


def least_sample(limit: float, alpha: float) -> int | None:
    """The fewest rows a share can be bounded from at ``<= limit``, none of them wrong:
    ``(1 - limit)^n <= alpha``; a smaller sample of the kind cannot vouch for any row. None
    where no sample can (``limit`` 0: a target of 1.0 allows no mistake)."""
    if limit >= 1.0:
        return 0
    if limit <= 0.0:
        return None
    return math.ceil(math.log(alpha) / math.log1p(-limit) - 1e-12)
