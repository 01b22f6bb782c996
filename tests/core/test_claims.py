"""Request claims between runs: one key order, retried instead of skipped, shares handed over.

The policies in small: the claim statement never deadlocks (PostgreSQL, real concurrent
sessions), a failing claim is retried with sending paused and fails the run past the outage
bound, and a run that only waits for other runs' answers gives its share of an endpoint to
them. tests/core/test_runs_over_the_same_rows.py runs whole processes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.errors import ClaimsUnavailableError, LedgerUnwritable
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.core.run.coordination import RunCoordination, RunCoordinator

log = logging.getLogger("test_claims")


def _drop(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        for suffix in ("_runs", "_claims", ""):
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{ledger.table.name}{suffix}"')


@pytest.mark.slow
@pytest.mark.postgres
def test_concurrent_claims_of_overlapping_keys_in_any_order_never_deadlock(postgres_url):
    """Four sessions claim 600 overlapping keys each, in their own random orders, 8 times over:
    before the keys were sorted, PostgreSQL failed some with 'deadlock detected'."""
    ledger = Ledger(postgres_url, f"batchllm_claims_{uuid.uuid4().hex[:8]}")
    try:
        keys = [f"{i:064x}" for i in range(1_000)]
        coordinators = [RunCoordinator(ledger.engine, ledger.table, ["e"]) for _ in range(4)]
        failures: list[BaseException] = []
        held_by: list[set[str]] = [set() for _ in coordinators]
        barrier = threading.Barrier(len(coordinators))

        def claim_rounds(index: int) -> None:
            rng = random.Random(index)
            coordinator = coordinators[index]
            for _ in range(8):
                mine = rng.sample(keys, 600)
                barrier.wait(timeout=60)
                try:
                    others = coordinator.claim(mine)
                    held_by[index] = set(mine) - others
                    barrier.wait(timeout=60)
                    coordinator.release(held_by[index])
                except BaseException as exc:
                    failures.append(exc)
                    barrier.abort()
                    return

        threads = [threading.Thread(target=claim_rounds, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures[0]
    finally:
        _drop(ledger)
        ledger.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_each_key_has_one_holder_among_concurrent_claims(postgres_url):
    ledger = Ledger(postgres_url, f"batchllm_claims_{uuid.uuid4().hex[:8]}")
    try:
        keys = [f"{i:064x}" for i in range(2_000)]
        coordinators = [RunCoordinator(ledger.engine, ledger.table, ["e"]) for _ in range(4)]
        # Register each as a live run, so their claims are not taken over as abandoned.
        for coordinator in coordinators:
            coordinator.heartbeat()
        results: dict[int, set[str]] = {}
        orders = [keys, keys[::-1], keys[500:] + keys[:500], keys[1500:] + keys[:1500]]

        def claim(index: int) -> None:
            results[index] = set(keys) - coordinators[index].claim(orders[index])

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert sum(len(mine) for mine in results.values()) == len(keys)
        assert set().union(*results.values()) == set(keys)
    finally:
        _drop(ledger)
        ledger.dispose()


class _FailingCoordinator:
    """Raises the database's errors a number of times before claiming (the policy's input)."""

    def __init__(self, failures: list[Exception]):
        self.failures = list(failures)
        self.calls = 0
        self.taken_over = 0

    def claim(self, keys: list[str]) -> set[str]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {"held-elsewhere"} & set(keys)


def _deadlock() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT INTO claims ...", {},
                                   Exception("deadlock detected"))


def _coordination(coordinator, *, outage_s: float = 120.0) -> RunCoordination:
    return RunCoordination(coordinator, pool=None, interval_s=0.5, log=log,
                           outage_s=outage_s, where="postgresql://ledger-host/db")


def test_a_failed_claim_is_retried_never_skipped():
    coordinator = _FailingCoordinator([_deadlock(), _deadlock(), _deadlock()])
    held = asyncio.run(_coordination(coordinator).claim(["a", "held-elsewhere"]))
    assert held == {"held-elsewhere"}  # the claim's own answer, not an empty "send it all"
    assert coordinator.calls == 4


def test_claims_failing_past_the_outage_bound_fail_the_run_naming_the_database():
    now = [0.0]

    def clock() -> float:
        now[0] += 50.0  # each failure 50 s after the last
        return now[0]

    coordinator = _FailingCoordinator([_deadlock()] * 10)
    with pytest.raises(ClaimsUnavailableError) as raised:
        asyncio.run(_coordination(coordinator, outage_s=120.0).claim(["a"], clock=clock))
    message = str(raised.value)
    assert "postgresql://ledger-host/db" in message and "150 s" in message
    assert "nothing more was sent" in message
    assert coordinator.calls == 4  # failed at 50, 100, 150, 200 s: 150 s past the first


def test_claims_stop_as_soon_as_the_ledger_writer_has_given_up_on_the_database():
    # The writer's outage clock starts at its first failed write, before the claims fail: the
    # claim loop must not wait out a clock of its own after the writer has given up.
    given_up = LedgerUnwritable("the ledger database postgresql://ledger-host/db could not be "
                                "written for 121 s")
    coordinator = _FailingCoordinator([_deadlock()] * 10)
    coordination = _coordination(coordinator, outage_s=120.0)
    coordination.writer_gave_up = lambda: given_up if coordinator.calls >= 2 else None
    with pytest.raises(LedgerUnwritable) as raised:
        asyncio.run(coordination.claim(["a"], clock=lambda: 0.0))
    assert raised.value is given_up  # the writer's reason, not a second clock's
    assert coordinator.calls == 2


def test_failures_waiting_cannot_fix_stop_after_a_few():
    coordinator = _FailingCoordinator([sa.exc.ProgrammingError("SELECT", {}, Exception("no"))] * 9)
    with pytest.raises(ClaimsUnavailableError):
        asyncio.run(_coordination(coordinator).claim(["a"]))
    assert coordinator.calls == 5


def test_a_run_that_only_waits_gives_its_share_to_the_runs_that_send(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        sender, waiter = (RunCoordinator(ledger.engine, ledger.table, ["gpu"],
                                         max_concurrency={"gpu": 32}) for _ in range(2))
        sender.heartbeat()
        waiter.heartbeat()
        assert sender.heartbeat()["gpu"] == 2 and sender.capacities["gpu"] == 16
        waiter.heartbeat(sending=False)  # waits for the sender's answers: claims nothing
        assert sender.heartbeat()["gpu"] == 1
        assert sender.capacities["gpu"] == 32
        waiter.heartbeat(sending=True)  # sends again (a parked request came back to it)
        assert sender.heartbeat()["gpu"] == 2 and sender.capacities["gpu"] == 16
    finally:
        ledger.dispose()


def test_a_runs_table_of_an_earlier_version_gets_the_sending_column(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.engine.begin() as conn:  # the table as versions before the column made it
            conn.exec_driver_sql(
                'CREATE TABLE "batchllm_requests_runs" (holder_id VARCHAR(64) NOT NULL, '
                "endpoint VARCHAR(255) NOT NULL, heartbeat_at FLOAT NOT NULL, description "
                "VARCHAR(255), live BOOLEAN NOT NULL, requests_claim FLOAT NOT NULL, "
                "tokens_claim FLOAT NOT NULL, concurrency_claim FLOAT NOT NULL, "
                "PRIMARY KEY (holder_id, endpoint))")
            conn.exec_driver_sql(  # a run of that version, live: its NULL means sending
                "INSERT INTO batchllm_requests_runs VALUES ('elsewhere:1:p:h', 'gpu', "
                f"{time.time()}, 'old', 1, 0, 0, 4)")
        coordinator = RunCoordinator(ledger.engine, ledger.table, ["gpu"],
                                     max_concurrency={"gpu": 8})
        assert coordinator.heartbeat()["gpu"] == 2
        assert coordinator.capacities["gpu"] == 4
    finally:
        ledger.dispose()
