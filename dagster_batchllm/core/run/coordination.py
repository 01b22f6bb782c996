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

Two parts: :class:`RunCoordinator` is the database side (who is live, what each claims, in
the tables beside the ledger); :class:`RunCoordination` is the run's side of it, everything one
run does with the other runs, so the engine makes a few calls and knows nothing of heartbeats:

* ``join``: register, and when others are sending, wait a heartbeat so they shrink first;
* ``heartbeat_loop``: renew, and hand the pool this run's part of each endpoint as ONE
  :class:`~.pool.Allocation` (shares, rate limits and in-flight capacities together);
* ``claim`` / ``release``: keep two runs from paying for one request; requests another run has
  claimed are *parked* and ``send_parked`` waits for their answers (or sends them after all);
* ``leave``: end the registration and give the pool its endpoints whole again.

A busy or failing coordination database never makes a run pay twice: heartbeats keep the last
shares, and a claim that fails (a deadlock, a lock timeout, the database away) is retried, with
sending paused meanwhile, never skipped; a claim that keeps failing for ``ledger_outage_s`` (the
bound of a ledger outage) fails the run, as a ledger that cannot be written does. Claims end
when the run leaves.

Claims are taken a slice at a time, just before the slice is sent (``claim_slice``), not a
chunk of thousands of rows at once: runs over the same rows then claim different slices and
all send, instead of one sending everything while the others wait for its answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from ..delivery.pool import Allocation, EndpointPool
from ..errors import ClaimsUnavailableError, LedgerUnwritable
from ..ledger.key_lists import KeyList
from ..ledger.stores import redact_url
from ..ledger.table import Ledger
from ..ledger.writer import database_away
from ..settings import InferenceSettings

_HOST = socket.gethostname()[:32]
_BATCH = 500
_WARN_EVERY_S = 10.0  # while heartbeats or claims fail, one warning per this many seconds
# A claim that failed is retried after a short, growing, jittered pause: a deadlock's loser
# goes again at once (the winner has committed by then), an outage is not hammered.
_CLAIM_RETRY_FIRST_S = 0.02
_CLAIM_RETRY_MAX_S = 2.0
# Failures that waiting does not fix (a bad statement, a permission) stop the run after this
# many in a row, as the ledger writer's do.
_MAX_OTHER_CLAIM_FAILURES = 5
# Requests claimed at a time: about what the run sends at once, so runs over the same rows
# take different slices (see the module's docstring).
_MIN_CLAIM_SLICE = 64
Item = TypeVar("Item")  # what the run waits for per parked request (the engine's KeyState)


# -- the database side: the tables beside the ledger ------------------------------------------
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


