"""Sharing endpoints between runs: each process takes its share of every endpoint's limits.

Dagster caps concurrent steps, not requests or tokens: a backfill that launches one run per
partition would multiply the load on the endpoints. So every inference run registers itself in a
small table next to the ledger (the database all runs share anyway) and heartbeats; an endpoint
used by N live runs gives each 1/N of its ``max_concurrency``. A run that joins others waits one
heartbeat before sending, so the others have shrunk before it grows; a run that dies simply stops
heartbeating and its share returns to the others after ``stale_after_s``.

Concurrency is claimed like the rate limits below: each run publishes the larger of its requests
in flight and the cap it allows itself, and allows itself its fair share or what the others'
claims leave, whichever is smaller. A run that joins a saturated endpoint therefore starts at
zero and grows only as the others publish smaller claims, so the runs' requests in flight never
add up past ``max_concurrency``, not even while shares change hands.

Rate limits have a memory: what a run sent stays in the server's window for ``window_s``. So
each run also publishes a *claim* on each endpoint's requests and tokens per window: the larger
of what its limiters count now and the limit it allows itself. A run allows itself its fair
share (1/N), or less when the others' claims leave less: the claims together never exceed the
endpoint's limit, and neither do the runs' requests. A joining run starts small and grows as
the others' past sending leaves the window; a run that ends (or dies) keeps its claim until what
it sent has left the window.

Runs that share a ledger also share answers, and claims keep them from paying twice for one
request: before sending, a run claims each request the ledger cannot answer yet. A request that
another live run has claimed is not sent but waited for, and answered from the ledger once that
run has written it (or sent after all, if that run failed it, deferred it or died). A claim ends
when its outcome is written. A run on this host whose process is gone is known dead at once, so
a rerun after a crash takes over its claims (and its share) without waiting for it to go stale.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ..ledger.key_lists import KeyList

_HOST = socket.gethostname()[:32]
_BATCH = 500


def _beside(ledger_table: sa.Table, suffix: str, *columns: sa.Column,
            **options: Any) -> sa.Table:
    """A table next to the ledger (same schema, the ledger's name plus ``suffix``)."""
    return sa.Table(f"{ledger_table.name}{suffix}", sa.MetaData(schema=ledger_table.schema),
                    *columns, **options)


def _holders_table(ledger_table: sa.Table) -> sa.Table:
    return _beside(
        ledger_table, "_runs",
        sa.Column("holder_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(255), primary_key=True),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("description", sa.String(255)),
        sa.Column("live", sa.Boolean, nullable=False, default=True),
        sa.Column("requests_claim", sa.Float, nullable=False, default=0.0),
        sa.Column("tokens_claim", sa.Float, nullable=False, default=0.0),
        sa.Column("concurrency_claim", sa.Float, nullable=False, default=0.0),
        # False while the run only waits for requests other runs are sending: it then takes
        # no share of the endpoint (NULL, from a version before the column: sending).
        sa.Column("sending", sa.Boolean, nullable=True),
    )


def _claims_table(ledger_table: sa.Table) -> sa.Table:
    return _beside(
        ledger_table, "_claims",
        sa.Column("request_key", sa.String(64), primary_key=True),
        sa.Column("holder_id", sa.String(64), nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
        # SQLite: one B-tree (the key's) instead of a rowid table and its key index; each
        # request of a run is claimed and released once, so this halves that work.
        sqlite_with_rowid=False,
    )


def _group(holder_id: str) -> str:
    """host:pid:pool of a holder: runs of one pool share its limiters, so they count once."""
    return holder_id.rpartition(":")[0]


def _process_gone(holder_id: str) -> bool:
    """Whether a holder is a process of this host that no longer exists."""
    host, _, rest = holder_id.partition(":")
    pid = rest.partition(":")[0]
    if host != _HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def _add_missing_columns(engine: sa.Engine, table: sa.Table) -> None:
    """Give a table made by an earlier version the nullable columns added since (their NULL
    means what the earlier version did)."""
    present = {c["name"] for c in sa.inspect(engine).get_columns(table.name,
                                                                  schema=table.schema)}
    preparer = engine.dialect.identifier_preparer
    for column in table.columns:
        if column.name in present or not column.nullable:
            continue
        kind = column.type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN "
                                     f"{preparer.format_column(column)} {kind}")
        except sa.exc.DatabaseError:  # another run added it meanwhile
            present = {c["name"] for c in sa.inspect(engine).get_columns(
                table.name, schema=table.schema)}
            if column.name not in present:
                raise


class RunCoordinator:
    """Registers this run as a user of some endpoints and reports how many runs share each."""

    def __init__(self, engine: sa.Engine, ledger_table: sa.Table, endpoints: list[str], *,
                 stale_after_s: float = 10.0, description: str | None = None,
                 rate_limits: dict[str, tuple[float | None, float | None]] | None = None,
                 window_s: float = 0.0, group: str | None = None,
                 max_concurrency: dict[str, int] | None = None):
        """``rate_limits``: endpoint -> (requests, tokens) allowed per ``window_s`` (None: no
        limit); ``group``: an id of the pool (limiters) this run sends through."""
        self.engine = engine
        self.table = _holders_table(ledger_table)
        self.endpoints = endpoints
        self.stale_after_s = stale_after_s
        self.rate_limits = rate_limits or {}
        # A row is kept while what its run sent may still be in a server's window.
        self.window_s = window_s + 1.0  # plus a margin for sends after the last heartbeat
        self.keep_s = max(stale_after_s, self.window_s) if self.rate_limits else stale_after_s
        self.limits: dict[str, tuple[tuple[float, bool] | None, ...]] = {}
        self.max_concurrency = max_concurrency or {}
        # endpoint -> requests this run may have in flight (set by each heartbeat)
        self.capacities: dict[str, int] = {}
        self.claims = _claims_table(ledger_table)
        # Claims taken over from runs that are gone, so far: the caller folds their journals
        # before it looks those requests up (their answers may be there, paid for already).
        self.taken_over = 0
        self._claims_sql = engine.dialect.identifier_preparer.format_table(self.claims)
        self._sqlite_claim_sql: str | None = None  # compiled on the first claim
        # host:pid:pool:random, so that a run on the same host can tell this process is gone.
        self.group = f"{_HOST}:{os.getpid()}:{group or uuid.uuid4().hex[:8]}"
        self.holder_id = f"{self.group}:{uuid.uuid4().hex[:8]}"
        self.description = (description or f"pid {os.getpid()}")[:255]
        for table in (self.table, self.claims):
            try:
                table.metadata.create_all(engine, checkfirst=True)
            except sa.exc.DatabaseError:
                if not sa.inspect(engine).has_table(table.name, schema=table.schema):
                    raise
        _add_missing_columns(engine, self.table)

    def heartbeat(self, usage: dict[str, tuple[float, float]] | None = None,
                  in_flight: dict[str, int] | None = None, *, sending: bool = True
                  ) -> dict[str, int]:
        """Renew this run's registration; return live runs per endpoint (this one included).

        ``usage``: endpoint -> (requests, tokens) this run's limiters count now; ``sending``:
        False while the run only waits for other runs' answers, so the runs that send split
        the endpoint without it (it claims no concurrency and no more of a rate limit than
        its limiters still count). Sets
        ``limits``: endpoint -> per kind (requests, tokens), ``None`` where unlimited, else
        (what this run may count in a window, whether that is its full fair share); and
        ``capacities``: endpoint -> requests this run may have in flight.
        """
        t = self.table
        now = time.time()
        usage = usage or {}
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # One heartbeat at a time (SQLite's BEGIN IMMEDIATE does this already): two
                # runs that read at once would each miss the other and take the whole endpoint.
                lock_id = int.from_bytes(hashlib.sha256(t.fullname.encode()).digest()[:8],
                                         "big", signed=True)
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lock_id)))
            conn.execute(t.delete().where(t.c.heartbeat_at < now - self.keep_s))
            conn.execute(t.delete().where(t.c.holder_id == self.holder_id))
            rows = conn.execute(sa.select(
                t.c.holder_id, t.c.endpoint, t.c.heartbeat_at, t.c.live, t.c.requests_claim,
                t.c.tokens_claim, t.c.concurrency_claim, t.c.sending,
            ).where(t.c.endpoint.in_(self.endpoints))).all()
            gone = {h for h in {r.holder_id for r in rows} if _process_gone(h)}
            runs: dict[str, int] = {}
            records = []
            for name in self.endpoints:
                groups, taken, in_flight_elsewhere = {self.group}, [0.0, 0.0], 0.0
                for row in rows:
                    if row.endpoint != name or _group(row.holder_id) == self.group:
                        continue  # this pool's own sending is in its own limiters already
                    if (row.live and row.heartbeat_at >= now - self.stale_after_s
                            and row.holder_id not in gone):
                        if row.sending is not False:  # a waiting run takes no share
                            groups.add(_group(row.holder_id))
                        in_flight_elsewhere += row.concurrency_claim
                    elif ((not row.live or row.holder_id in gone)
                          and row.heartbeat_at < now - self.window_s):
                        continue  # ended, and what it sent has left the servers' windows
                    taken[0] += row.requests_claim
                    taken[1] += row.tokens_claim
                runs[name] = len(groups)
                concurrency_claim = 0.0
                cap = self.max_concurrency.get(name)
                if cap is not None:
                    fair = max(1, cap // len(groups))
                    allowed = int(max(0.0, min(fair, cap - in_flight_elsewhere)))
                    self.capacities[name] = allowed
                    concurrency_claim = float(max(allowed if sending else 0,
                                                  (in_flight or {}).get(name, 0)))
                caps = self.rate_limits.get(name, (None, None))
                used = usage.get(name, (0.0, 0.0))
                limits, claims = [], []
                for cap, others, mine in zip(caps, taken, used, strict=True):
                    if cap is None:
                        limits.append(None)
                        claims.append(0.0)
                        continue
                    fair = cap / len(groups)
                    allowed = max(0.0, min(fair, cap - others))
                    limits.append((allowed, allowed >= fair))
                    claims.append(max(float(mine), allowed if sending else 0.0))
                self.limits[name] = tuple(limits)
                records.append({"holder_id": self.holder_id, "endpoint": name,
                                "heartbeat_at": now, "description": self.description,
                                "live": True, "requests_claim": claims[0],
                                "tokens_claim": claims[1],
                                "concurrency_claim": concurrency_claim, "sending": sending})
            if records:  # a run with no endpoints (in-process models only) registers none
                conn.execute(t.insert(), records)
        return runs

    def leave(self, usage: dict[str, tuple[float, float]] | None = None) -> None:
        """End this run. Its claims shrink to what it sent lately, kept until that has left the
        servers' windows; its request claims end now."""
        t = self.table
        with self.engine.begin() as conn:
            if self.rate_limits:
                for name in self.endpoints:
                    requests, tokens = (usage or {}).get(name, (0.0, 0.0))
                    conn.execute(t.update().where(t.c.holder_id == self.holder_id,
                                                  t.c.endpoint == name).values(
                        live=False, heartbeat_at=time.time(), concurrency_claim=0.0,
                        requests_claim=float(requests), tokens_claim=float(tokens)))
            else:
                conn.execute(t.delete().where(t.c.holder_id == self.holder_id))
            conn.execute(self.claims.delete().where(self.claims.c.holder_id == self.holder_id))

    def _live_holders(self, conn: sa.Connection, now: float) -> set[str]:
        t = self.table
        fresh = set(conn.execute(sa.select(t.c.holder_id).distinct().where(
            t.c.live, t.c.heartbeat_at >= now - self.stale_after_s)).scalars())
        return {h for h in fresh if h == self.holder_id or not _process_gone(h)} | {
            self.holder_id}

    def claim(self, keys: Iterable[str]) -> set[str]:
        """Claim requests for this run; return those another live run is sending right now.

        Claims of runs that are gone are taken over. Only SQLite and PostgreSQL take claims
        (elsewhere this claims nothing and returns nothing: runs may then pay twice).

        Every statement takes its keys in one order (sorted): two runs inserting overlapping
        keys in different orders each wait on a key the other inserted and PostgreSQL breaks
        the cycle by failing one transaction ("deadlock detected"); in one order the second
        waits for the first and goes on. A failure raises: the caller retries the claim
        (:mod:`.coordination`), it never sends without one.
        """
        backend = self.engine.dialect.name
        if backend not in ("sqlite", "postgresql"):
            return set()
        c = self.claims
        keys = sorted(set(keys))
        others: set[str] = set()
        now = time.time()
        key_list = KeyList.of(backend)
        with self.engine.begin() as conn:
            live: set[str] | None = None  # read only when another run holds one of the keys
            for start in range(0, len(keys), _BATCH):
                batch = keys[start:start + _BATCH]
                self._insert_claims(conn, backend, batch, now)
                held = self._held_by_others(conn, key_list, batch)
                if not held:
                    continue
                if live is None:
                    live = self._live_holders(conn, now)
                gone = [key for key, holder in held if holder not in live]
                others.update(key for key, holder in held if holder in live)
                if gone:  # take over the claims of runs that are gone (still in key order)
                    self.taken_over += len(gone)
                    conn.execute(c.delete().where(c.c.request_key.in_(gone),
                                                  c.c.holder_id.not_in(live)))
                    self._insert_claims(conn, backend, gone, now)
        return others

    def _held_by_others(self, conn: sa.Connection, key_list: KeyList | None,
                        keys: list[str]) -> list[tuple[str, str]]:
        if key_list is None:
            c = self.claims
            return conn.execute(sa.select(c.c.request_key, c.c.holder_id).where(
                c.c.request_key.in_(keys), c.c.holder_id != self.holder_id)).all()
        return conn.exec_driver_sql(
            f"SELECT request_key, holder_id FROM {self._claims_sql} WHERE request_key "
            f"{key_list.keys_in} AND holder_id <> {key_list.placeholder}",
            (key_list.encode(keys), self.holder_id)).all()

    def _insert_claims(self, conn: sa.Connection, backend: str, keys: list[str],
                       now: float) -> None:
        """Claim the unclaimed ``keys`` (a key another run holds keeps its holder)."""
        c = self.claims
        if backend == "sqlite":  # tuples straight to the driver: a run claims every request
            if self._sqlite_claim_sql is None:
                self._sqlite_claim_sql = str(sa.dialects.sqlite.insert(c).values(
                    request_key=sa.bindparam("k"), holder_id=sa.bindparam("h"),
                    claimed_at=sa.bindparam("t")).on_conflict_do_nothing(
                    index_elements=[c.c.request_key]).compile(dialect=self.engine.dialect))
            holder = self.holder_id
            conn.exec_driver_sql(self._sqlite_claim_sql, [(k, holder, now) for k in keys])
            return
        conn.execute(
            sa.dialects.postgresql.insert(c).on_conflict_do_nothing(
                index_elements=[c.c.request_key]),
            [{"request_key": k, "holder_id": self.holder_id, "claimed_at": now} for k in keys])

    def release(self, keys: Iterable[str], conn: sa.Connection | None = None) -> None:
        """End this run's claims on requests whose outcome is now in the ledger; in ``conn``'s
        transaction when given (the one that wrote the outcomes: both or neither)."""
        if conn is None:
            with self.engine.begin() as own:
                self.release(keys, own)
            return
        keys = list(keys)
        key_list = KeyList.of(self.engine.dialect.name)
        if key_list is None:
            c = self.claims
            for start in range(0, len(keys), _BATCH):
                conn.execute(c.delete().where(c.c.request_key.in_(keys[start:start + _BATCH]),
                                              c.c.holder_id == self.holder_id))
            return
        for batch in key_list.batches(keys):
            conn.exec_driver_sql(
                f"DELETE FROM {self._claims_sql} WHERE request_key {key_list.keys_in} "
                f"AND holder_id = {key_list.placeholder}",
                (key_list.encode(batch), self.holder_id))
