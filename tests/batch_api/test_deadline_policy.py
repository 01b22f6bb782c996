"""The deadline's policy alone, on an injected clock: when the rows still unanswered must go
online, whether a deadline is out of reach, and what the figures say. No server, no sleep: the
end-to-end behaviour is tests/batch_api/test_deadline.py's."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from dagster_batchllm.core.batch.deadline import (
    MARGIN_S,
    SAFETY_FACTOR,
    WAKE_S,
    DeadlineKeeper,
    OnlineRate,
    deadline_at,
)
from dagster_batchllm.core.errors import InferenceConfigError

DEADLINE = 1_000_000.0


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def keeper(clock: Clock, requests_per_s: float = 10.0, wait: bool = True) -> DeadlineKeeper:
    return DeadlineKeeper(DEADLINE, OnlineRate(requests_per_s), book=None, wait=wait,
                          clock=clock)


def test_the_switch_comes_when_the_online_endpoints_need_the_time_left_with_margins():
    clock = Clock(DEADLINE - 3600)
    k = keeper(clock)
    # 100 rows at 10 a second: 10 s, stretched by the safety factor, plus the fixed margin.
    assert k.switch_at(100) == pytest.approx(DEADLINE - 10 * SAFETY_FACTOR - MARGIN_S)
    assert not k.due(100)
    clock.now = k.switch_at(100) - 0.001
    assert not k.due(100)
    clock.now = k.switch_at(100)
    assert k.due(100)
    assert not k.due(0)  # nothing left to send: never due


def test_without_waiting_the_switch_leaves_time_for_a_run_to_start():
    clock = Clock(DEADLINE - 3600)
    waiting, not_waiting = keeper(clock), keeper(clock, wait=False)
    assert waiting.switch_at(100) - not_waiting.switch_at(100) == pytest.approx(WAKE_S)


def test_more_rows_switch_earlier_and_no_online_rate_switches_at_once():
    clock = Clock(DEADLINE - 3600)
    k = keeper(clock)
    assert k.switch_at(10_000) < k.switch_at(100)
    unmeasurable = keeper(clock, requests_per_s=0.0)
    assert unmeasurable.due(1)  # no endpoint can answer them: due now, whatever the clock


def test_a_deadline_out_of_reach_is_said_once_with_its_figures(caplog):
    clock = Clock(DEADLINE - 5)
    k = keeper(clock)
    with caplog.at_level(logging.WARNING, logger="dagster_batchllm"):
        assert k.say_if_out_of_reach(1000)  # 100 s of work, 5 s left
        assert not keeper(Clock(DEADLINE - 3600)).say_if_out_of_reach(1000)
    [record] = caplog.records
    assert "cannot be met even online" in record.getMessage()
    assert "1000 rows need about 100 s" in record.getMessage()


def test_the_figures_say_met_pending_or_missed():
    clock = Clock(DEADLINE - 60)
    k = keeper(clock)
    assert k.figures(finished_at=DEADLINE - 1, unanswered=0)["status"] == "met"
    assert k.figures(finished_at=DEADLINE + 1, unanswered=0)["status"] == "missed"
    k.switch_planned = DEADLINE - 30  # a wait=False call: its switch is ahead
    assert k.figures(finished_at=DEADLINE - 50, unanswered=40)["status"] == "pending"
    k.switched_at = DEADLINE - 30
    assert k.figures(finished_at=DEADLINE - 20, unanswered=40)["status"] == "missed"


def test_a_deadline_is_a_datetime_a_timedelta_or_epoch_seconds():
    now = 1_700_000_000.0
    assert deadline_at(dt.timedelta(minutes=5), now=now) == now + 300
    assert deadline_at(now + 7, now=now) == now + 7
    moment = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
    assert deadline_at(moment, now=now) == moment.timestamp()
    assert deadline_at(None, now=now) is None
    with pytest.raises(InferenceConfigError, match="deadline must be a datetime"):
        deadline_at("tomorrow", now=now)
