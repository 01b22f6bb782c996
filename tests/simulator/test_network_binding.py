"""Every server the project starts listens on 127.0.0.1 unless told otherwise.

Checked on the listening socket itself, read from the kernel's table (/proc/net/tcp and tcp6),
so what counts is the address really bound, not the URL the server advertises.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from dagster_batchllm.testing import SimulatedEndpoint

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(),
                                reason="needs Linux's /proc/net/tcp")

REPO = Path(__file__).resolve().parents[2]
_LISTEN = "0A"


def _decode(ip_hex: str) -> str:
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # tcp6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (any process on this host)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            ip_hex, port_hex = fields[1].split(":")
            if fields[3] == _LISTEN and int(port_hex, 16) == port:
                found.add(_decode(ip_hex))
    return found


def assert_loopback_only(base_url: str) -> None:
    url = urlparse(base_url)
    assert url.hostname == "127.0.0.1", base_url
    assert listening_addresses(url.port) == {"127.0.0.1"}


def test_the_socket_table_reader_sees_a_wildcard_listener():
    """The check can fail: a socket bound to all interfaces shows up as 0.0.0.0."""
    with socket.socket() as wildcard, socket.socket() as loopback:
        wildcard.bind(("0.0.0.0", 0))
        wildcard.listen()
        loopback.bind(("127.0.0.1", 0))
        loopback.listen()
        assert listening_addresses(wildcard.getsockname()[1]) == {"0.0.0.0"}
        assert listening_addresses(loopback.getsockname()[1]) == {"127.0.0.1"}


@pytest.mark.slow
@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_simulated_endpoint_binds_loopback_by_default_also_after_restart(process):
    assert inspect.signature(SimulatedEndpoint).parameters["host"].default == "127.0.0.1"
    with SimulatedEndpoint(process=process) as sim:
        assert_loopback_only(sim.base_url)
        sim.restart()
        assert_loopback_only(sim.base_url)


@pytest.mark.slow
def test_simulated_endpoint_command_line_binds_loopback_by_default():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dagster_batchllm.simulator", "--port", "0"],
                            stdout=subprocess.PIPE, env=env)
    try:
        base_url = proc.stdout.readline().decode().strip()
        assert_loopback_only(base_url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_embedded_local_endpoint_binds_loopback_by_default(process):
    from dagster_batchllm.managed.classical import start_local_endpoint

    assert inspect.signature(start_local_endpoint).parameters["host"].default == "127.0.0.1"
    endpoint = start_local_endpoint(process=process)
    try:
        assert_loopback_only(endpoint.base_url)
    finally:
        endpoint.stop()


def test_managed_endpoint_started_by_the_resource_binds_loopback(tmp_path):
    from dagster_batchllm import BatchInferenceResource, ManagedEndpoint

    resource = BatchInferenceResource(managed_endpoints=[ManagedEndpoint(name="embedded")],
                                      store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        (spec,) = resource.client.settings.endpoints
        assert_loopback_only(spec.base_url)
    finally:
        resource.close()


def test_example_resources_default_to_the_embedded_loopback_endpoint(monkeypatch, tmp_path):
    """With no BATCHLLM_ENDPOINTS the example talks to its own endpoint on 127.0.0.1 only."""
    from resources import build_llm_resource

    monkeypatch.delenv("BATCHLLM_ENDPOINTS", raising=False)
    monkeypatch.setenv("BATCHLLM_STORE_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    resource = build_llm_resource()
    try:
        assert not resource.endpoints and resource.managed_endpoints
        for spec in resource.client.settings.endpoints:
            assert_loopback_only(spec.base_url)
    finally:
        resource.close()
