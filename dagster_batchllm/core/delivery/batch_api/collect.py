"""Polling batches and collecting the ones that ended into the batch book.

:meth:`BatchCollector.refresh` looks at every batch of the book not yet collected: a
submission whose process died before the provider created its batch is adopted (found by its
submission id in the batch's metadata) or forgotten (its keys are then submitted again); a live
batch is polled; an ended one is claimed (so two runs never collect it both) and its output and
error files are streamed into its lines: the reply read (its text, usage and finish reason)
for each answered line, and a reply that is no completion as that line's error; the error (and
whether a retry may fix it: 429, 5xx) for each failed one, and ``missing`` for the lines an
expired or cancelled batch never answered. The engine's next pass turns those into row outcomes
(the answers of its own partition's batches it takes from :attr:`BatchCollector.answers`,
without reading them back). The usual chat answers are read in Arrow, in blocks of lines, as
columns (see :mod:`.lines`); SQLite lines are settled by rowid.

A batch of the call's own partition whose answers all fit in that hold is *in hand*
(:attr:`BatchCollector.in_hand`): its answers are written once, by the pass, to the ledger,
and the book marks them answered without a copy (:meth:`BatchCollector.deliver_in_hand`). Till
then the batch stays "collecting" by this process, so a process killed meanwhile leaves it to
the next run, which collects it again from the provider's output file: nothing is paid twice
and nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from itertools import starmap
from typing import Any

from ...errors import ErrorType, RowError
from ...redaction import Redactor
from .book import (
    COLLECTED,
    COLLECTING,
    ENDED,
    LINE_FAILED,
    LINE_OK,
    SUBMIT_FAILED,
    SUBMITTING,
    BatchBook,
)
from .lines import AnswerBlock
from .protocol import BatchProtocol, BatchStatus, LineResult
from .readers import line_reader
from .tables import counts_text, owner_alive, owner_id

_SETTLE_CHUNK = 8192  # lines per book transaction (see in_key_order)
# Answered lines a collector holds for its call's next pass (see BatchCollector.answers): a
# pass over that many rows reads no line of them back from the book, for about 30 MB held.
HELD_ANSWERS = 1 << 17
# Batches a collector of this process is collecting, or holds the answers of: a "collecting"
# batch of this process that is not here was left by a call that ended (collected again).
_HERE: set[str] = set()
_HERE_LOCK = threading.Lock()


class BatchCollector:
    def __init__(self, book: BatchBook, protocols: dict[str, BatchProtocol], *,
                 log: Any = None, hold_for: tuple[str, str] | None = None):
        self.book = book
        self.protocols = protocols
        self.log = log or logging.getLogger("dagster_batchllm")
        self._collecting = True
        #: The answered lines of the batches of partition ``hold_for`` (scope, partition key)
        #: that this collector collected, by key, as the book now holds them (up to
        #: HELD_ANSWERS; see _hold): the call's next pass takes them from here instead of
        #: reading each back. Only a cache: the book has every line.
        self.answers: dict[str, tuple] = {}
        self._hold_for = hold_for
        #: Batches of the call's partition whose answers are only here (and at the provider)
        #: until the call's pass has written them to the ledger: submission id -> (the batch's
        #: row, its provider status, the keys answered). They stay "collecting", by this
        #: process, till :meth:`deliver_in_hand`; a process killed meanwhile leaves them to
        #: the next run, which collects them again. So an answer is written once, to the
        #: ledger, not to the book and then the ledger.
        self.in_hand: dict[str, tuple[dict[str, Any], str, list[str]]] = {}

    async def refresh(self, only: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Poll, recover and collect the unfinished batches (all, or the submission ids
        ``only``); their rows as they are now, collected ones included."""
        return await asyncio.to_thread(self.refresh_blocking, only)

    def refresh_blocking(self, only: Iterable[str] | None = None, *,
                         collect: bool = True) -> list[dict[str, Any]]:
        """``collect=False`` (a sensor): poll and record the statuses only; the run that the
        sensor launches collects."""
        self._collecting = collect
        wanted = set(only) if only is not None else None
        rows = []
        for row in self.book.unfinished(self.protocols):
            if wanted is not None and row["submission_id"] not in wanted:
                continue
            try:
                rows.append(self._refresh_one(row))
            except Exception as exc:  # a poll that fails is tried again at the next one
                name = row["batch_id"] or row["submission_id"]
                # (the provider's error text may quote the key: redacted, as its errors are)
                said = self.protocols[row["endpoint"]].redact.describe(exc)
                self.log.warning(f"batchllm: checking batch {name} on '{row['endpoint']}' "
                                 f"failed: {said}; checked again at the next poll")
                rows.append(row)
        if wanted is not None:  # those collected or refused meanwhile, by us or another run
            seen = {r["submission_id"] for r in rows}
            for sub in wanted - seen:
                found = self.book.batch(sub)
                if found is not None:
                    rows.append(found)
        return rows

    def _refresh_one(self, row: dict[str, Any]) -> dict[str, Any]:
        protocol = self.protocols[row["endpoint"]]
        sub = row["submission_id"]
        if row["status"] == SUBMITTING:
            if owner_alive(row["owner"], row["updated_at"]):
                return row  # being written or uploaded by a live run: wait for it
            batch_id = protocol.find(sub)
            if batch_id is None:
                self.log.warning(f"batchllm: batch file {sub} was never submitted (its run "
                                 "ended first); its rows are submitted again")
                self.book.forget_submission(sub)
                return {**row, "status": SUBMIT_FAILED, "lines": 0}
            self.book.update_batch(sub, batch_id=batch_id, status="validating")
            row = {**row, "batch_id": batch_id, "status": "validating"}
        if row["status"] in ENDED and not self._collecting:
            return row
        if row["status"] == COLLECTING:
            if sub in self.in_hand:  # collected: its answers wait here for the next pass
                return {**row, "status": COLLECTED}
            if (not self._collecting or sub in _HERE
                    or (row["owner"] != owner_id()  # else a call of this process gave it up
                        and owner_alive(row["owner"], row["updated_at"]))):
                return row
            with self._taken(sub) as mine:
                if not mine or not self.book.claim(sub, COLLECTING, COLLECTING):
                    return row
                status = protocol.poll(row["batch_id"])  # its collector died: collect again
                return self._collect(row, status)
        status = protocol.poll(row["batch_id"])
        counts = json.dumps(status.request_counts)
        if not status.ended:
            if status.status != row["status"] or counts != row["request_counts"]:
                self.book.update_batch(sub, expect_status=row["status"], status=status.status,
                                       request_counts=counts)
            return {**row, "status": status.status, "request_counts": counts}
        if not self._collecting:
            if status.status != row["status"]:
                self.book.update_batch(sub, expect_status=row["status"], status=status.status,
                                       request_counts=counts)
            return {**row, "status": status.status, "request_counts": counts}
        ended_at = time.time()
        with self._taken(sub) as mine:
            if not mine or not self.book.claim(
                    sub, row["status"], COLLECTING, request_counts=counts,
                    output_file_id=status.output_file_id, error_file_id=status.error_file_id,
                    errors=status.errors, ended_at=ended_at):
                return self.book.batch(sub) or row  # another run collects it
            return self._collect({**row, "request_counts": counts, "ended_at": ended_at},
                                 status)

    @contextlib.contextmanager
    def _taken(self, submission_id: str) -> Iterator[bool]:
        """Whether no other collector of this process has the batch; it is this one's while
        the block runs (from before its claim in the book, so two of one process never both
        collect a batch that a call of theirs gave up), and after it while in hand."""
        with _HERE_LOCK:
            mine = submission_id not in _HERE
            _HERE.add(submission_id)
        try:
            yield mine
        finally:
            if mine and submission_id not in self.in_hand:
                _let_go(submission_id)

    def _collect(self, row: dict[str, Any], status: BatchStatus) -> dict[str, Any]:
        sub, protocol = row["submission_id"], self.protocols[row["endpoint"]]
        # A route's replies are read into answered lines (the answer the ledger keeps, and
        # usage) once, when the batch is collected, not again by the pass that hands them on.
        read, endpoint = line_reader(row["route"], what=f"batch {sub}"), row["endpoint"]
        ok = failed = 0
        outcomes: list[tuple] = []
        # Not an overtaken batch's (its rows went online at a deadline): its answers go to
        # the book, where a pass finds them only for rows the ledger has no answer for.
        room = (HELD_ANSWERS - len(self.answers)
                if self._hold_for == (row["scope"], row["partition_key"])
                and not row.get("overtaken_at") else 0)
        hold = room > 0
        places = self.book.line_places(sub)  # where each line is, and its attempt
        # Every answer of a batch of the call's partition fits in the hold: they are written
        # to the ledger by the call's pass, and not to the book first (see in_hand).
        in_hand = hold and len(places) <= room and status.status != "failed"
        # The answered lines (key, text, prompt and completion tokens, finish reason), to
        # hold once all are written.
        held: list[tuple] = []
        for result in protocol.results(status, row["route"]):
            if type(result) is AnswerBlock:  # many lines' answers, as columns
                ok += len(result.keys)
                if hold:
                    held.extend(zip(*result, strict=True))
                if not in_hand:
                    outcomes.extend(starmap(_ok_line, zip(*result, strict=True)))
            elif _read_line(result, read, endpoint, outcomes, held if hold else None,
                            in_hand, protocol.redact):
                ok += 1
            elif not result.expired:  # expired: "missing", marked below
                failed += 1
            if len(outcomes) >= _SETTLE_CHUNK:
                self.book.settle_lines(sub, outcomes, places)
                outcomes = []
        self.book.settle_lines(sub, outcomes, places)
        name = status.batch_id
        if status.status == "failed":
            self.book.fail_lines(sub, f"batch {name} failed: {status.errors or 'no reason given'}",
                                 ErrorType.BAD_REQUEST.value, False)
        unanswered = f"batch {name} {status.status} before this line was answered"
        if in_hand:
            # Its answered lines stay pending until the pass has their records in the ledger:
            # only the others are unanswered.
            answered = [answer[0] for answer in held]
            seen = set(answered)  # (and the failed lines, which are no longer pending)
            missing = self.book.mark_missing(sub, unanswered, ErrorType.TIMEOUT.value,
                                             keys=[key for key in places if key not in seen])
            self.in_hand[sub] = (row, status.status, answered)
        else:
            missing = self.book.mark_missing(sub, unanswered, ErrorType.TIMEOUT.value)
            self.book.update_batch(sub, status=COLLECTED)
        if held:
            self._hold(row, held, places)
        self.log.info(f"batchllm: collected batch {name} ({status.status}): {ok} answered, "
                      f"{failed} failed, {missing} unanswered")
        return {**row, "status": COLLECTED, "provider_status": status.status}

    def deliver_in_hand(self, taken: set[str]) -> None:
        """After the call's pass wrote its records: the batches in hand become collected.
        Their answers the pass did not take (rows no longer in the table), or took and the
        task refused (a failed record, which a rerun reads the answer again for), are written
        to the book; the rest are ``ok`` there with their answers in the ledger."""
        if not self.in_hand:
            return
        refused = self.book.failed_records(*self._hold_for) if self._hold_for else set()
        for sub, (_row, _status, keys) in list(self.in_hand.items()):
            write = [key for key in keys if key not in taken or key in refused]
            self.book.settle_lines(sub, self._outcomes(write))
            self.book.settle_delivered(sub)
            self.book.update_batch(sub, status=COLLECTED)
            self._forget(sub, keys)

    def release_in_hand(self) -> None:
        """After a pass that did not end (a stop, an error): the answers in hand are written
        to the book, as a batch not held is, so none waits on this process; where even that
        fails, the batch is handed back to its provider status, for the next run to collect
        again (its output file is still there)."""
        for sub, (_row, provider_status, keys) in list(self.in_hand.items()):
            try:
                self.book.settle_lines(sub, self._outcomes(keys))
                self.book.update_batch(sub, status=COLLECTED)
            except Exception as exc:
                self.log.warning(f"batchllm: writing the answers of batch {sub} to the book "
                                 f"failed ({type(exc).__name__}: {str(exc)[:300]}); the next "
                                 "run collects the batch again")
                try:
                    self.book.update_batch(sub, expect_status=COLLECTING,
                                           status=provider_status)
                except Exception:  # the book is out of reach: its owner check frees it later
                    self.log.warning(f"batchllm: batch {sub} stays marked as collecting until "
                                     "this process ends")
            finally:
                self._forget(sub, keys)

    def _forget(self, submission_id: str, keys: list[str]) -> None:
        """A batch no longer in hand: its answers dropped, free for any collector."""
        for key in keys:
            self.answers.pop(key, None)
        del self.in_hand[submission_id]
        _let_go(submission_id)

    def _outcomes(self, keys: list[str]) -> list[tuple]:
        """Held answers as the book's line outcomes."""
        outcomes = []
        for key in keys:
            held = self.answers.get(key)
            if held is not None:
                _batch, _attempt, content, prompt, completion, reason, cached, _key = held
                outcomes.append(_ok_line(key, content, prompt, completion, reason, cached))
        return outcomes

    def _hold(self, row: dict[str, Any], held: list[tuple],
              places: dict[str, tuple[int | None, int]]) -> None:
        """The answered lines of a batch just collected: (the batch's id, submission id,
        creation and end; the line's attempt, text, tokens, finish reason, cached tokens and
        key) by key, a sixth of what each line's LineState would hold."""
        batch = (row["submission_id"], row["batch_id"], row["created_at"], row["ended_at"])
        answers, room = self.answers, HELD_ANSWERS - len(self.answers)
        for key, content, prompt, completion, reason, cached in held[:room]:
            place = places.get(key)
            if place is not None:  # (else a line this batch does not have: the book's none)
                answers[key] = (batch, place[1], content, prompt, completion, reason, cached,
                                key)  # the key last: the delivery reads it there


