"""The example warehouse, as several step processes open it: the shipped calls are loaded once
into a fresh warehouse however many processes seed it at once (each step process sets the
resource up; two of them loaded every call twice, and every table after it doubled)."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pandas as pd

from resources.warehouse import DATASET, SOURCE_TABLE, WarehouseResource


def _open(url: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    WarehouseResource(url=url).engine  # noqa: B018 - opening seeds a missing source table


def test_processes_seeding_a_fresh_warehouse_at_once_load_the_calls_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    openers = [context.Process(target=_open, args=(url, start)) for _ in range(4)]
    for opener in openers:
        opener.start()
    start.set()
    for opener in openers:
        opener.join(120)
        assert opener.exitcode == 0
    with sqlite3.connect(tmp_path / "warehouse.db") as con:
        loaded = con.execute(
            f"SELECT COUNT(*), COUNT(DISTINCT call_id) FROM {SOURCE_TABLE}").fetchone()
    shipped = len(pd.read_csv(DATASET))
    assert loaded == (shipped, shipped)
