"""Client-side bounds on a database server (the ledger's, when it is not a SQLite file).

libpq waits for an answer as long as its connection is open, and a connection can stay open
with nothing behind it: a network cut that drops packets without a reset, a NAT or firewall
that forgot the connection, a hung server or proxy. A run whose ledger write waits there waits
forever. Two bounds close that:

* TCP's own, set as libpq connection parameters (a value in the URL's query wins):
  ``connect_timeout``, keepalives (a silent peer is found in ~25 s while a reply is awaited)
  and ``tcp_user_timeout`` (sent data unacknowledged for 30 s ends the connection);
* a deadline on each round trip (execute, commit, rollback, the pool's ping): a statement the
  server has not answered within ``timeout_s`` has its connection shut down, so the driver
  fails it as a lost connection, which the ledger writer waits out and retries on a new one.
  This also covers the case TCP cannot see: a peer that acknowledges every byte and answers
  none (a hung middlebox, or the test proxy's ``freeze``).

Server-side timeouts (``statement_timeout``, ``idle_in_transaction_session_timeout``) are left
to the database's configuration: set at connect time as ``options`` they break PgBouncer.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

log = logging.getLogger("dagster_batchllm")

# Seconds a ledger statement may go unanswered before its connection is given up.
DEFAULT_ROUND_TRIP_TIMEOUT_S = 30.0
_LIBPQ_DRIVERS = ("psycopg", "psycopg2", "psycopg2cffi")
_TCP_BOUNDS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
_TCP_USER_TIMEOUT_MS = 30_000  # libpq 12 and later
# The dialect's methods that wait for the server; each gets the deadline.
_CURSOR_ROUND_TRIPS = ("do_execute", "do_executemany", "do_execute_no_params")
_CONNECTION_ROUND_TRIPS = ("do_commit", "do_rollback", "do_ping")


def libpq_connect_args(url: sa.engine.URL) -> dict[str, Any]:
    """The TCP bounds for a libpq driver (none for other drivers), less those the URL sets."""
    if url.get_backend_name() != "postgresql" or url.get_driver_name() not in _LIBPQ_DRIVERS:
        return {}
    bounds: dict[str, Any] = dict(_TCP_BOUNDS)
    if _libpq_version(url.get_driver_name()) >= 120000:
        bounds["tcp_user_timeout"] = _TCP_USER_TIMEOUT_MS
    return {k: v for k, v in bounds.items() if k not in url.query}


def _libpq_version(driver: str) -> int:
    try:
        if driver == "psycopg":
            import psycopg

            return int(psycopg.pq.version())
        import psycopg2

        return int(psycopg2.__libpq_version__)
    except Exception:  # unknown: leave out what an old libpq would refuse
        return 0


class _Watchdog:
    """One thread for the process that shuts down the sockets of round trips past their
    deadline. Arming and firing share a lock, so a socket is only ever shut down while its
    round trip is still running (its descriptor is then certainly the connection's)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (deadline, socket fd)
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, token)
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, fd: int, timeout_s: float, what: str) -> Iterator[None]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (deadline, fd)
            heapq.heappush(self._deadlines, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batchllm-db-deadline",
                                                daemon=True)
                self._thread.start()
            if self._deadlines[0][1] == token:  # the earliest now: the watchdog sleeps less
                self._lock.notify()
        fired = False
        try:
            yield
        except Exception as exc:
            with self._lock:
                fired = token not in self._armed
            if fired:
                exc.add_note(f"batchllm: {what} got no answer within {timeout_s:g} s, so its "
                             "connection was closed")
            raise
        finally:
            with self._lock:
                self._armed.pop(token, None)

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, token = heapq.heappop(self._deadlines)
                    armed = self._armed.pop(token, None)
                    if armed is not None:
                        _shut_down(armed[1])
                # Drop the heap entries of round trips that ended, then sleep to the next one.
                while self._deadlines and self._deadlines[0][1] not in self._armed:
                    heapq.heappop(self._deadlines)
                self._lock.wait(self._deadlines[0][0] - now if self._deadlines else None)


def _shut_down(fd: int) -> None:
    log.warning("batchllm: the ledger database has not answered a statement within its "
                "deadline; closing that connection (the statement fails and is retried on a "
                "new one)")
    # fromfd duplicates the descriptor; shutting the duplicate down ends the connection for the
    # driver too (which closes its own descriptor later).
    with contextlib.suppress(OSError), socket.fromfd(fd, socket.AF_INET,
                                                     socket.SOCK_STREAM) as sock:
        sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()
_THIS_THREAD = threading.local()  # .cap: a shorter deadline for this thread's round trips


@contextlib.contextmanager
def round_trips_at_most(timeout_s: float | None) -> Iterator[None]:
    """Round trips made on this thread inside the block get at most ``timeout_s`` (a stopping
    run's last write must not wait the whole deadline); None changes nothing."""
    if timeout_s is None:
        yield
        return
    previous = getattr(_THIS_THREAD, "cap", None)
    _THIS_THREAD.cap = timeout_s if previous is None else min(previous, timeout_s)
    try:
        yield
    finally:
        _THIS_THREAD.cap = previous


def bound_round_trips(engine: sa.Engine, timeout_s: float) -> None:
    """Give every round trip ``engine``'s dialect makes a deadline of ``timeout_s``
    (drivers whose connections have no socket descriptor, ``fileno()``, are left as they are)."""
    dialect = engine.dialect
    where = engine.url.render_as_string(hide_password=True)
    for name in _CURSOR_ROUND_TRIPS:
        setattr(dialect, name, _bounded(getattr(dialect, name),
                                        lambda cursor, *_: cursor.connection, timeout_s,
                                        f"a statement to {where}"))
    for name in _CONNECTION_ROUND_TRIPS:
        setattr(dialect, name, _bounded(getattr(dialect, name), lambda conn, *_: conn,
                                        timeout_s, f"a {name[3:]} on {where}"))


def _bounded(method: Callable, connection_of: Callable, timeout_s: float,
             what: str) -> Callable:
    def bounded(first: Any, *args: Any, **kwargs: Any) -> Any:
        fd = _fileno(connection_of(first))
        if fd is None:
            return method(first, *args, **kwargs)
        cap = getattr(_THIS_THREAD, "cap", None)
        with _WATCHDOG.guard(fd, timeout_s if cap is None else min(cap, timeout_s), what):
            return method(first, *args, **kwargs)

    return bounded


def _fileno(dbapi_connection: Any) -> int | None:
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # no such method, or the connection is closed
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None
