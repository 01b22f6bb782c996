"""Two runs over the same rows share a ledger; one is SIGKILLed mid-run. The survivor takes
over the dead run's claims and folds its journal (the answers it had received but not yet
written to the ledger), so it finishes every row and pays again only for what the dead run
had in flight: at most that run's max_concurrency. Real processes, one simulated endpoint,
duplicates counted at the server; on a SQLite file and on a PostgreSQL table."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.ledger.stores import normalize_store_url
from dagster_batchllm.testing import SimulatedEndpoint, wait_until

ROWS = 1500
CONCURRENCY = 16  # each run's max_concurrency (the endpoint's: the two share it)
KILL_AFTER_OK = ROWS // 3
pytestmark = pytest.mark.timeout(180)

# One run = one process over all the rows, default ledger flushing (up to 64 answers unwritten),
# its results to a JSON file.
RUN = """
import json, sys
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

base_url, store_url, table, rows, concurrency, run_id, out_path = sys.argv[1:8]
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="ep0", base_url=base_url, models=("sim-model",),
                            max_concurrency=int(concurrency)),),
    store_url=store_url, ledger_table=table, progress_interval_s=3600.0,
)
df = pd.DataFrame({"text": [f"neighbour row {i:05d}" for i in range(int(rows))]})
with InferenceClient(settings) as client:
    result = client.infer(df, prompt="Echo {text}", model="sim-model", output_column="out",
                          run_id=run_id)
with open(out_path, "w") as f:
    json.dump({"out": result.df["out"].tolist(), "errors": result.df["out_error"].tolist(),
               "stats": result.stats.as_dict()}, f)
"""


def _paid_by(engine: sa.Engine, table: str) -> dict[str, int]:
    """Answers each run has written to the ledger so far, by run id."""
    quoted = engine.dialect.identifier_preparer.quote(table)
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql(
            f"SELECT run_id, COUNT(*) FROM {quoted} WHERE attempts > 0 GROUP BY run_id").all())


def kill_one_of_two(store_url: str, table: str, tmp_path) -> dict:
    """Start two runs over the same rows, SIGKILL the one that has paid for more answers once
    a third are answered, let the other finish; what happened, measured."""
    engine = sa.create_engine(normalize_store_url(store_url))
    with SimulatedEndpoint(latency_s=0.02, max_concurrency=256) as sim:
        runs = {}
        for run_id in ("first", "second"):
            out = tmp_path / f"{run_id}.json"
            runs[run_id] = (out, subprocess.Popen(
                [sys.executable, "-c", RUN, sim.base_url, store_url, table, str(ROWS),
                 str(CONCURRENCY), run_id, str(out)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        try:
            wait_until(lambda: sim.stats(log=False)["ok"] >= KILL_AFTER_OK
                       or any(p.poll() is not None for _, p in runs.values()), 60,
                       f"{KILL_AFTER_OK} answers")
            assert all(p.poll() is None for _, p in runs.values()), [
                p.communicate()[0].decode()[-3000:] for _, p in runs.values()]
            paid = _paid_by(engine, table)
            killed = max(runs, key=lambda run_id: paid.get(run_id, 0))
            at_kill = sim.stats(log=False)
            runs[killed][1].kill()  # SIGKILL
            runs[killed][1].wait(30)
            (survivor,) = set(runs) - {killed}
            out, proc = runs[survivor]
            output = proc.communicate(timeout=120)[0].decode(errors="replace")
            assert proc.returncode == 0, output[-3000:]
            result = json.loads(out.read_text())
            wait_until(lambda: sim.stats(log=False)["in_flight"] == 0, 10, "requests to end")
            return {"result": result, "at_kill": at_kill, "end": sim.stats(log=False),
                    "paid_at_kill": paid, "killed": killed, "output": output}
        finally:
            for _, proc in runs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            engine.dispose()


def check_survivor(measured: dict, backend: str) -> None:
    result, end, at_kill = measured["result"], measured["end"], measured["at_kill"]
    assert result["out"] == [f"[sim] Echo neighbour row {i:05d}" for i in range(ROWS)]
    assert all(e is None for e in result["errors"])
    assert (result["stats"]["succeeded"], result["stats"]["failed"]) == (ROWS, 0)
    assert end["ok"] == ROWS + end["duplicates"]  # every row answered, some twice
    print(f"\nkilled neighbour ({backend}): killed run '{measured['killed']}' after "
          f"{at_kill['ok']} answers (ledger held {measured['paid_at_kill']}), "
          f"{at_kill['in_flight']} requests in flight at the server (both runs), "
          f"{end['duplicates']} paid twice; the survivor sent {result['stats']['requests']}")
    assert end["duplicates"] <= CONCURRENCY, (
        f"{end['duplicates']} answers paid twice; the killed run could have had at most "
        f"{CONCURRENCY} in flight ({at_kill['in_flight']} were, both runs together)\n"
        f"{measured['output'][-3000:]}")


def test_a_survivor_on_a_sqlite_ledger_pays_again_only_what_the_killed_run_had_in_flight(
    tmp_path
):
    measured = kill_one_of_two(f"sqlite:///{tmp_path / 'ledger.db'}", "batchllm_requests",
                               tmp_path)
    check_survivor(measured, "SQLite")
    assert not list((tmp_path / ".ledger.db.journal").glob("*.jsonl"))  # folded, removed


@pytest.mark.postgres
def test_a_survivor_on_a_postgresql_ledger_pays_again_only_what_the_killed_run_had_in_flight(
    tmp_path, postgres_url
):
    table = f"batchllm_test_{uuid.uuid4().hex[:12]}"
    try:
        check_survivor(kill_one_of_two(postgres_url, table, tmp_path), "PostgreSQL")
    finally:
        engine = sa.create_engine(normalize_store_url(postgres_url))
        with engine.begin() as conn:
            for suffix in ("_runs", "_claims", "_budgets", ""):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}{suffix}"')
        engine.dispose()
