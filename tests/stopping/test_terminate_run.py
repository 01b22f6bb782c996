"""Terminate through the UI's own API: a run launched from a real ``dagster dev`` (default run
launcher, multiprocess executor) and terminated with GraphQL's ``terminateRun`` mid-inference
ends CANCELED within 10 s, keeps every answer it received, and a rerun pays again for at most
what was in flight. Requests and duplicates are counted at the simulated server."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from dagster_batchllm import Ledger
from dagster_batchllm.testing import SimulatedEndpoint, wait_until
from tests import dagster_dev

LOCATION = "batchllm_terminate_test"
ROWS = 120
CONCURRENCY = 4
pytestmark = pytest.mark.timeout(300)

LOCATION_CODE = textwrap.dedent('''
    import os

    import dagster as dg
    import pandas as pd

    from dagster_batchllm import BatchInferenceResource, Endpoint, build_inference_asset


    @dg.asset
    def messages() -> pd.DataFrame:
        return pd.DataFrame({{"text": [f"message {{i}}" for i in range({rows})]}})


    replies = build_inference_asset(name="replies", source="messages", prompt="Reply: {{text}}",
                                    output_column="reply", model="sim-model")
    defs = dg.Definitions(
        assets=[messages, replies],
        jobs=[dg.define_asset_job("replies_job", selection=["messages", "replies"])],
        resources={{"llm": BatchInferenceResource(
            endpoints=[Endpoint(name="sim", base_url=os.environ["SIM_URL"], models=["sim-model"],
                                max_concurrency={concurrency})],
            store_url=os.environ["LEDGER_URL"], progress_interval_s=3600)}})
''')


class DagsterDev(dagster_dev.DagsterDev):
    """``dagster dev`` over the location above, its ledger in ``root``."""

    def __init__(self, root: Path, sim_url: str):
        self.ledger_url = f"sqlite:///{root / 'ledger.db'}"
        super().__init__(root, location_name=LOCATION,
                         location_code=LOCATION_CODE.format(rows=ROWS, concurrency=CONCURRENCY),
                         env={"SIM_URL": sim_url, "LEDGER_URL": self.ledger_url})


def test_terminate_run_through_dagster_dev_cancels_within_10_s_and_loses_no_answer(tmp_path):
    with SimulatedEndpoint(latency_s=1.0, process=True) as sim:
        dev = DagsterDev(tmp_path, sim.base_url)
        try:
            dev.wait_until_loaded()
            run_id = dev.launch("replies_job")
            # Terminated with requests in flight: those are the ones a rerun may pay again.
            wait_until(lambda: sim.stats(log=False)["ok"] >= 12
                       and sim.stats(log=False)["in_flight"] > 0, 120,
                       f"12 answers and requests in flight\n{dev.tail()}")
            in_flight = sim.stats(log=False)["in_flight"]
            terminated = time.monotonic()
            dev.terminate(run_id)
            status = dev.wait_for_status(run_id, {"CANCELED", "FAILURE", "SUCCESS"}, 30)
            took = time.monotonic() - terminated
            assert status == "CANCELED", dev.tail()
            assert took < 10, f"CANCELED after {took:.1f} s"
            said = [m for m in dev.messages(run_id) if "batchllm: stopping" in m]
            assert said, "the run did not say it stops"  # the stop went through the engine

            # Every answer the server gave before the stop is in the ledger, but for those the
            # stop cut off in flight (at most max_concurrency at any moment).
            wait_until(lambda: sim.stats(log=False)["in_flight"] == 0, 10, "in flight to end")
            answered = sim.stats(log=False)["ok"]
            ledger = Ledger(dev.ledger_url)
            kept = ledger.status_counts()["ok"]
            assert answered - kept <= CONCURRENCY, (answered, kept)
            assert kept < ROWS  # the run really was stopped mid-inference

            rerun = dev.launch("replies_job")
            assert dev.wait_for_status(rerun, {"SUCCESS", "FAILURE", "CANCELED"}, 180) == \
                "SUCCESS", dev.tail()
            stats = sim.stats(log=False)
            assert ledger.status_counts()["ok"] == ROWS  # every row answered once in the end
            assert stats["ok"] == ROWS + stats["duplicates"]
            assert stats["duplicates"] <= max(in_flight, CONCURRENCY), (
                f"{stats['duplicates']} answers paid twice; {in_flight} were in flight at the "
                f"terminate, at most {CONCURRENCY} can be")
            ledger.dispose()
            print(f"terminateRun: CANCELED after {took:.1f} s; {kept} of {answered} answers "
                  f"kept, {stats['duplicates']} paid twice by the rerun, {in_flight} in flight")
        finally:
            dev.stop()
