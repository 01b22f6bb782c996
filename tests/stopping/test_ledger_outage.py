"""The ledger database going away mid-run (a PostgreSQL restart, a network cut): the run
pauses, retries its writes, and once the database is back writes every answer once."""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid

import pandas as pd
import pytest
import sqlalchemy as sa

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint
from tests.stopping.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.postgres

ROWS = 1200


@pytest.mark.timeout(120)
@pytest.mark.xfail(strict=False, reason="open: in about 1 run of 4 the run stays waiting on its "
                   "event loop after the database is back (passes otherwise); being investigated")
def test_a_15_s_cut_of_the_ledger_database_loses_no_row_and_pays_nothing_twice(postgres_url):
    url = sa.engine.make_url(postgres_url)
    proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432))
    table = f"outage_{uuid.uuid4().hex[:10]}"
    store_url = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        with SimulatedEndpoint(latency_s=0.02, process=True) as sim:
            settings = InferenceSettings(
                endpoints=(EndpointSpec(name="e", base_url=sim.base_url, models=("sim-model",),
                                        max_concurrency=16),),
                store_url=store_url, ledger_table=table, ledger_flush_interval_s=0.1,
                progress_interval_s=3600.0, coordination_interval_s=0.25)
            df = pd.DataFrame({"t": [f"outage row {i}" for i in range(ROWS)]})
            outcome: dict = {}

            def run() -> None:
                with InferenceClient(settings) as client:
                    try:
                        outcome["result"] = client.infer(df, prompt="{t}", output_column="o")
                        outcome["counts"] = client.ledger.status_counts()
                    except BaseException as exc:  # asserted below
                        outcome["error"] = exc

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            deadline = time.monotonic() + 60
            while sim.stats(log=False)["ok"] < ROWS // 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            proxy.cut()
            cut_at = sim.stats(log=False)["ok"]
            time.sleep(15)
            during = sim.stats(log=False)["ok"]
            proxy.restore()
            thread.join(60)
            assert not thread.is_alive(), "the run did not finish after the database came " \
                "back:\n" + "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
            stats = sim.stats(log=False)
        assert "error" not in outcome, "".join(
            traceback.format_exception(outcome["error"]))[-4000:]
        result = outcome["result"]
        assert proxy.refused > 0  # the run really tried the database while it was away
        assert during - cut_at <= 16 + settings.ledger_flush_rows  # it paused: no answer to keep
        assert result.stats.succeeded == ROWS and result.stats.failed == 0
        assert result.df["o"].tolist() == [f"[sim] {t}" for t in df["t"]]
        assert outcome["counts"]["ok"] == ROWS  # 0 rows lost
        assert stats["duplicates"] == 0 and stats["ok"] == ROWS  # 0 paid twice
    finally:
        proxy.close()
        engine = sa.create_engine(postgres_url)
        with engine.begin() as conn:
            for name in (table, f"{table}_claims", f"{table}_holders", f"{table}_runs"):
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()