def _let_go(submission_id: str) -> None:
    with _HERE_LOCK:
        _HERE.discard(submission_id)


def _ok_line(key: str, content: str, prompt: int, completion: int, reason: str | None,
             cached: int) -> tuple:
    """An answered line's outcome, as BatchBook.settle_lines takes it."""
    return LINE_OK, content, prompt, completion, reason, None, None, False, cached, key


def _read_line(result: LineResult, read: Any, endpoint: str, outcomes: list[tuple],
               held: list[tuple] | None, in_hand: bool, redact: Redactor) -> bool:
    """One result line into its outcome (an answer held, and written unless ``in_hand``; a
    failure written, its text redacted where it quotes the reply; nothing for an expired
    line); whether it was answered."""
    error = result.error
    if error is None:
        try:
            answer = read(result.reply, endpoint=endpoint, latency_s=0.0)
        except RowError as exc:  # a 200 that is no completion: the row fails with it, as
            error = redact.error(exc)  # when a pass read the reply (it is not asked again)
        else:
            found = (result.request_key, answer.content, answer.prompt_tokens,
                     answer.completion_tokens, answer.finish_reason, answer.cached_tokens)
            if held is not None:
                held.append(found)
            if not in_hand:
                outcomes.append(_ok_line(*found))
            return True
    if not result.expired:
        outcomes.append((LINE_FAILED, None, 0, 0, None, error.message, error.error_type.value,
                         bool(error.retryable) and result.error is not None, None,
                         result.request_key))
    return False


def progress_line(rows: list[dict[str, Any]]) -> str:
    """One log line on the batches still pending."""
    pending = [r for r in rows if r["status"] not in (COLLECTED, SUBMIT_FAILED)]
    parts = [f"{r['batch_id'] or r['submission_id']} {r['status']} "
             f"({counts_text(r.get('request_counts'))})" for r in pending[:5]]
    more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
    return f"{len(pending)} batches pending: " + "; ".join(parts) + more


__all__ = ["ENDED", "BatchCollector", "progress_line"]
