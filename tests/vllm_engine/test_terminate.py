"""A Dagster run whose resource starts its own managed vLLM, terminated through ``dagster
dev``'s GraphQL API (what the UI's Terminate button sends) mid-inference: the run ends CANCELED
and no process of its vLLM is left (the resource's teardown stops the server's group)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dagster_batchllm import Ledger
from dagster_batchllm.testing import wait_until
from tests import dagster_dev

from .conftest import CPU_ARGS, PROXY

pytestmark = pytest.mark.timeout(900)
LOCATION = "batchllm_vllm_terminate_test"

LOCATION_CODE = textwrap.dedent(f'''
    import os

    import dagster as dg
    import pandas as pd

    from dagster_batchllm import BatchInferenceResource, ManagedEndpoint, build_inference_asset


    @dg.asset
    def messages() -> pd.DataFrame:
        return pd.DataFrame({{"text": [f"Tell a story about ticket {{i}}." for i in range(40)]}})


    replies = build_inference_asset(name="replies", source="messages", prompt="{{text}}",
                                    output_column="reply", model="{PROXY}", max_tokens=64)
    defs = dg.Definitions(
        assets=[messages, replies],
        jobs=[dg.define_asset_job("replies_job", selection=["messages", "replies"])],
        resources={{"llm": BatchInferenceResource(
            managed_endpoints=[ManagedEndpoint(kind="vllm", name="vllm-run", model_name="{PROXY}",
                                               max_num_seqs=2, max_model_len=1024,
                                               cpu_kv_cache_gib=1, extra_args={CPU_ARGS!r})],
            store_url=os.environ["LEDGER_URL"], progress_interval_s=3600)}})
''')


class DagsterDev(dagster_dev.DagsterDev):
    def __init__(self, root: Path):
        self.ledger_url = f"sqlite:///{root / 'ledger.db'}"
        super().__init__(root, location_name=LOCATION, location_code=LOCATION_CODE,
                         env={"LEDGER_URL": self.ledger_url})


def vllm_guards() -> set[int]:
    """The process groups of the managed vLLMs running on this machine (their guards' pids)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dagster_batchllm.managed.vllm_server" in argv and b"--guard" in argv:
            found.add(int(entry.name))
    return found


def test_terminating_a_run_stops_its_managed_vllm(tmp_path):
    before = vllm_guards()  # the session's server, if it runs
    dev = DagsterDev(tmp_path)
    try:
        dev.wait_until_loaded()
        run_id = dev.launch("replies_job")
        ledger = Ledger(dev.ledger_url)

        def answered() -> int:
            try:
                return ledger.status_counts().get("ok", 0)
            except Exception:  # the run has not made its ledger yet
                return 0

        ended = {"CANCELED", "FAILURE", "SUCCESS"}
        wait_until(lambda: answered() >= 2 or dev.status(run_id) in ended, 600,
                   f"the run's first answers\n{dev.tail()}")
        assert dev.status(run_id) not in ended, dev.tail()
        started = vllm_guards() - before
        assert started, "the run's vLLM is not running"
        dev.terminate(run_id)
        assert dev.wait_for_status(run_id, {"CANCELED", "FAILURE", "SUCCESS"}, 120) == \
            "CANCELED", dev.tail()
        wait_until(lambda: not (vllm_guards() & started), 60, "the run's vLLM to stop")
        assert answered() < 40  # stopped mid-inference
        ledger.dispose()
    finally:
        dev.stop()
