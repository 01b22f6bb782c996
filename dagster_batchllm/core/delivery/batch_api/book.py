"""The batch book: which request keys were submitted in which provider batch, beside the ledger.

Two tables in the ledger's database (``<ledger>_batches``, ``<ledger>_batch_lines``). A key is
written here, with its batch's submission id, *before* the provider hears of the batch, so a
rerun after a crash, or a concurrent run of another partition, finds it in a live batch and
waits for that batch instead of paying for it again. When a batch ends, its output and error
files are streamed into its lines (the reply's text and usage, or the error with whether a
retry may fix it); the next pass of the call hands those to the engine as replies, so they are
parsed by the task and recorded in the ledger like online answers. The lines of a batch that
the collecting call delivers itself are only marked ``ok`` here: their answers are in the
ledger (see :meth:`BatchBook.settle_delivered`).

A batch row goes ``submitting`` (recorded, not yet created at the provider) -> the provider's
statuses (``validating``, ``in_progress``, ``finalizing``, ``completed``, ``expired``,
``cancelled``, ``failed``) -> ``collecting`` -> ``collected``; ``submit_failed`` when the
provider refused it (its lines then hold the error).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from ...ledger.deferrals import Deferrals
from ...ledger.key_lists import KeyList, in_key_order
from ...ledger.table import Ledger
from .tables import LineState, book_tables, owner_id

SUBMITTING, COLLECTING, COLLECTED, SUBMIT_FAILED = (
    "submitting", "collecting", "collected", "submit_failed")
#: Provider statuses after which a batch answers nothing more.
ENDED = ("completed", "expired", "cancelled", "failed")
#: Line states.
PENDING, LINE_OK, LINE_FAILED, LINE_MISSING = "pending", "ok", "failed", "missing"
_CHUNK = 500
_KEY_BEFORE_LAST = operator.itemgetter(-2)  # a settled line's key, before its batch's id


class _NotAll(Exception):
    """add_lines(all_or_none=True) met a key recorded already: its transaction is undone."""


class BatchBook:
    """The two tables, on the ledger's engine. The per-line statements (a row's insert,
    lookup and settling, 100,000s a call) are plain SQL through the driver: SQLAlchemy's
    per-row parameter processing would cost more than the rest of the line's work."""

    def __init__(self, ledger: Ledger):
        self.engine = ledger.engine
        self.batches, self.lines = book_tables(
            f"{ledger.table.schema + '.' if ledger.table.schema else ''}{ledger.table.name}")
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        lines, batches = _quoted(self.engine, self.lines), _quoted(self.engine, self.batches)
        # SQLite would otherwise answer "key = ? AND submission = ?" through the submission's
        # index, scanning the batch's lines for each key; a unary + keeps it on the key.
        # PostgreSQL's planner knows the key is the more selective (and has no + for text).
        by_key = "+submission_id" if mark == "?" else "submission_id"
        self._insert_line = (
            f"INSERT INTO {lines} (request_key, attempt, submission_id, state, prompt_tokens, "
            f"completion_tokens, retryable) VALUES ({mark}, {mark}, {mark}, '{PENDING}', 0, 0, "
            f"{'0' if mark == '?' else 'false'}) ON CONFLICT DO NOTHING")
        self._settle_line = (
            f"UPDATE {lines} SET state = {mark}, content = {mark}, prompt_tokens = {mark}, "
            f"completion_tokens = {mark}, finish_reason = {mark}, error = {mark}, "
            f"error_type = {mark}, retryable = {mark}, cached_tokens = {mark} "
            f"WHERE request_key = {mark} AND {by_key} = {mark}")
        self._mark = mark
        self._latest = (
            f"SELECT l.request_key, l.submission_id, b.batch_id, b.status, l.attempt, l.state, "
            f"l.content, l.finish_reason, l.response, l.prompt_tokens, l.completion_tokens, "
            f"l.error, l.error_type, l.retryable, b.created_at, b.ended_at, l.cached_tokens "
            f"FROM {lines} l "
            f"JOIN {batches} b ON b.submission_id = l.submission_id WHERE l.request_key ")
        self._key_list = KeyList.of(self.engine.dialect.name)
        self.deferrals = Deferrals(ledger)
        self._ours = (f"SELECT request_key FROM {lines} WHERE {by_key} = {mark} "
                      "AND request_key IN ")
        if mark == "?":  # SQLite: lines by rowid (see settle_lines)
            self._places = (f"SELECT rowid, request_key, attempt FROM {lines} "
                            f"WHERE submission_id = ?")
            self._settle_by_rowid: str | None = (
                f"UPDATE {lines} SET state = ?, content = ?, prompt_tokens = ?, "
                "completion_tokens = ?, finish_reason = ?, error = ?, error_type = ?, "
                "retryable = ?, cached_tokens = ? WHERE rowid = ? AND request_key = ?")
        else:
            self._places = (f"SELECT request_key, attempt FROM {lines} "
                            f"WHERE submission_id = {mark}")
            self._settle_by_rowid = None
        try:
            self.batches.metadata.create_all(self.engine, checkfirst=True)
        except sa.exc.DatabaseError:  # created by another process meanwhile
            if not sa.inspect(self.engine).has_table(self.lines.name, schema=self.lines.schema):
                raise
        self._add_new_columns()

    def _add_new_columns(self) -> None:
        """A book made before gains the columns added since: ``content`` and
        ``finish_reason`` (its answered lines keep their reply bodies in ``response``, which
        is still read), ``delivered_at`` (its batches' rows have ledger records, so they
        count as delivered), ``cached_tokens`` (NULL: not known, priced as uncached) and
        a deadline's ``switch_at`` and ``overtaken_at`` (NULL: none)."""
        for table, column, then in (
                (self.lines, "content", None), (self.lines, "finish_reason", None),
                (self.lines, "cached_tokens", None), (self.batches, "switch_at", None),
                (self.batches, "overtaken_at", None),
                (self.batches, "delivered_at", "UPDATE {table} SET delivered_at = updated_at")):
            have = {c["name"] for c in sa.inspect(self.engine).get_columns(
                table.name, schema=table.schema)}
            if column in have:
                continue
            quoted = _quoted(self.engine, table)
            kind = table.c[column].type.compile(dialect=self.engine.dialect)
            try:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {column} {kind}")
                    if then:
                        conn.exec_driver_sql(then.format(table=quoted))
            except sa.exc.DatabaseError:  # another process added it meanwhile
                have = {c["name"] for c in sa.inspect(self.engine).get_columns(
                    table.name, schema=table.schema)}
                if column not in have:
                    raise

    # -- submitting --------------------------------------------------------------------------
    def record_submission(self, row: dict[str, Any]) -> None:
        """A batch being written (status ``submitting``), before any of its keys; they follow
        with :meth:`add_lines`, and the file is uploaded after the last of them."""
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(self.batches.insert().values(
                **row, status=SUBMITTING, owner=owner_id(), created_at=now, updated_at=now))

    def add_lines(self, submission_id: str, keys: Sequence[tuple[str, int]], *,
                  partition: tuple[str, str] | None = None,
                  all_or_none: bool = False) -> set[str]:
        """Record keys (with their attempt numbers) in a batch being written; the keys whose
        attempt another run recorded first are left out. Returns the keys recorded here.

        ``partition`` (scope, partition key): the partition whose rows these are. Their
        deferral is this line from now on, so a deferred ledger record of theirs from an
        earlier run (a token budget's, a wait for another run's batch) is removed, in the
        same transaction: it would have a retry sensor run the partition for rows that wait
        for a batch.

        ``all_or_none``: if any of the keys has that attempt recorded already (by any run, in
        any batch, this one included), none is recorded and the set is empty."""
        if not keys:
            return set()
        try:
            return self._add_lines(submission_id, keys, partition, all_or_none)
        except _NotAll:
            return set()

    def _add_lines(self, submission_id: str, keys: Sequence[tuple[str, int]],
                   partition: tuple[str, str] | None, all_or_none: bool) -> set[str]:
        mark = self._mark
        with self.engine.begin() as conn:
            inserted = conn.exec_driver_sql(self._insert_line, in_key_order(
                [(key, attempt, submission_id) for key, attempt in keys]))
            ours: set[str] = set()
            if inserted.rowcount == len(keys):  # the usual case: no other run had any of them
                ours.update(key for key, _ in keys)
            elif all_or_none:
                raise _NotAll  # leaving the block rolls the inserts back
            for start in range(0, len(keys) if not ours else 0, _CHUNK):
                chunk = [key for key, _ in keys[start:start + _CHUNK]]
                ours.update(k for (k,) in conn.exec_driver_sql(
                    self._ours + f"({', '.join([mark] * len(chunk))})",
                    (submission_id, *chunk)))
            conn.execute(self.batches.update()
                         .where(self.batches.c.submission_id == submission_id)
                         .values(updated_at=time.time()))
            if partition is not None and ours:
                self.deferrals.forget(conn, [key for key, _ in keys if key in ours],
                                      *partition)
        return ours

    def undelivered(self, scope: str, partition_key: str, statuses: Sequence[str]
                    ) -> list[str]:
        """The submission ids of the partition's batches in ``statuses`` that its runs have
        not delivered yet."""
        t = self.batches
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(t.c.submission_id).where(
                t.c.scope == scope, t.c.partition_key == partition_key,
                t.c.status.in_(list(statuses)), t.c.delivered_at.is_(None))).scalars())

    def mark_delivered(self, submission_ids: Iterable[str], scope: str,
                       partition_key: str) -> None:
        """The batches, of this partition, whose lines' outcomes are in the ledger now."""
        ids = list(submission_ids)
        if not ids:
            return
        t = self.batches
        with self.engine.begin() as conn:
            conn.execute(t.update().where(
                t.c.submission_id.in_(ids), t.c.scope == scope,
                t.c.partition_key == partition_key, t.c.delivered_at.is_(None))
                .values(delivered_at=time.time()))

    # -- deadlines (see deadline.py) -----------------------------------------------------------
    def set_switch_at(self, scope: str, partition_key: str, switch_at: float) -> None:
        """When the partition's rows still unanswered go online, on its undelivered batches."""
        t = self.batches
        with self.engine.begin() as conn:
            conn.execute(t.update().where(
                t.c.scope == scope, t.c.partition_key == partition_key,
                t.c.delivered_at.is_(None)).values(switch_at=switch_at))

    def mark_overtaken(self, submission_ids: Iterable[str]) -> None:
        """The batches whose rows went online unfinished: the partition no longer waits for
        them, and what they answer from now on is a duplicate (see overtaken_answers)."""
        ids = list(submission_ids)
        if ids:
            t, now = self.batches, time.time()
            with self.engine.begin() as conn:
                conn.execute(t.update().where(t.c.submission_id.in_(ids))
                             .values(overtaken_at=now, delivered_at=sa.func.coalesce(
                                 t.c.delivered_at, now)))

    def overtaken_answers(self, scope: str, partition_key: str
                          ) -> list[tuple[str, str, int, int, int]]:
        """Per overtaken batch of the partition: (model, endpoint, answered lines, their
        prompt and completion tokens)."""
        b, line = self.batches, self.lines
        query = (sa.select(b.c.model, b.c.endpoint, sa.func.count(),
                           sa.func.coalesce(sa.func.sum(line.c.prompt_tokens), 0),
                           sa.func.coalesce(sa.func.sum(line.c.completion_tokens), 0))
                 .join(line, line.c.submission_id == b.c.submission_id)
                 .where(b.c.scope == scope, b.c.partition_key == partition_key,
                        b.c.overtaken_at.is_not(None), line.c.state == LINE_OK)
                 .group_by(b.c.submission_id, b.c.model, b.c.endpoint))
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query)]

    def switch_times(self, scope: str) -> dict[str, float]:
        """Per partition of ``scope`` waiting for its batches: the earliest switch time."""
        t = self.batches
        query = (sa.select(t.c.partition_key, sa.func.min(t.c.switch_at))
                 .where(t.c.scope == scope, t.c.delivered_at.is_(None),
                        t.c.switch_at.is_not(None)).group_by(t.c.partition_key))
        with self.engine.connect() as conn:
            return {partition: float(at) for partition, at in conn.execute(query)}

    def update_batch(self, submission_id: str, *, expect_status: str | None = None,
                     **values: Any) -> bool:
        """Change a batch's row (only while its status is ``expect_status``, if given)."""
        t = self.batches
        query = t.update().where(t.c.submission_id == submission_id)
        if expect_status is not None:
            query = query.where(t.c.status == expect_status)
        with self.engine.begin() as conn:
            return conn.execute(query.values(**values, updated_at=time.time())).rowcount == 1

    def claim(self, submission_id: str, seen_status: str, new_status: str,
              **values: Any) -> bool:
        """Move a batch from ``seen_status`` to ``new_status`` unless another run did first."""
        return self.update_batch(submission_id, expect_status=seen_status, status=new_status,
                                 owner=owner_id(), **values)

    def forget_submission(self, submission_id: str) -> None:
        """A submission the provider never created: its keys are free to be submitted again."""
        with self.engine.begin() as conn:
            conn.execute(self.lines.delete().where(self.lines.c.submission_id == submission_id))
            conn.execute(self.batches.delete()
                         .where(self.batches.c.submission_id == submission_id))

    def fail_lines(self, submission_id: str, error: str, error_type: str,
                   retryable: bool) -> None:
        """Every line of a batch that was refused or failed as a whole gets its error."""
        with self.engine.begin() as conn:
            conn.execute(self.lines.update()
                         .where(self.lines.c.submission_id == submission_id,
                                self.lines.c.state == PENDING)
                         .values(state=LINE_FAILED, error=error, error_type=error_type,
                                 retryable=retryable))

    # -- collecting --------------------------------------------------------------------------
    def settle_lines(self, submission_id: str, outcomes: Sequence[tuple],
                     places: dict[str, tuple[int | None, int]] | None = None) -> None:
        """Write line outcomes of one batch: ``(state, content, prompt_tokens,
        completion_tokens, finish_reason, error, error_type, retryable, cached_tokens,
        request_key)`` tuples
        (the statement's parameter order, less the batch's id). ``places``: the batch's
        :meth:`line_places`, with which SQLite updates each line by its rowid, in rowid
        order: one B-tree, walked in order, instead of the key's index then the row."""
        if not outcomes:
            return
        by_key = outcomes
        with self.engine.begin() as conn:
            if places is not None and self._settle_by_rowid is not None:
                rows, by_key = [], []
                for outcome in outcomes:
                    place = places.get(outcome[-1])
                    if place is None or place[0] is None:
                        by_key.append(outcome)  # a key this batch does not have: updates none
                    else:
                        rows.append((*outcome[:-1], place[0], outcome[-1]))
                rows.sort(key=_KEY_BEFORE_LAST)  # by rowid
                done = conn.exec_driver_sql(self._settle_by_rowid, rows).rowcount
                if done != len(rows):  # rowids that no longer are these lines' (a VACUUM)
                    by_key = outcomes
            if by_key:
                conn.exec_driver_sql(self._settle_line, in_key_order(
                    [(*outcome, submission_id) for outcome in by_key], key=_KEY_BEFORE_LAST))

    def mark_missing(self, submission_id: str, error: str, error_type: str,
                     keys: Sequence[str] | None = None) -> int:
        """Lines the ended batch answered neither way: a next batch may submit them again.
        ``keys``: only these (the batch's other pending lines are answered, their answers
        held by the collector; see :meth:`settle_delivered`)."""
        t = self.lines
        query = t.update().where(t.c.submission_id == submission_id, t.c.state == PENDING)
        values = {"state": LINE_MISSING, "error": error, "error_type": error_type,
                  "retryable": True}
        with self.engine.begin() as conn:
            if keys is None:
                return conn.execute(query.values(**values)).rowcount
            return sum(conn.execute(query.where(t.c.request_key.in_(keys[start:start + _CHUNK]))
                                    .values(**values)).rowcount
                       for start in range(0, len(keys), _CHUNK))

    def settle_delivered(self, submission_id: str) -> int:
        """The batch's lines still pending are answered, and their answers are in the
        ledger's records of the batch's partition (written by the run that collected them):
        they become ``ok`` without a copy of the answer here."""
        t = self.lines
        with self.engine.begin() as conn:
            return conn.execute(t.update().where(t.c.submission_id == submission_id,
                                                 t.c.state == PENDING)
                                .values(state=LINE_OK)).rowcount

    def failed_records(self, scope: str, partition_key: str) -> set[str]:
        """The keys of the partition's failed ledger records."""
        return self.deferrals.failed_keys(scope, partition_key)

    # -- reading -----------------------------------------------------------------------------
    def batch(self, submission_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.batches).where(
                self.batches.c.submission_id == submission_id)).mappings().first()
        return dict(row) if row else None

    def unfinished(self, endpoints: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Batches not yet collected (oldest first), of the given endpoints."""
        t = self.batches
        query = sa.select(t).where(t.c.status.not_in((COLLECTED, SUBMIT_FAILED)))
        if endpoints is not None:
            query = query.where(t.c.endpoint.in_(list(endpoints)))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query.order_by(t.c.created_at)).mappings()]

    def all_batches(self, scope: str | None = None,
                    partition_key: str | None = None) -> list[dict[str, Any]]:
        t = self.batches
        query = sa.select(t).order_by(t.c.created_at)
        if scope is not None:
            query = query.where(t.c.scope == scope)
        if partition_key is not None:
            query = query.where(t.c.partition_key == partition_key)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def latest_lines(self, keys: Sequence[str]) -> dict[str, LineState]:
        """Each key's latest line (highest attempt), with its batch's id and status."""
        found: dict[str, LineState] = {}
        make = LineState._make
        with self.engine.connect() as conn:
            for row in self._lines_of(conn, keys):
                held = found.get(row[0])
                if held is None or held.attempt < row[4]:
                    found[row[0]] = make(row)
        return found

    def _lines_of(self, conn: sa.Connection, keys: Sequence[str]) -> Iterable[Any]:
        # Through the driver's own cursor: SQLAlchemy's result rows cost more per row than
        # the query (a collect pass reads a row per table row).
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            key_list = self._key_list
            if key_list is not None:  # the keys as one parameter (see KeyList)
                sql = self._latest + key_list.keys_in
                for batch in key_list.batches(keys):
                    cursor.execute(sql, (key_list.encode(batch),))
                    yield from cursor.fetchall()
                return
            for start in range(0, len(keys), _CHUNK):
                chunk = tuple(keys[start:start + _CHUNK])
                cursor.execute(self._latest + f"IN ({', '.join([self._mark] * len(chunk))})",
                               chunk)
                yield from cursor.fetchall()
        finally:
            cursor.close()

    def line_places(self, submission_id: str) -> dict[str, tuple[int | None, int]]:
        """Each line of one batch: its rowid (SQLite; None elsewhere) and attempt number, by
        key, read through the batch's submission index."""
        with self.engine.connect() as conn:
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                cursor.execute(self._places, (submission_id,))
                if self._settle_by_rowid is None:
                    return {key: (None, attempt) for key, attempt in cursor.fetchall()}
                return {key: (rowid, attempt) for rowid, key, attempt in cursor.fetchall()}
            finally:
                cursor.close()

    def line_counts(self, submission_id: str) -> dict[str, int]:
        t = self.lines
        with self.engine.connect() as conn:
            return dict(conn.execute(
                sa.select(t.c.state, sa.func.count()).where(t.c.submission_id == submission_id)
                .group_by(t.c.state)).all())


def _quoted(engine: sa.Engine, table: sa.Table) -> str:
    preparer = engine.dialect.identifier_preparer
    name = preparer.quote(table.name)
    return f"{preparer.quote_schema(table.schema)}.{name}" if table.schema else name
