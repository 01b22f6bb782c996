"""Terminate through the UI's own API: a run launched from a real ``dagster dev`` (default run
launcher, multiprocess executor) and terminated with GraphQL's ``terminateRun`` mid-inference
ends CANCELED within 10 s, keeps every answer it received, and a rerun pays again for at most
what was in flight. Requests and duplicates are counted at the simulated server."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dagster_batchllm import Ledger
from dagster_batchllm.testing import SimulatedEndpoint, wait_until

BIN = Path(sys.executable).parent
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


class DagsterDev:
    """``dagster dev`` on 127.0.0.1 over the location above, and its GraphQL API."""

    def __init__(self, root: Path, sim_url: str):
        self.port = _free_port()
        self.log = root / "dagster_dev.log"
        home = root / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(  # runs start at once, no queue
            "run_coordinator:\n  module: dagster._core.run_coordinator\n"
            "  class: DefaultRunCoordinator\ntelemetry:\n  enabled: false\n")
        (root / "location.py").write_text(LOCATION_CODE.format(rows=ROWS,
                                                               concurrency=CONCURRENCY))
        (root / "workspace.yaml").write_text(
            f"load_from:\n  - python_file:\n      relative_path: location.py\n"
            f"      working_directory: {root}\n      location_name: {LOCATION}\n")
        self.ledger_url = f"sqlite:///{root / 'ledger.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
        env.update(DAGSTER_HOME=str(home), SIM_URL=sim_url, LEDGER_URL=self.ledger_url)
        self._sink = self.log.open("wb")
        self.process = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-w", str(root / "workspace.yaml"), "-h", "127.0.0.1",
             "-p", str(self.port)],
            cwd=root, env=env, stdout=self._sink, stderr=subprocess.STDOUT,
            start_new_session=True)  # its webserver, daemon and code server stop with it

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def query(self, query: str, variables: dict | None = None) -> dict:
        # http.client rather than urllib: urllib would send 127.0.0.1 through an HTTP(S)_PROXY.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", "/graphql",
                         body=json.dumps({"query": query, "variables": variables or {}}),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        assert response.status == 200, body[:500]
        payload = json.loads(body)
        assert "errors" not in payload, payload["errors"]
        return payload["data"]

    def wait_until_loaded(self, timeout_s: float = 150) -> None:
        def loaded() -> bool:
            assert self.process.poll() is None, self.tail()
            try:
                data = self.query("{ workspaceOrError { ... on Workspace { locationEntries { "
                                  "loadStatus locationOrLoadError { __typename } } } } }")
            except OSError:
                return False  # not listening yet
            [entry] = data["workspaceOrError"]["locationEntries"]
            return entry["loadStatus"] == "LOADED"
        wait_until(loaded, timeout_s, f"the location to load\n{self.tail()}")

    def launch(self) -> str:
        launched = self.query("""mutation($params: ExecutionParams!) {
            launchRun(executionParams: $params) {
              __typename ... on LaunchRunSuccess { run { runId } }
              ... on PythonError { message } } }""", {"params": {"selector": {
            "repositoryLocationName": LOCATION, "repositoryName": "__repository__",
            "jobName": "replies_job"}}})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]["runId"]

    def terminate(self, run_id: str) -> None:
        result = self.query("""mutation($runId: String!) { terminateRun(runId: $runId) {
            __typename ... on TerminateRunFailure { message } ... on PythonError { message } } }""",
                            {"runId": run_id})["terminateRun"]
        assert result["__typename"] == "TerminateRunSuccess", result

    def status(self, run_id: str) -> str:
        return self.query("""query($runId: ID!) { runOrError(runId: $runId) {
            ... on Run { status } } }""", {"runId": run_id})["runOrError"]["status"]

    def messages(self, run_id: str) -> list[str]:
        data = self.query("""query($runId: ID!) { logsForRun(runId: $runId) {
            ... on EventConnection { events { ... on MessageEvent { message } } } } }""",
                          {"runId": run_id})
        return [e.get("message") or "" for e in data["logsForRun"]["events"]]

    def wait_for_status(self, run_id: str, statuses: set[str], timeout_s: float) -> str:
        wait_until(lambda: self.status(run_id) in statuses, timeout_s,
                   f"run {run_id} to reach {statuses}\n{self.tail()}")
        return self.status(run_id)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._sink.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_terminate_run_through_dagster_dev_cancels_within_10_s_and_loses_no_answer(tmp_path):
    with SimulatedEndpoint(latency_s=1.0, process=True) as sim:
        dev = DagsterDev(tmp_path, sim.base_url)
        try:
            dev.wait_until_loaded()
            run_id = dev.launch()
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

            rerun = dev.launch()
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
