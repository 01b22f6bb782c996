"""Client-side bounds on the ledger's database server: TCP bounds as libpq parameters (the
URL's own win) and a deadline on every round trip, checked against the real PostgreSQL."""

from __future__ import annotations

import time
import traceback

import pytest
import sqlalchemy as sa

from dagster_batchllm.core.ledger.db_timeouts import libpq_connect_args, round_trips_at_most
from dagster_batchllm.core.ledger.table import Ledger


def test_libpq_drivers_get_tcp_bounds_and_a_value_in_the_url_wins():
    bounds = libpq_connect_args(sa.engine.make_url("postgresql+psycopg://u@db:5432/x"))
    assert bounds["connect_timeout"] == 10 and bounds["keepalives"] == 1
    assert bounds["tcp_user_timeout"] == 30_000  # the bundled libpq is newer than 12
    own = libpq_connect_args(sa.engine.make_url(
        "postgresql+psycopg://u@db/x?connect_timeout=3&keepalives_idle=60"))
    assert "connect_timeout" not in own and "keepalives_idle" not in own  # the URL's are used
    assert libpq_connect_args(sa.engine.make_url("sqlite:///l.db")) == {}
    assert libpq_connect_args(sa.engine.make_url("postgresql+pg8000://u@db/x")) == {}


@pytest.mark.postgres
def test_a_ledger_connection_carries_the_tcp_bounds(postgres_url):
    ledger = Ledger(postgres_url, "bounds_check")
    try:
        with ledger.engine.connect() as conn:
            parameters = conn.connection.dbapi_connection.info.get_parameters()
        assert parameters["keepalives"] == "1" and parameters["tcp_user_timeout"] == "30000"
        assert parameters["connect_timeout"] == "10"
    finally:
        with ledger.engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS bounds_check"))
        ledger.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_statement_left_unanswered_past_the_deadline_fails_and_the_next_one_works(
        postgres_url):
    ledger = Ledger(postgres_url, "deadline_check", statement_timeout_s=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError) as info, ledger.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(5)"))  # the server answers after 5 s
        assert time.monotonic() - started < 3
        assert info.value.connection_invalidated  # a lost connection: the writer retries it
        assert "got no answer within 0.5 s" in "".join(
            traceback.format_exception(info.value.orig))
        with ledger.engine.connect() as conn:  # a new connection, with its own deadline
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        with ledger.engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS deadline_check"))
        ledger.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_stopping_run_caps_the_deadline_of_its_own_thread(postgres_url):
    ledger = Ledger(postgres_url, "deadline_cap_check")  # the default deadline: 30 s
    try:
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError), round_trips_at_most(0.5), \
                ledger.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(5)"))
        assert time.monotonic() - started < 3
    finally:
        with ledger.engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS deadline_cap_check"))
        ledger.dispose()
