"""How the chaos scenarios run ``infer``: on a thread of this process while the scenario breaks
things, or in worker processes (``python -m dagster_batchllm.testing.chaos '<job json>'``) that
it kills and starts again; and what they read from the ledger database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ...core import InferenceClient, InferenceSettings
from .data import make_frame
from .fleet import SCALES, Fleet, client_options, fleet_specs, infer, measured, tally
from .outcome import Outcome

POSTGRES_URL = os.environ.get(
    "BATCHLLM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


class Background:
    """Run ``infer`` on a thread while the scenario breaks things from this one."""

    def __init__(self, fn: Callable[[], object]):
        self.result = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether the call has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("infer() did not finish in time")
        if self.error is not None:
            raise self.error
        return self.result


def wait_until(condition: Callable[[], bool], timeout: float, poll_s: float = 0.05) -> bool:
    """Poll ``condition()`` for up to ``timeout`` seconds; whether it came true (no error:
    a scenario that does not get there records a problem and goes on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


def run_in_process(outcome: Outcome, fleet: Fleet, df, during: Callable[[Background], None],
                   *, structured: bool = False, timeout_s: float = 300.0, **infer_kwargs):
    """Infer ``df`` on a thread, let ``during`` break things meanwhile, then measure it all."""
    client = InferenceClient(fleet.settings(store_url=None))
    with measured(outcome, fleet):
        try:
            job = Background(lambda: infer(client, df, structured=structured, **infer_kwargs))
            try:
                during(job)
                result = job.join(timeout_s)
            finally:
                fleet.configure(latency_s=0.0)  # a stalled job must not hold the stop below
        finally:
            client.close()
    tally(outcome, fleet.scale, [(df, result.df)], structured=structured)
    return result


# -- inferring subprocesses ------------------------------------------------------------------

def start_worker(job: dict) -> subprocess.Popen:
    """A worker process running ``run_worker(job)``."""
    return subprocess.Popen([sys.executable, "-m", __package__, json.dumps(job)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def worker_result(proc: subprocess.Popen, job: dict, timeout_s: float = 300.0):
    """Wait for a worker; its output table, or None (with its stderr as the reason)."""
    import pandas as pd

    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if proc.returncode != 0:
        return None, (err or b"").decode(errors="replace")[-2000:]
    return pd.read_pickle(job["out"]), ""


def run_worker(job: dict) -> None:
    """The inferring process of the scenarios with workers: one ``infer`` call over one
    partition.

    ``job``: scale (name), fleet (``Fleet.describe()``), store_url, ledger_table, rows, offset
    and seed (of ``make_frame``), partition, out (where the output columns are pickled).
    """
    scale = SCALES[job["scale"]]
    settings = InferenceSettings(
        endpoints=fleet_specs(job["fleet"]),
        **{**client_options(scale, job["store_url"]), "ledger_table": job["ledger_table"]},
    )
    df = make_frame(job["rows"], offset=job["offset"], seed=job["seed"])
    with InferenceClient(settings) as client:
        result = infer(client, df, partition_key=job["partition"], run_id=job["partition"])
    tmp = job["out"] + ".tmp"
    result.df[["summary", "summary_error"]].to_pickle(tmp)
    os.replace(tmp, job["out"])


# -- the ledger database ---------------------------------------------------------------------

def ledger_counts(store_url: str, table: str) -> dict[tuple[str, str], int]:
    """(partition, status) -> records, read straight from the ledger database."""
    import sqlalchemy as sa

    from ...core import StoreLocation, validate_identifier

    engine = sa.create_engine(StoreLocation.of(store_url).url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                f"SELECT partition_key, status, COUNT(*) FROM {validate_identifier(table)} "
                "GROUP BY partition_key, status")).all()
    finally:
        engine.dispose()
    return {(p, st): int(c) for p, st, c in rows}


def postgres_unavailable() -> str | None:
    """Why the PostgreSQL server at ``POSTGRES_URL`` cannot be used, or None."""
    try:
        import psycopg  # noqa: F401
        import sqlalchemy as sa
    except ImportError:
        return "psycopg is not installed"
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # any failure to connect: no server here
        return f"PostgreSQL not reachable ({type(exc).__name__})"
    finally:
        engine.dispose()
    return None


def drop_tables(store_url: str, tables: list[str]) -> None:
    import sqlalchemy as sa

    from ...core import StoreLocation, validate_identifier

    engine = sa.create_engine(StoreLocation.of(store_url).url)
    try:
        with engine.begin() as conn:
            for name in tables:
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {validate_identifier(name)}"))
    finally:
        engine.dispose()
