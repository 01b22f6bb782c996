"""Polling batches and collecting the ones that ended into the batch book.

:meth:`BatchCollector.refresh` looks at every batch of the book not yet collected: a
submission whose process died before the provider created its batch is adopted (found by its
submission id in the batch's metadata) or forgotten (its keys are then submitted again); a live
batch is polled; an ended one is claimed (so two runs never collect it both) and its output and
error files are streamed into its lines: the reply read (its text, usage and finish reason)
for each answered line, and a reply that is no completion as that line's error; the error (and
whether a retry may fix it: 429, 5xx) for each failed one, and ``missing`` for the lines an
expired or cancelled batch never answered. The engine's next pass turns those into row outcomes
(the answers of its own partition's batches it takes from :attr:`BatchCollector.answers`, as
the book holds them, without reading them back). The usual chat answers are read in Arrow, in
blocks of lines (see :mod:`.batch_lines`); SQLite lines are settled by rowid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from .batch_book import (
    COLLECTED,
    COLLECTING,
    ENDED,
    LINE_FAILED,
    LINE_OK,
    SUBMIT_FAILED,
    SUBMITTING,
    BatchBook,
    LineState,
    counts_text,
    owner_alive,
)
from .batch_protocol import BatchProtocol, BatchStatus
from .errors import ErrorType, InferenceConfigError, RowError
from .transport import CHAT_ROUTE, completion_from_payload

# How a route's replies are read into an answered line (the chat completion's text and usage):
# once, when its batch is collected, not again by the pass that hands it to the engine.
_READERS = {CHAT_ROUTE: completion_from_payload}

_SETTLE_CHUNK = 8192  # lines per book transaction (see in_key_order)
# Answered lines a collector holds for its call's next pass (see BatchCollector.answers): a
# pass over that many rows reads no line of them back from the book, for about 30 MB held.
HELD_ANSWERS = 1 << 17


class BatchCollector:
    def __init__(self, book: BatchBook, protocols: dict[str, BatchProtocol], *,
                 log: Any = None, hold_for: tuple[str, str] | None = None):
        self.book = book
        self.protocols = protocols
        self.log = log or logging.getLogger("dagster_batchllm")
        self._collecting = True
        #: The answered lines of the batches of partition ``hold_for`` (scope, partition key)
        #: that this collector collected, by key, as the book now holds them (up to
        #: HELD_ANSWERS; see held_line): the call's next pass takes them from here instead of
        #: reading each back. Only a cache: the book has every line.
        self.answers: dict[str, tuple] = {}
        self._hold_for = hold_for

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
                self.log.warning(f"batchllm: checking batch {name} on '{row['endpoint']}' "
                                 f"failed: {type(exc).__name__}: "
                                 f"{str(exc)[:300]}; checked again at the next poll")
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
            if (not self._collecting or owner_alive(row["owner"], row["updated_at"])
                    or not self.book.claim(sub, COLLECTING, COLLECTING)):
                return row
            status = protocol.poll(row["batch_id"])  # its collector died: collect it again
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
        if not self.book.claim(sub, row["status"], COLLECTING, request_counts=counts,
                               output_file_id=status.output_file_id,
                               error_file_id=status.error_file_id, errors=status.errors,
                               ended_at=ended_at):
            return self.book.batch(sub) or row  # another run collects it
        return self._collect({**row, "request_counts": counts, "ended_at": ended_at}, status)

    def _collect(self, row: dict[str, Any], status: BatchStatus) -> dict[str, Any]:
        sub, protocol = row["submission_id"], self.protocols[row["endpoint"]]
        read, endpoint = _READERS.get(row["route"]), row["endpoint"]
        if read is None:
            raise InferenceConfigError(f"batch {sub} is of route {row['route']!r}, which "
                                       "this version cannot read")
        ok = failed = 0
        outcomes: list[tuple] = []
        hold = (self._hold_for == (row["scope"], row["partition_key"])
                and len(self.answers) < HELD_ANSWERS)
        places = self.book.line_places(sub)  # where each line is, and its attempt
        held: list[tuple] = []  # the answered lines' outcomes, to hold once all are written
        for result in protocol.results(status, row["route"]):
            error = result.error
            if error is None:
                try:
                    answer = result.answer or read(result.reply, endpoint=endpoint,
                                                   latency_s=0.0)
                except RowError as exc:  # a 200 that is no completion: the row fails with it,
                    error = exc  # as when a pass read the reply (it is not asked again)
                else:
                    ok += 1
                    outcomes.append((LINE_OK, answer.content, answer.prompt_tokens,
                                     answer.completion_tokens, answer.finish_reason, None, None,
                                     False, result.request_key))
                    if hold:
                        held.append(outcomes[-1])
            if error is not None and not result.expired:  # expired: "missing", marked below
                failed += 1
                outcomes.append((LINE_FAILED, None, 0, 0, None, error.message,
                                 error.error_type.value,
                                 bool(error.retryable) and result.error is not None,
                                 result.request_key))
            if len(outcomes) >= _SETTLE_CHUNK:
                self.book.settle_lines(sub, outcomes, places)
                outcomes = []
        self.book.settle_lines(sub, outcomes, places)
        name = status.batch_id
        if status.status == "failed":
            self.book.fail_lines(sub, f"batch {name} failed: {status.errors or 'no reason given'}",
                                 ErrorType.BAD_REQUEST.value, False)
        missing = self.book.mark_missing(
            sub, f"batch {name} {status.status} before this line was answered",
            ErrorType.TIMEOUT.value)
        self.book.update_batch(sub, status=COLLECTED)
        if held:
            self._hold(row, held, places)
        self.log.info(f"batchllm: collected batch {name} ({status.status}): {ok} answered, "
                      f"{failed} failed, {missing} unanswered")
        return {**row, "status": COLLECTED, "provider_status": status.status}

    def _hold(self, row: dict[str, Any], held: list[tuple],
              places: dict[str, tuple[int | None, int]]) -> None:
        """The answered lines of a batch just collected: (the batch's id, submission id,
        creation and end; the line's attempt, text, tokens and finish reason) by key, a
        sixth of what each line's LineState would hold."""
        batch = (row["submission_id"], row["batch_id"], row["created_at"], row["ended_at"])
        answers, room = self.answers, HELD_ANSWERS - len(self.answers)
        for _state, content, prompt, completion, reason, _e, _t, _r, key in held[:room]:
            place = places.get(key)
            if place is not None:  # (else a line this batch does not have: the book's none)
                answers[key] = (batch, place[1], content, prompt, completion, reason)

    @staticmethod
    def held_line(key: str, held: tuple) -> LineState:
        """A held answer as ``BatchBook.latest_lines`` reads its line."""
        (sub, batch_id, created, ended), attempt, content, prompt, completion, reason = held
        return LineState(key, sub, batch_id, COLLECTED, attempt, LINE_OK, content, reason, None,
                         prompt, completion, None, None, False, created, ended)


def progress_line(rows: list[dict[str, Any]]) -> str:
    """One log line on the batches still pending."""
    pending = [r for r in rows if r["status"] not in (COLLECTED, SUBMIT_FAILED)]
    parts = [f"{r['batch_id'] or r['submission_id']} {r['status']} "
             f"({counts_text(r.get('request_counts'))})" for r in pending[:5]]
    more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
    return f"{len(pending)} batches pending: " + "; ".join(parts) + more


__all__ = ["ENDED", "BatchCollector", "progress_line"]
