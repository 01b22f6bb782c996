"""Runs raise the collector's thresholds while they go, and put them back after."""

from __future__ import annotations

import gc
import weakref

import pandas as pd
import pytest

from dagster_batchllm.core.run import engine, gc_pacing
from dagster_batchllm.core.run.gc_pacing import BATCH_THRESHOLDS, RUN_THRESHOLDS, fewer_collections
from dagster_batchllm.testing import run_on_threads

DEFAULT = (700, 10, 10)  # CPython's thresholds


@pytest.fixture
def default_thresholds():
    """The collector's thresholds at ``DEFAULT`` for the test, put back as they were after."""
    before = gc.get_threshold()
    gc.set_threshold(*DEFAULT)
    yield
    gc.set_threshold(*before)


def test_the_thresholds_are_raised_while_any_run_is_active_and_restored_after_the_last(
        default_thresholds):
    with fewer_collections():
        assert gc.get_threshold() == RUN_THRESHOLDS
        with fewer_collections():  # a second run (nested, or on another thread)
            pass
        assert gc.get_threshold() == RUN_THRESHOLDS  # the first still runs
    assert gc.get_threshold() == DEFAULT
    gc.set_threshold(200_000, 5, 500)  # higher than a run's: kept where higher
    with fewer_collections():
        assert gc.get_threshold() == (200_000, 50, 500)
    assert gc.get_threshold() == (200_000, 5, 500)


def test_a_batch_call_raises_them_further_while_it_runs_beside_online_runs(default_thresholds):
    with fewer_collections():
        with fewer_collections(BATCH_THRESHOLDS):
            assert gc.get_threshold() == BATCH_THRESHOLDS
        assert gc.get_threshold() == RUN_THRESHOLDS  # the online run's, once it is alone
    assert gc.get_threshold() == DEFAULT


def test_a_caller_that_changes_the_thresholds_during_a_run_keeps_its_own(default_thresholds):
    with fewer_collections():
        gc.set_threshold(1234, 10, 10)
    assert gc.get_threshold() == (1234, 10, 10)


def test_concurrent_runs_on_threads_leave_the_thresholds_as_they_found_them(sim, make_client):
    before = gc.get_threshold()
    client = make_client(sim)

    def run(t: int) -> None:
        df = pd.DataFrame({"text": [f"thread {t} row {i}" for i in range(200)]})
        result = client.infer(df, prompt="Echo {text}", model="sim-model")
        assert result.stats.succeeded == len(df)

    run_on_threads(run, range(3))
    assert gc.get_threshold() == before and not gc_pacing._holders


@pytest.mark.slow
def test_an_ended_run_is_freed_without_a_collection(sim, make_client, monkeypatch):
    """Runs hold collections off, a batch call for its whole length: a run it is done with
    must go when it is dropped (else a batch pass's runs, a slice each, all stay to the end of
    the call with their keys and row arrays)."""
    runs: list[weakref.ref] = []
    make_run = engine.InferenceRun.__init__

    def remember(self, *args, **kwargs):
        make_run(self, *args, **kwargs)
        runs.append(weakref.ref(self))

    monkeypatch.setattr(engine.InferenceRun, "__init__", remember)
    client = make_client(sim)
    gc.collect()
    gc.disable()
    try:
        result = client.infer(pd.DataFrame({"text": [f"row {i}" for i in range(50)]}),
                              prompt="Echo {text}", model="sim-model")
        assert result.stats.succeeded == 50
        assert len(runs) == 1 and runs[0]() is None
    finally:
        gc.enable()
