"""Chaos suite: thousands of rows through ``infer()`` while endpoints and processes misbehave.

From the repository root::

    .venv/bin/python -m bench.chaos                  # all scenarios, bench size (~4-6 min)
    .venv/bin/python -m bench.chaos --scale test     # the reduced form tests/test_chaos.py runs
    .venv/bin/python -m bench.chaos --only crash,429_storm
    .venv/bin/python -m bench.chaos --only sigterm,sigkill_64,ledger_outage   # stopping (9-11)

Prints one table. Everything is measured on the simulated servers' side: requests that arrived,
duplicate deliveries (the same request answered 200 more than once, over all endpoints), tokens
billed (versus a run of the same rows with nothing going wrong), and the peak requests and
tokens that arrived within any rate-limit window. Required in every scenario: no missing row
(every row ok with its own answer, failed with a typed reason, or deferred), duplicates no more
than the requests in flight at a crash, budget and rate limits never exceeded. Exits 1 if a
scenario broke a requirement. The fault scenarios (1-8) and their harness are
:mod:`dagster_batchllm.testing.chaos`; the stopping ones (9-11) are ``bench/chaos_stopping.py``.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.chaos_stopping import STOPPING_SCENARIOS
from dagster_batchllm.testing.chaos import SCALES, Outcome, run_scenario
from dagster_batchllm.testing.chaos import SCENARIOS as FAULT_SCENARIOS

SCENARIOS = {**FAULT_SCENARIOS, **STOPPING_SCENARIOS}

HEADER = ["scenario", "rows ok / failed / deferred / missing", "requests sent",
          "duplicate deliveries", "tokens billed (vs clean run)",
          "limit respected (server-side)", "wall s"]


def table(outcomes: list[Outcome]) -> str:
    rows = [HEADER] + [o.as_row() for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="bench")
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}")

    print(f"chaos suite, scale '{scale.name}': {scale.rows} rows per scenario "
          f"({scale.crash_rows} in the crash scenario, {scale.contention_rows} per partition in "
          "the contention one); endpoints allow "
          f"{scale.rps:g} req/s and {scale.tps:g} tok/s each, enforced and measured by the "
          f"servers over a {scale.window_s:g} s window; {scale.concurrency} requests in flight "
          f"per endpoint; service time {scale.latency_s * 1000:g} ms; request timeout "
          f"{scale.timeout_s:g} s. Scaled down from the issue: the 429 storm lasts "
          f"{scale.storm_s:g} s (not 60), the restarted endpoint is down "
          f"{scale.restart_down_s:g} s.", flush=True)
    started = time.perf_counter()
    outcomes = []
    for name in names:
        print(f"  running {name} ...", flush=True)
        outcome = run_scenario(name, scale, scenarios=SCENARIOS)
        outcomes.append(outcome)
        print(f"    {' | '.join(outcome.as_row())}", flush=True)
    print()
    print(table(outcomes))
    print()
    for outcome in outcomes:
        details = []
        if outcome.failures:
            details.append("failed rows: " + ", ".join(
                f"{n} {code}" for code, n in sorted(outcome.failures.items())))
        statuses = {k: v for k, v in outcome.statuses.items() if v and k != "200"}
        if statuses:
            details.append("server answers besides 200: " + ", ".join(
                f"{v} {k}" for k, v in sorted(statuses.items())))
        details += outcome.notes
        details += [f"REQUIREMENT BROKEN: {p}" for p in outcome.problems]
        if details:
            print(f"{outcome.name.split(' ', 1)[0]} " + "; ".join(details))
    print("\n'conc' is the most requests the server held at once; it may pass the client's cap "
          "by the requests a client gave up on (timeouts), which the server still works on.")
    broken = [o.name for o in outcomes if o.problems]
    print(f"\n{len(outcomes) - len(broken)}/{len(outcomes)} scenarios met every requirement "
          f"in {time.perf_counter() - started:.0f} s.")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
