"""The example code location loads: ``dagster definitions validate`` on the workspace, and the
webserver starts on 127.0.0.1 and lists the pipeline's assets and sensors over GraphQL; after
``run_example.py``, ``dagster dev`` shows its runs (one instance for both, ./dagster.yaml)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
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
            _wait_for_server(port, server, log, timeout_s=90)

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


EXAMPLE_FILES = ("run_example.py", "definitions.py", "workspace.yaml", "dagster.yaml")
EXAMPLE_FOLDERS = ("assets", "resources")
DAY = "2026-11-05"  # the day run_example.py materializes


@pytest.mark.timeout(240)
def test_dagster_dev_shows_what_run_example_just_materialized(tmp_path):
    """The README's two commands, as a user runs them on a fresh clone (no DAGSTER_HOME): the
    UI that ``dagster dev -w workspace.yaml`` opens lists the runs and the materializations of
    ``run_example.py`` (both read ./dagster.yaml, whose storage is data/dagster_home)."""
    for name in EXAMPLE_FILES:
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    for folder in EXAMPLE_FOLDERS:
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BATCHLLM_") and k != "DAGSTER_HOME"}
    example = subprocess.run([sys.executable, "run_example.py"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=150)
    assert example.returncode == 0, (example.stdout[-2000:], example.stderr[-4000:])
    assert (tmp_path / "data" / "dagster_home" / "history" / "runs.db").exists()

    port = _free_port()
    log = tmp_path / "dagster_dev.log"
    with log.open("wb") as sink:
        dev = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
             "-p", str(port)],
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # its webserver, daemon and code server stop with it
        )
        try:
            _wait_for_server(port, dev, log)
            runs = _graphql(port, "{ runsOrError { ... on Runs { results { status } } } }")
            assert [r["status"] for r in runs["runsOrError"]["results"]] == ["SUCCESS"]
            nodes = _graphql(port, """{ assetNodes(assetKeys: [
                {path: ["cleaned_transcripts"]}, {path: ["transcript_summaries"]},
                {path: ["classified_transcripts"]}]) {
                assetKey { path } partitionStats { numMaterialized }
                assetMaterializations(partitions: """ + json.dumps([DAY]) + ") { partition } } }")
            by_asset = {"/".join(n["assetKey"]["path"]): n for n in nodes["assetNodes"]}
            assert set(by_asset) == PIPELINE - {"call_center_transcripts"}
            for node in by_asset.values():
                assert node["partitionStats"]["numMaterialized"] == 1
                assert [m["partition"] for m in node["assetMaterializations"]] == [DAY]
        finally:
            _stop_session(dev)


def _wait_for_server(port: int, server: subprocess.Popen, log: Path,
                     timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if _request(port, "GET", "/server_info")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.25)


def _stop_session(process: subprocess.Popen) -> None:
    """Stop ``dagster dev`` and what it started (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
