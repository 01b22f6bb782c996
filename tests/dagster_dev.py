"""A real ``dagster dev`` on 127.0.0.1 over a code location written for the test, and a client
for the webserver's own GraphQL API: what the UI and the tests that stand in for it talk to."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dagster_batchllm.testing import wait_until

BIN = Path(sys.executable).parent


class DagsterDev:
    def __init__(self, root: Path, *, location_name: str, location_code: str,
                 env: dict[str, str]):
        """``location_code`` is written to ``root/location.py``; ``env`` is added to this
        process's environment less its ``BATCHLLM_*`` variables."""
        self.root = root
        self.location_name = location_name
        self.port = _free_port()
        self.log = root / "dagster_dev.log"
        home = root / "home"
        home.mkdir()
        # Runs start at once (no queue to wait on); the daemon still runs backfills.
        (home / "dagster.yaml").write_text(
            "run_coordinator:\n  module: dagster._core.run_coordinator\n"
            "  class: DefaultRunCoordinator\ntelemetry:\n  enabled: false\n")
        (root / "location.py").write_text(location_code)
        (root / "workspace.yaml").write_text(
            f"load_from:\n  - python_file:\n      relative_path: location.py\n"
            f"      working_directory: {root}\n      location_name: {location_name}\n")
        environment = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
        environment.update(DAGSTER_HOME=str(home), **env)
        self._sink = self.log.open("wb")
        self.process = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-w", str(root / "workspace.yaml"), "-h", "127.0.0.1",
             "-p", str(self.port)],
            cwd=root, env=environment, stdout=self._sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # its webserver, daemon and code server stop with it
        )

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
        """Until the location has loaded, and loaded without an error."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, self.tail()
            try:
                data = self.query("{ workspaceOrError { ... on Workspace { locationEntries { "
                                  "name loadStatus locationOrLoadError { __typename } } } } }")
                [entry] = data["workspaceOrError"]["locationEntries"]
                if entry["loadStatus"] == "LOADED":
                    assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", (
                        self.tail())
                    return
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.5)

    def launch(self, job_name: str) -> str:
        """Launch ``job_name`` of the location, as the UI's Launch button does; its run id."""
        launched = self.query("""mutation($params: ExecutionParams!) {
            launchRun(executionParams: $params) {
              __typename ... on LaunchRunSuccess { run { runId } }
              ... on PythonError { message } } }""", {"params": {"selector": {
            "repositoryLocationName": self.location_name, "repositoryName": "__repository__",
            "jobName": job_name}}})["launchRun"]
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
