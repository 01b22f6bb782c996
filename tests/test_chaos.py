"""The chaos suite of bench/chaos.py (dagster_batchllm.testing.chaos) in its reduced form: fewer
rows, shorter storms.

Every scenario must end with no missing row (each ok with its own answer, failed with a typed
reason, or deferred), duplicate deliveries no more than the requests in flight at a crash, and
the token budget and the endpoints' rate limits never exceeded, all measured at the servers.
"""

from __future__ import annotations

import threading

import pytest

from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.testing.chaos import SCENARIOS, TEST, postgres_unavailable, run_scenario

SCENARIO_PARAMS = [
    pytest.param(name, marks=[pytest.mark.postgres] if name.endswith("postgres") else [], id=name)
    for name in SCENARIOS
]


@pytest.mark.parametrize("name", SCENARIO_PARAMS)
def test_chaos_scenario_loses_nothing_duplicates_nothing_and_keeps_limits(name, tmp_path):
    if name.endswith("postgres") and (reason := postgres_unavailable()):
        pytest.skip(reason)
    outcome = run_scenario(name, TEST, tmp_path)
    summary = f"{' | '.join(outcome.as_row())}; notes: {outcome.notes}"
    assert not outcome.problems, f"{outcome.problems}\n{summary}"
    assert outcome.missing == 0 and outcome.wrong == 0, summary
    assert outcome.ok + outcome.failed + outcome.deferred == outcome.rows, summary
    assert outcome.duplicates <= outcome.allowed_duplicates, summary
    if outcome.budget is not None:
        assert outcome.tokens <= outcome.budget, summary


def test_in_memory_ledger_takes_lookups_and_writes_from_several_threads():
    """A run looks answers up on one thread while it writes on another; with the one shared
    connection of an in-memory SQLite that failed ("cannot start a transaction within a
    transaction") and took the whole call down (found by the chaos suite)."""
    ledger = Ledger(None)
    errors: list[BaseException] = []

    def record(key: str) -> dict:
        return {"request_key": key, "scope": "", "partition_key": "", "model": "m",
                "status": "ok", "response": "r", "error": None, "error_type": None,
                "prompt_tokens": 1, "completion_tokens": 1, "attempts": 1, "endpoint": "e",
                "latency_ms": 1.0, "run_id": None}

    def hammer(worker: int) -> None:
        try:
            for i in range(150):
                ledger.upsert([record(f"k{worker}-{i}")])
                assert f"k{worker}-{i}" in ledger.lookup_ok([f"k{worker}-{i}"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    assert ledger.status_counts()["ok"] == 600
    ledger.dispose()
