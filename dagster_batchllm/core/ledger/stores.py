"""Opening a store: SQLAlchemy URLs, the engines that several processes can share, and the
SQL identifiers a user names (tables, schemas).

SQLite gets WAL mode, a busy timeout and ``BEGIN IMMEDIATE`` writes so several processes can share
one file; a database server's round trips get bounds (see :mod:`.db_timeouts`). A SQLite file's
identity (device and inode) is noted when the engine first connects, so a run can tell that
the file was deleted or replaced under it (:func:`check_ledger_file`): an open connection keeps
writing to the deleted file, and every write "succeeds".
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import re
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import InferenceConfigError, LedgerVanishedError
from .db_timeouts import DEFAULT_ROUND_TRIP_TIMEOUT_S, bound_round_trips, libpq_connect_args

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_identifier(name: str, what: str = "identifier") -> str:
    """Refuse anything but a plain SQL identifier (optionally ``schema.name``)."""
    parts = name.split(".") if isinstance(name, str) else [None]
    if len(parts) > 2 or not all(isinstance(p, str) and _IDENTIFIER.fullmatch(p) for p in parts):
        raise InferenceConfigError(
            f"{what} {name!r} is not a plain SQL identifier: use letters, digits and underscores "
            "(optionally schema.name), starting with a letter or underscore."
        )
    return name


def normalize_store_url(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; use psycopg 3 when only it is installed."""
    if (url.startswith(("postgresql://", "postgres://"))
            and importlib.util.find_spec("psycopg2") is None
            and importlib.util.find_spec("psycopg")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def redact_url(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparseable URL is reported by create_engine; never echo it whole
        return "<unparseable store_url>"


@dataclass(frozen=True)
class StoreLocation:
    """Where a store URL keeps its tables, read without connecting: what a process that did not
    open the store (a sensor, a Spark driver) checks before it relies on reading it."""

    url: str  # as SQLAlchemy is given it (see normalize_store_url)
    sqlite_file: str | None  # the path of a SQLite file; None for memory or a database server
    in_memory: bool  # SQLite in memory: it lasts one process, and no other can read it

    @classmethod
    def of(cls, url: str) -> StoreLocation:
        """Raises InferenceConfigError (the URL redacted) where ``url`` is no SQLAlchemy URL."""
        normalized = normalize_store_url(url)
        try:
            parsed = sa.engine.make_url(normalized)
        except sa.exc.ArgumentError:
            raise InferenceConfigError(
                f"{redact_url(url)} is not a SQLAlchemy URL (e.g. sqlite:///path/to/file.db or "
                "postgresql+psycopg://user@host/db).") from None
        if parsed.get_backend_name() != "sqlite":
            return cls(normalized, None, False)
        in_memory = parsed.database in (None, "", ":memory:")
        return cls(normalized, None if in_memory else parsed.database, in_memory)


class _SerialStaticPool(sa.pool.StaticPool):
    """The one connection of an in-memory database, lent to one thread at a time.

    A run looks answers up on one thread while it writes records on another; two transactions
    on one sqlite3 connection fail ("cannot start a transaction within a transaction").
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._serial = threading.RLock()

    def _do_get(self):
        self._serial.acquire()
        try:
            return super()._do_get()
        except BaseException:
            self._serial.release()
            raise

    def _do_return_conn(self, record) -> None:
        super()._do_return_conn(record)
        try:
            self._serial.release()
        except RuntimeError:  # returned by the garbage collector, on another thread
            pass


def make_engine(url: str, *,
                round_trip_timeout_s: float = DEFAULT_ROUND_TRIP_TIMEOUT_S) -> sa.Engine:
    """A SQLAlchemy engine that several processes can share, SQLite files included; a
    database server's round trips get ``round_trip_timeout_s`` (see :mod:`.db_timeouts`)."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InferenceConfigError(f"store_url is not a SQLAlchemy URL: {exc}") from None
    if parsed.get_backend_name() != "sqlite":
        engine = sa.create_engine(url, pool_pre_ping=True, future=True,
                                  connect_args=libpq_connect_args(parsed))
        bound_round_trips(engine, round_trip_timeout_s)
        return engine
    in_memory = parsed.database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 60}}
    if in_memory:
        kwargs["poolclass"] = _SerialStaticPool
    engine = sa.create_engine(url, **kwargs)
    # A "file:" URI (uri=true) names no plain path to look at; it is not watched.
    identity = (None if in_memory or parsed.query.get("uri") else
                _SqliteFileIdentity(parsed.database))
    if identity is not None:
        _SQLITE_FILES[engine] = identity

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        if identity is not None:  # first: before anything reads a write-ahead log there
            identity.connected()
        # Let SQLAlchemy's "begin" event open transactions, so writers can BEGIN IMMEDIATE:
        # a deferred transaction that upgrades to a write lock fails at once under contention
        # instead of waiting for the busy timeout.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=60000")
        if not in_memory:
            # A new file only (a no-op once it holds a table): a record with a 384-dimension
            # vector is ~2.3 kB, so 4 kB pages hold one each; 8 kB pages hold three, and a
            # run's writes cost about a quarter less.
            cursor.execute("PRAGMA page_size=8192")
            _use_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            # Checkpoint the WAL every 64 MB of it rather than 8: a page that many commits of a
            # run change (the B-trees' upper levels) is copied into the file once per
            # checkpoint, so a batch pass spends about 2% less CPU, for a larger -wal file.
            cursor.execute("PRAGMA wal_autocheckpoint=8000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class _SqliteFileIdentity:
    """The (device, inode) of a SQLite ledger file as its engine's first connection opened it."""

    def __init__(self, database: str):
        self.path = os.path.abspath(database)
        self.identity: tuple[int, int] | None = None

    def connected(self) -> None:
        """A connection opened the file just now: the first one says which file it is; a
        later one that opened another file (the first deleted, a new one made at its path)
        is refused before it reads the old file's write-ahead log into the new one."""
        if self.identity is None:
            try:
                st = os.stat(self.path)
            except OSError:  # not a plain path after all: nothing to watch
                return
            self.identity = (st.st_dev, st.st_ino)
        else:
            self.check()

    def check(self) -> None:
        if self.identity is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            how = "was deleted"
        else:
            if (st.st_dev, st.st_ino) == self.identity:
                return
            how = "was deleted or replaced (another file is at its path now)"
        raise LedgerVanishedError(
            f"the SQLite ledger file {self.path} {how} while this client was using it: its "
            "open connections write to the old file, which no other process (and no rerun) "
            "can open, so nothing written there since is kept", path=self.path)


# engine -> its SQLite file, for the engines make_engine made over a file
_SQLITE_FILES: weakref.WeakKeyDictionary[sa.Engine, _SqliteFileIdentity] = (
    weakref.WeakKeyDictionary())


def check_ledger_file(engine: sa.Engine) -> None:
    """Raise :class:`LedgerVanishedError` when ``engine``'s SQLite file is no longer the file
    it opened (deleted, or another file at its path); one ``stat``. Other databases pass."""
    identity = _SQLITE_FILES.get(engine)
    if identity is not None:
        identity.check()


def _use_wal(cursor: Any, wait_s: float = 60.0) -> None:
    """Put the SQLite file in WAL mode (persistent, so once per file in practice).

    Switching needs the file to itself and answers "database is locked" at once instead of
    waiting on the busy timeout, so processes that open a new ledger together (Spark workers)
    retry it for a while; a file already in WAL mode needs no switch.
    """
    give_up = time.monotonic() + wait_s
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > give_up:
                raise
            time.sleep(random.uniform(0.02, 0.1))


__all__ = ["check_ledger_file", "make_engine", "normalize_store_url", "redact_url",
           "validate_identifier"]


def add_missing_columns(engine: sa.Engine, table: sa.Table, columns: dict[str, Any]) -> None:
    """Add to ``table`` those of ``columns`` (name -> SQLAlchemy type, each nullable) it lacks:
    a table made by an earlier version, whose old rows then read NULL ("not known"). Two
    processes opening it at once may both try: an ALTER that fails is fine if the column is
    there now."""
    def missing() -> list[str]:
        have = {c["name"] for c in sa.inspect(engine).get_columns(table.name,
                                                                  schema=table.schema)}
        return [name for name in columns if name not in have]

    quoted = engine.dialect.identifier_preparer.format_table(table)
    for name in missing():
        kind = columns[name]().compile(dialect=engine.dialect)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {name} {kind}")
        except sa.exc.DatabaseError:
            if name in missing():
                raise


def sqlite_literal(value: Any) -> str | None:
    """``value`` as a SQLite literal that reads back as exactly that value, or None: text (with
    its quotes doubled; not with a NUL, which would end it), an integer, a float, NULL."""
    if value is None:
        return "NULL"
    if type(value) is int:
        return str(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    if type(value) is str and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None
