"""The chaos suite: thousands of rows through ``InferenceClient.infer()`` while endpoints and
processes misbehave, measured on the simulated servers' side.

``bench/chaos.py`` runs every scenario at ``BENCH`` size and prints the table;
``tests/test_chaos.py`` runs them at ``TEST`` size. Each scenario measures requests that
arrived, 200 answers given to the same request more than once (across all endpoints), tokens
billed, and the peak requests and tokens in any rate-limit window, and checks every output
row: ok (with the right answer for that row), failed with a typed reason, or deferred;
anything else is a missing row.

Example::

    from dagster_batchllm.testing.chaos import TEST, run_scenario

    outcome = run_scenario("429_storm", TEST)
    assert not outcome.problems, outcome.problems

Scenarios 5 and 6 infer in worker processes, ``python -m dagster_batchllm.testing.chaos
'<job json>'`` (see ``running.run_worker`` for the job's keys).
"""

from .data import distinct_requests, make_frame
from .fleet import BENCH, SCALES, TEST, Fleet, Scale, clean_tokens, infer, measured, tally
from .outcome import Outcome, classify_rows, finish
from .running import (
    POSTGRES_URL,
    Background,
    drop_tables,
    ledger_counts,
    postgres_unavailable,
    start_worker,
    wait_until,
    worker_result,
)
from .scenarios import SCENARIOS, run_scenario, worker_job

__all__ = [
    "BENCH",
    "POSTGRES_URL",
    "SCALES",
    "SCENARIOS",
    "TEST",
    "Background",
    "Fleet",
    "Outcome",
    "Scale",
    "classify_rows",
    "clean_tokens",
    "distinct_requests",
    "drop_tables",
    "finish",
    "infer",
    "ledger_counts",
    "make_frame",
    "measured",
    "postgres_unavailable",
    "run_scenario",
    "start_worker",
    "tally",
    "wait_until",
    "worker_job",
    "worker_result",
]
