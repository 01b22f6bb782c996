"""The ledger's writes on a real SQLite file: records as a run writes them (every field, sent
to the driver as tuples) and records with fields left out (their defaults), the same rules."""

from __future__ import annotations

import sqlalchemy as sa

from dagster_batchllm.core.ledger.table import Ledger


def record(key: str, status: str, response: str | None = None, **fields) -> dict:
    return {"request_key": key, "scope": "", "partition_key": "p", "model": "m",
            "status": status, "response": response, "error": None, "error_type": None,
            "prompt_tokens": 3, "completion_tokens": 1, "attempts": 1, "endpoint": "sim",
            "latency_ms": 12.5, "run_id": "r1", **fields}


def test_an_ok_record_is_never_overwritten_by_a_worse_status(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        ledger.upsert([record("a", "ok", "first"), record("b", "failed")])
        ledger.upsert([record("a", "failed"), record("b", "ok", "fixed"),
                       record("c", "deferred")])
        ledger.upsert([record("a", "ok", "again")])
        rows = ledger.records().set_index("request_key")
        assert rows.loc["a", "response"] == "again" and rows.loc["a", "status"] == "ok"
        assert rows.loc["b", "status"] == "ok" and rows.loc["b", "response"] == "fixed"
        assert rows.loc["c", "status"] == "deferred"
        assert rows.loc["a", "latency_ms"] == 12.5 and rows.loc["a", "run_id"] == "r1"
        assert (rows["created_at"] <= rows["updated_at"]).all()
        assert set(ledger.lookup_ok(["a", "b", "c"], "p")) == {"a", "b"}
    finally:
        ledger.dispose()


def test_a_record_without_some_fields_gets_their_defaults(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        ledger.upsert([{"request_key": "k", "model": "m", "status": "ok", "response": "x"}])
        (row,) = ledger.records().to_dict("records")
        assert (row["scope"], row["partition_key"], row["attempts"]) == ("", "", 0)
        assert ledger.lookup_ok(["k"])["k"]["response"] == "x"
    finally:
        ledger.dispose()


def test_a_new_sqlite_ledger_uses_pages_that_hold_several_vectors(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 8192
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        ledger.dispose()
    # An existing file keeps its pages (and its records).
    other = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{other}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE unrelated (x INTEGER)")
    engine.dispose()
    ledger = Ledger(f"sqlite:///{other}")
    try:
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 4096
        ledger.upsert([record("a", "ok", "v")])
        assert set(ledger.lookup_ok(["a"], "p")) == {"a"}
    finally:
        ledger.dispose()


def test_records_written_in_key_order_keep_their_order_within_a_key(tmp_path):
    """A write sorts its records by key (neighbours share B-tree pages); two records of one
    key in one write still apply in the order given, on both write paths."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        ledger.upsert([record("z", "failed"), record("a", "deferred"), record("z", "ok", "won"),
                       record("m", "ok", "m1"), record("a", "failed", error="second")])
        ledger.upsert([{"request_key": "y", "model": "m", "status": "failed", "response": None},
                       {"request_key": "b", "model": "m", "status": "ok", "response": "b"},
                       {"request_key": "y", "model": "m", "status": "ok", "response": "y2"}])
        rows = ledger.records().set_index("request_key")
        assert rows.loc["z", "status"] == "ok" and rows.loc["z", "response"] == "won"
        assert rows.loc["a", "status"] == "failed" and rows.loc["a", "error"] == "second"
        assert rows.loc["y", "response"] == "y2" and rows.loc["b", "response"] == "b"
        assert len(rows) == 5
    finally:
        ledger.dispose()


def test_a_write_whose_records_share_their_partition_writes_what_the_others_write(tmp_path):
    """A write of records that share scope, partition, model, status and attempt (a batch
    pass's) names those once in its SQL: the same records, quotes in names included, and the
    same rule that an ok record is never overwritten."""
    shared, one_by_one = (Ledger(f"sqlite:///{tmp_path / name}") for name in ("a.db", "b.db"))
    try:
        fields = {"scope": "it's \"quoted\"", "partition_key": "2026-12-01; DROP TABLE x",
                  "run_id": None, "latency_ms": 1.25}
        ok = [record(f"k{i:03d}", "ok", f"answer {i}", **fields) for i in range(100)]
        worse = [record(f"k{i:03d}", "failed", error="timeout: no", error_type="timeout",
                        **fields) for i in range(50, 150)]
        assert shared._shared_rows(ok, 0.0) is not None  # the statement this is about
        shared.upsert(ok)
        shared.upsert(worse)
        for row in ok + worse:  # one record per write: never the shared statement
            one_by_one.upsert([row])
        columns = ["request_key", "scope", "partition_key", "model", "status", "response",
                   "error", "error_type", "prompt_tokens", "completion_tokens", "attempts",
                   "endpoint", "latency_ms", "run_id"]
        a, b = (ledger.records()[columns].sort_values("request_key").reset_index(drop=True)
                for ledger in (shared, one_by_one))
        assert len(a) == 150 and a.equals(b)
        assert (a["status"][:100] == "ok").all() and (a["status"][100:] == "failed").all()
        assert a["scope"].unique().tolist() == [fields["scope"]]
        assert len(shared.lookup_ok([f"k{i:03d}" for i in range(150)], fields["partition_key"],
                                    fields["scope"])) == 100
    finally:
        shared.dispose()
        one_by_one.dispose()
