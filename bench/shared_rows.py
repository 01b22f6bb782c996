"""Several processes over the same rows, one PostgreSQL ledger: paid twice and wall time.

    .venv/bin/python -m bench.shared_rows [--tries 10] [--processes 4]

Each try: one process alone over the rows (fresh ledger tables), then N processes at once over
the same rows (fresh tables again), against one simulated endpoint (100 ms latency, concurrency
32, so the limit is 320 rows/s whoever sends). Printed per try: the server's answers and the
rows it answered twice, the requests each process sent, the slowest process's inference time
against the lone process's (each process's own clock, its interpreter start-up left out), and
the span from the first start to the last end. Target (issue 39): paid twice <= requests in
flight (32), 0 in most tries; the N together <= 1.5x the time of one. Default settings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import uuid
from pathlib import Path

from dagster_batchllm.testing import SimulatedEndpoint
from tests.core.test_runs_over_the_same_rows import CONCURRENCY, drop_tables, run_processes

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def one_try(sim: SimulatedEndpoint, processes: int, tmp: Path) -> dict:
    figures = {}
    for label, n in (("alone", 1), ("together", processes)):
        table = f"batchllm_bench_{uuid.uuid4().hex[:8]}"
        sim.reset_stats()
        try:
            runs = run_processes(n, sim, POSTGRES_URL, table, tmp)
        finally:
            drop_tables(POSTGRES_URL, table)
        server = sim.stats(log=False)
        figures[label] = {"slowest_s": max(r["elapsed"] for r in runs),
                          "requests": [r["stats"]["requests"] for r in runs],
                          "ok": server["ok"], "paid_twice": server["duplicates"],
                          "every_row_right": all(r["right"] == r["stats"]["rows"]
                                                 for r in runs)}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    ratios, twice = [], []
    with SimulatedEndpoint(latency_s=0.1) as sim, tempfile.TemporaryDirectory() as tmp:
        print(f"| try | alone (s) | {args.processes} together, slowest (s) | ratio | "
              "requests per process | server answers | paid twice | all rows right |")
        print("|---|---|---|---|---|---|---|---|")
        for attempt in range(1, args.tries + 1):
            f = one_try(sim, args.processes, Path(tmp))
            alone, together = f["alone"], f["together"]
            ratio = together["slowest_s"] / alone["slowest_s"]
            ratios.append(ratio)
            twice.append(together["paid_twice"])
            print(f"| {attempt} | {alone['slowest_s']:.2f} | {together['slowest_s']:.2f} | "
                  f"{ratio:.2f}x | {together['requests']} | {together['ok']} | "
                  f"{together['paid_twice']} | {together['every_row_right']} |", flush=True)
    print(f"\nratio: median {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x "
          f"(target <= 1.5x); paid twice: {sum(twice)} over {args.tries} tries, worst "
          f"{max(twice)} (bound: {CONCURRENCY} in flight), 0 in {twice.count(0)} of "
          f"{args.tries}")


if __name__ == "__main__":
    main()
