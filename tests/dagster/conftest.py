"""A Dagster instance per test."""

from __future__ import annotations

import dagster as dg
import pytest


@pytest.fixture
def instance(tmp_path):
    # In-memory run and event storage (a SQLite-backed instance costs ~50 ms per event); the
    # IO manager still stores outputs under tmp_path, so reruns load their inputs.
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    yield instance
    instance.dispose()
