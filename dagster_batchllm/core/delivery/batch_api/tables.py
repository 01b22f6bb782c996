"""The batch book's two tables, a line as read from them, and who owns a batch: the book's
schema, apart from its statements (:mod:`.book`)."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import NamedTuple

import sqlalchemy as sa

# A submission or collection whose owner has not been heard of for this long (and whose process
# is not known alive) is taken over by the next run.
STALE_AFTER_S = 30 * 60.0


def owner_id() -> str:
    """``host:pid`` of this process: who is submitting or collecting."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str | None, updated_at: float) -> bool:
    """Whether the process that wrote a row may still be working on it."""
    host, _, pid = (owner or "").rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return time.time() - updated_at < STALE_AFTER_S


class LineState(NamedTuple):
    """A key's latest line: in which batch, which attempt, and what came of it. A tuple made
    straight from its query row (a collect pass reads 100,000s of them)."""

    request_key: str
    submission_id: str
    batch_id: str | None
    batch_status: str
    attempt: int
    state: str
    content: str | None  # an answered line's reply text
    finish_reason: str | None
    response: str | None  # the reply body, on lines answered before ``content`` was kept
    prompt_tokens: int
    completion_tokens: int
    error: str | None
    error_type: str | None
    retryable: bool  # 0 or 1 on SQLite
    created_at: float
    ended_at: float | None
    cached_tokens: int | None

    @property
    def batch_name(self) -> str:
        return self.batch_id or self.submission_id

    @property
    def latency_s(self) -> float:
        """From the batch's creation to its end (what a line of it waited)."""
        return max(0.0, (self.ended_at or self.created_at) - self.created_at)


def book_tables(ledger_table: str) -> tuple[sa.Table, sa.Table]:
    schema, _, table = ledger_table.rpartition(".")
    metadata = sa.MetaData(schema=schema or None)
    batches = sa.Table(
        f"{table}_batches", metadata,
        sa.Column("submission_id", sa.String(40), primary_key=True),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("endpoint", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("route", sa.String(64), nullable=False),
        sa.Column("batch_id", sa.String(128)),
        sa.Column("input_file_id", sa.String(128)),
        sa.Column("output_file_id", sa.String(128)),
        sa.Column("error_file_id", sa.String(128)),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("lines", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("request_counts", sa.Text),
        sa.Column("errors", sa.Text),
        sa.Column("scope", sa.String(255), nullable=False, default=""),
        sa.Column("partition_key", sa.String(255), nullable=False, default=""),
        sa.Column("run_id", sa.String(64)),
        sa.Column("owner", sa.String(255)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        # When the run of the batch's own partition had its lines' outcomes written to the
        # ledger: until then the partition waits for it (see waiting_for_batches), as the
        # rows deferred into it have no ledger record of their own.
        sa.Column("delivered_at", sa.Float),
        # A deadline's (see deadline.py): when the partition's unanswered rows are to go
        # online (what the batch-collect sensor reads with wait=False), and when they went,
        # this batch still unfinished: whatever it answers after that is a duplicate.
        sa.Column("switch_at", sa.Float),
        sa.Column("overtaken_at", sa.Float),
        sa.Index(f"ix_{table}_batches_status", "status"),
    )
    # One line per (key, attempt): two runs that both try to submit a key's next attempt
    # cannot both succeed, on SQLite or PostgreSQL, so neither needs a lock or a claim.
    lines = sa.Table(
        f"{table}_batch_lines", metadata,
        sa.Column("request_key", sa.String(64), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("submission_id", sa.String(40), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        # An answered line's reply as read when its batch was collected (its text, usage and
        # finish reason), so the pass that hands it to the engine parses nothing again.
        sa.Column("content", sa.Text),
        sa.Column("finish_reason", sa.String(32)),
        sa.Column("prompt_tokens", sa.Integer, nullable=False, default=0),
        sa.Column("completion_tokens", sa.Integer, nullable=False, default=0),
        # Of prompt_tokens, those the provider served from its prompt cache (they cost the
        # cached price); NULL on lines of books made before it was kept.
        sa.Column("cached_tokens", sa.Integer),
        # The whole reply body: what books made before ``content`` hold for answered lines.
        sa.Column("response", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("error_type", sa.String(64)),
        sa.Column("retryable", sa.Boolean, nullable=False, default=False),
        # A batch's lines (marking those it never answered, forgetting a submission). On the
        # submission alone: a file's keys arrive in random order, but its index entries (after
        # the rowid on SQLite, the tuple id on PostgreSQL) are appended, so recording a line
        # costs one random B-tree insert (the key's) and not two. A line is found by its key
        # (the primary key's prefix), never through this index (see by_key in BatchBook).
        sa.Index(f"ix_{table}_batch_lines_submission", "submission_id"),
    )
    return batches, lines


def counts_text(request_counts: str | dict | None) -> str:
    counts = json.loads(request_counts) if isinstance(request_counts, str) else (
        request_counts or {})
    return (f"{counts.get('completed', 0)}/{counts.get('total', 0)} lines answered, "
            f"{counts.get('failed', 0)} failed")


__all__ = ["STALE_AFTER_S", "LineState", "book_tables", "counts_text", "owner_alive", "owner_id"]
