"""The example code location loads: ``dagster definitions validate`` on the workspace, and the
webserver starts on 127.0.0.1 and lists the pipeline's assets and sensors over GraphQL."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagster_batchllm.testing import stop_process

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PIPELINE = {"call_center_transcripts", "cleaned_transcripts", "transcript_summaries",
            "classified_transcripts"}
SENSORS = {"transcript_summaries_retry_partitions", "classified_transcripts_retry_partitions",
           "call_center_pipeline_new_data"}


@pytest.fixture
def location_env(tmp_path):
    """The example's configuration, pointed into tmp_path so nothing lands in the repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLLM_")}
    env["BATCHLLM_WAREHOUSE_URL"] = f"sqlite:///{tmp_path / 'warehouse.db'}"
    env["BATCHLLM_STORE_URL"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    return env


@pytest.mark.timeout(120)
def test_definitions_validate_on_the_workspace(location_env, tmp_path):
    completed = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT, env=location_env, capture_output=True, text=True, timeout=110,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "All code locations passed validation" in output
    # Loading definitions touches no database: the tables appear on the first run.
    assert not (tmp_path / "warehouse.db").exists() and not (tmp_path / "ledger.db").exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    # http.client rather than urllib: urllib would send 127.0.0.1 through an HTTP(S)_PROXY.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=json.dumps(body) if body else None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _graphql(port: int, query: str) -> dict:
    status, body = _request(port, "POST", "/graphql", {"query": query})
    assert status == 200, body[:500]
    payload = json.loads(body)
    assert "errors" not in payload, payload["errors"]
    return payload["data"]


@pytest.mark.timeout(120)
def test_webserver_serves_the_pipeline_over_graphql(location_env, tmp_path):
    port = _free_port()
    log = tmp_path / "webserver.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
             "-p", str(port)],
            cwd=REPO_ROOT, env=location_env, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                assert server.poll() is None, log.read_text()[-3000:]
                try:
                    if _request(port, "GET", "/server_info")[0] == 200:
                        break
                except OSError:
                    pass  # not listening yet
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.25)

            nodes = _graphql(port, "{ assetNodes { assetKey { path } groupName } }")
            groups = {"/".join(n["assetKey"]["path"]): n["groupName"]
                      for n in nodes["assetNodes"]}
            assert set(groups) >= PIPELINE
            assert {groups[name] for name in PIPELINE} == {"call_center"}

            # The inference assets say which servers answer (the embedded default here, not
            # OpenAI), which model, and what the cost figures rest on.
            described = _graphql(port, """{ assetNodes(assetKeys: [
                {path: ["transcript_summaries"]}, {path: ["classified_transcripts"]}]) {
                kinds description } }""")
            for node in described["assetNodes"]:
                assert set(node["kinds"]) == {"batchllm", "pandas"}
                assert "default_model, `local`" in node["description"]
                assert "priced at $0 per token" in node["description"]

            repositories = _graphql(port, """{ repositoriesOrError { ... on RepositoryConnection {
                nodes { sensors { name } schedules { name } } } } }""")
            [repository] = repositories["repositoriesOrError"]["nodes"]
            assert {s["name"] for s in repository["sensors"]} >= SENSORS
            assert repository["schedules"]
        finally:
            stop_process(server, timeout=30)