# -- the run's side ----------------------------------------------------------------------------
class RunCoordination(Generic[Item]):
    """One run's side of the coordination (see the module): joins, heartbeats, claims, parks
    and leaves through its :class:`RunCoordinator`."""

    def __init__(self, coordinator: RunCoordinator, pool: EndpointPool, *, interval_s: float,
                 log: Any, outage_s: float = 120.0, where: str = "the ledger database"):
        """``outage_s``: how long claims may keep failing (sending paused) before the run
        fails; ``where``: the database, as errors name it (password redacted)."""
        self.coordinator = coordinator
        self.pool = pool
        self.interval_s = interval_s
        self.log = log
        self.outage_s = outage_s
        self.where = where
        # request key -> item, for requests another live run is sending: waited for
        self.parked: dict[str, Item] = {}
        # Awaited after a claim took over requests of a run that is gone and before the
        # caller looks them up: folds that run's journal into the ledger (the engine sets it).
        self.before_takeover: Callable[[], Awaitable[Any]] | None = None
        # False while the run only waits for parked requests: its share of each endpoint
        # goes to the runs that send them (see RunCoordinator.heartbeat).
        self.sending = True
        # Why the ledger writer gave up on the database, if it has (the engine sets it): the
        # claims share that database, so the claim loop stops then instead of waiting out an
        # outage clock of its own that started later.
        self.writer_gave_up: Callable[[], Exception | None] = lambda: None

    @classmethod
    async def join(cls, settings: InferenceSettings, ledger: Ledger, pool: EndpointPool, *,
                   description: str, log: Any) -> RunCoordination | None:
        """Join the runs sharing ``ledger``'s database; None when this run coordinates with
        none (``coordinate_runs`` off, or an in-memory ledger no other process sees)."""
        if not settings.coordinate_runs or ledger.in_memory:
            return None
        endpoints = settings.endpoints
        limited = [e for e in endpoints if e.requests_per_minute or e.tokens_per_minute]
        coordinator = await asyncio.to_thread(
            RunCoordinator, ledger.engine, ledger.table, [e.name for e in endpoints],
            stale_after_s=max(10.0, 20 * settings.coordination_interval_s),
            description=description,
            rate_limits={e.name: tuple(
                per_minute * e.rate_limit_window_s / 60.0 if per_minute else None
                for per_minute in (e.requests_per_minute, e.tokens_per_minute)) for e in limited},
            window_s=max((e.rate_limit_window_s for e in limited), default=0.0),
            group=pool.group,
            max_concurrency={e.name: e.max_concurrency for e in endpoints},
        )
        self = cls(coordinator, pool, interval_s=settings.coordination_interval_s, log=log,
                   outage_s=settings.ledger_outage_s, where=redact_url(ledger.url))
        runs = await self.heartbeat()
        if any(n > 1 for n in runs.values()):
            # Let the runs already sending see us and shrink before we start, then count again:
            # runs that joined while we waited shrink our share too (else it is stale until our
            # first heartbeat, and the runs together exceed the endpoint's limits).
            await asyncio.sleep(self.interval_s * 1.5)
            await self.heartbeat()
        return self

    async def heartbeat(self) -> dict[str, int]:
        """Renew this run's registration and apply its allocation; live runs per endpoint."""
        coordinator, pool = self.coordinator, self.pool
        runs = await asyncio.to_thread(coordinator.heartbeat, pool.window_usage(),
                                       pool.in_flight(), sending=self.sending)
        pool.allocate(Allocation(runs=runs, rate_limits=coordinator.limits,
                                 capacities=coordinator.capacities))
        return runs

    async def heartbeat_loop(self) -> None:
        failing = 0  # heartbeats failed in a row: an outage warns once, not 4 times a second
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.heartbeat()
                failing = 0
            except Exception as exc:  # a busy database delays a heartbeat; shares stay as they are
                if failing % max(1, round(_WARN_EVERY_S / self.interval_s)) == 0:
                    self.log.warning(f"batchllm: run coordination heartbeat failed"
                                     f"{f' ({failing + 1} in a row)' if failing else ''}: "
                                     f"{type(exc).__name__}: {str(exc)[:300]}")
                failing += 1

    def claim_slice(self, capacity: int) -> int:
        """How many requests the run claims at a time, for a delivery of ``capacity``."""
        return max(_MIN_CLAIM_SLICE, capacity)

    async def claim(self, keys: list[str], *, clock: Callable[[], float] = time.monotonic
                    ) -> set[str]:
        """Claim requests for this run; return those another live run is sending.

        Retried until it succeeds (nothing is sent meanwhile: the caller sends only what it
        claimed); past ``outage_s`` of failures, or after a few failures that waiting does not
        fix, raises :class:`ClaimsUnavailableError`."""
        failing_since: float | None = None
        warned_at = float("-inf")
        others = 0
        pause = _CLAIM_RETRY_FIRST_S
        while True:
            taken_over = self.coordinator.taken_over
            try:
                held = await asyncio.to_thread(self.coordinator.claim, keys)
            except Exception as exc:
                now = clock()
                if failing_since is None:
                    failing_since = now
                down_s = now - failing_since
                others = 0 if database_away(exc) else others + 1
                reason = f"{type(exc).__name__}: {str(exc)[:300]}"
                given_up = self.writer_gave_up()
                if isinstance(given_up, LedgerUnwritable):
                    raise given_up from exc
                if given_up is not None:
                    raise ClaimsUnavailableError(
                        f"not sent: the ledger cannot be written ({given_up})") from exc
                if others >= _MAX_OTHER_CLAIM_FAILURES or down_s >= self.outage_s:
                    raise ClaimsUnavailableError(
                        f"the ledger database {self.where} could not be written for "
                        f"{down_s:.0f} s (claiming {len(keys)} requests; last error: "
                        f"{reason}); nothing more was sent, so no request is paid twice; the "
                        "answers received are kept in the journal and written by the next "
                        "run, which sends the rest") from exc
                if down_s >= 1.0 and now - warned_at >= _WARN_EVERY_S:
                    # A deadlock's retry succeeds at once; only a streak is worth a line.
                    warned_at = now
                    self.log.warning(
                        f"batchllm: claiming {len(keys)} requests in {self.where} keeps "
                        f"failing; sending pauses and the claim is retried for up to "
                        f"{self.outage_s:g} s: {reason}")
                await asyncio.sleep(pause * (0.5 + random.random()))
                pause = min(_CLAIM_RETRY_MAX_S, pause * 2)
                continue
            if self.coordinator.taken_over != taken_over and self.before_takeover is not None:
                await self.before_takeover()
            return held

    def release_in(self, conn: Any, keys: list[str]) -> None:
        """End the claims on requests whose outcomes ``conn``'s transaction writes (the
        ledger writer's): other runs may use them once it commits. A failure fails that
        write, which is retried with its records."""
        self.coordinator.release(keys, conn)

    def park(self, key: str, item: Item) -> None:
        """Wait for ``key``, which another live run is sending, instead of sending it."""
        self.parked[key] = item

    async def send_parked(self, answer_from_ledger: Callable[[dict[str, Item]], Awaitable[None]],
                          send: Callable[[Item], Awaitable[None]],
                          idle: Callable[[], bool] = lambda: False) -> None:
        """Wait for the requests other runs were sending: ``answer_from_ledger`` answers (and
        removes from the dict it is given) those whose outcome they have written; ``send``
        sends those whose run failed, deferred or dropped them after all. While ``idle()``
        (the run has nothing of its own queued or in flight) it gives up its share of the
        endpoints to the runs still sending."""
        try:
            while self.parked:
                self.sending = not idle()
                await asyncio.sleep(self.interval_s)
                held = await self.claim(list(self.parked))  # claim first: an answer is written
                await answer_from_ledger(self.parked)  # before its claim ends, so this sees it
                for key in [k for k in self.parked if k not in held]:
                    self.sending = True
                    await send(self.parked.pop(key))
        finally:
            self.sending = True

    async def leave(self) -> None:
        """End this run; its request claims end now, its rate-limit claims once what it sent
        has left the servers' windows. The pool gets its endpoints whole again."""
        try:
            await asyncio.to_thread(self.coordinator.leave, self.pool.window_usage())
        except Exception as exc:  # the registration goes stale, its claims are taken over then
            self.log.warning(f"batchllm: leaving the run coordination failed (its claims end "
                             f"when they go stale): {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            self.pool.allocate(Allocation())
