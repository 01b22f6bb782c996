"""The cascade's guarantee and cost over 100 seeded runs per proxy profile (issue 44).

In-process (cascade_evaluation): the labelled simulator's proxy without the HTTP, 4,000 rows a
run, targets 0.9/0.9, delta 0.05, sample 500, prices 20:1. The targets must be met in at least
95 runs of 100 whatever the proxy; the cost is compared with the known-labels floor.
"""

from __future__ import annotations

import pytest

from dagster_batchllm.simulator.labelled import LabelledResponder
from tests.semantic.cascade_evaluation import PROXY_PRICE, evaluate
from tests.semantic.cascade_helpers import TRUTH

pytestmark = pytest.mark.timeout(300)
_FIGURES: dict[str, object] = {}


def _figures(profile: str):
    if profile not in _FIGURES:
        _FIGURES[profile] = evaluate(profile)
        print(_FIGURES[profile].line())
    return _FIGURES[profile]


@pytest.mark.parametrize("profile", ["good", "weak", "useless"])
def test_the_targets_are_met_in_95_runs_of_100(profile):
    figures = _figures(profile)
    assert figures.met >= 95, figures.line()


def test_a_useless_proxy_costs_at_most_the_oracle_and_the_proxy():
    figures = _figures("useless")
    assert figures.mean_cost <= 1.0 + PROXY_PRICE, figures.line()


@pytest.mark.xfail(strict=True, reason=(
    "issue 44's cost target, not reached yet: with exact bounds at delta 0.05 and a uniform "
    "sample of 500, the mean cost is 0.532 (good) and 0.714 (weak) of oracle-only against a "
    "floor plus the sample of 0.412 and 0.542 (measured 2026-12-06); importance sampling "
    "toward the unsure rows is the next step"))
@pytest.mark.parametrize("profile", ["good", "weak"])
def test_the_cost_is_within_a_tenth_of_the_floor_plus_the_sample(profile):
    figures = _figures(profile)
    assert figures.mean_cost <= figures.mean_floor_plus_sample + 0.1, figures.line()


def test_the_profiles_are_what_they_say():
    texts = [f"Ticket {i}: text" for i in range(4000)]

    def measure(profile):
        responder = LabelledResponder(TRUTH, profile=profile)
        right = [responder.proxy_is_right(t) for t in texts]
        sure = [responder.confidence("llama-8b", t) for t in texts]
        confidently_wrong = sum(c >= 0.9 and not r for r, c in zip(right, sure, strict=True))
        return sum(right) / len(texts), confidently_wrong / len(texts), right, sure

    accuracy, _, right, sure = measure("good")
    assert accuracy == pytest.approx(0.85, abs=0.02)
    unsure_rows = [r for r, c in zip(right, sure, strict=True) if c < 0.7]
    assert sum(unsure_rows) / len(unsure_rows) < 0.7  # calibrated-ish: unsure means unsure
    accuracy, confidently_wrong, _, _ = measure("weak")
    assert accuracy == pytest.approx(0.75, abs=0.02)
    assert confidently_wrong == pytest.approx(0.05, abs=0.01)
    accuracy, _, right, sure = measure("useless")
    assert accuracy == pytest.approx(0.5, abs=0.03)
    sure_rows = [r for r, c in zip(right, sure, strict=True) if c >= 0.9]
    assert sum(sure_rows) / len(sure_rows) == pytest.approx(0.5, abs=0.06)  # unrelated
    # the default is the profile every existing test was written against
    default = LabelledResponder(TRUTH)
    assert default.profile == "skewed" and default.proxy_accuracy == 0.85
    with pytest.raises(ValueError, match="proxy_accuracy= sets only"):
        LabelledResponder(TRUTH, profile="weak", proxy_accuracy=0.9)
