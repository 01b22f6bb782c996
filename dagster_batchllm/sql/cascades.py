"""Cascades on DuckDB: a collecting pass first, so a cascade sees all of its call's rows.

A cascade (``ai_filter(..., cascade := {...})``, ``ai_classify(..., cascade := {...})``; see
:mod:`dagster_batchllm.semantic.cascade`) learns its thresholds on a sample of the call's rows,
so it must have them all at once, while DuckDB hands a function one vector (2048 rows) at a
time. ``execute()`` therefore runs a statement that mentions ``cascade`` twice, as SQLite's
``execute()`` does every statement:

1. **Collect**, inside a transaction that is rolled back: the cascade calls record the rows
   they have no answer for yet and return NULL for them (so a ``WHERE ai_filter(...)`` keeps
   nothing yet, and what depends on it sends nothing); the other AI functions answer as usual
   (answers go to the ledger once).
2. Each cascade call answers all its rows at once; then the statement runs for real, the
   cascade calls answered from memory. A cascade fed by another cascade's answers takes one
   more collect pass (up to ``_MAX_PASSES``).

Which statements: those whose text has the word ``cascade`` (a column of that name too: such
a statement just runs one collecting pass more, its other AI calls then answered from the
ledger). A cascade called outside ``execute()`` (``con.sql(...)``) would see one vector at a
time: it raises :class:`InferenceConfigError` before sending, saying to use ``execute()``. Inside a
transaction of the caller's own, the collect pass cannot roll back: it runs in that transaction
(a SELECT is unaffected; an INSERT ... SELECT would insert its collect pass's rows too, so
such a statement raises, saying to commit first).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from ..ai_functions.calls import BoundCall
from ..core import InferenceConfigError
from .runtime import NULL_OUTCOME, Outcome, Row, Runtime

_MENTIONS_CASCADE = re.compile(r"\bcascade\b", re.IGNORECASE)
_WRITES = re.compile(r"^\s*(insert|update|delete|create|copy|merge)\b", re.IGNORECASE)
_MAX_PASSES = 4


class CascadeCollector:
    """The cascade calls' rows and answers of the statement ``execute()`` is running."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._lock = threading.Lock()  # DuckDB evaluates vectors on several threads
        self._collecting = False
        self._pending: dict[BoundCall, dict[tuple[str, str], None]] = {}
        self._answers: dict[tuple[BoundCall, str], Outcome] = {}

    def collect(self, connection: Any, query: str, parameters: Any) -> None:
        """Answer every cascade call of ``query`` over all of its rows (see the module)."""
        import duckdb

        self._answers.clear()
        if not _MENTIONS_CASCADE.search(query):
            return
        for _ in range(_MAX_PASSES):
            self._pending = {}
            try:
                connection.execute("BEGIN TRANSACTION")
                began = True
            except duckdb.TransactionException:
                if _WRITES.match(query):
                    raise InferenceConfigError(
                        "A statement with a cascade runs a collecting pass first, rolled back "
                        "afterwards; inside your own transaction it cannot be, and this one "
                        "writes. Commit first, or run it outside the transaction.") from None
                began = False
            self._collecting = True
            try:
                connection.execute(query, parameters).fetchall()
            finally:
                self._collecting = False
                if began:
                    connection.execute("ROLLBACK")
            if not self._pending:
                return
            pending, self._pending = self._pending, {}
            batches = [(call, list(rows)) for call, rows in pending.items()]
            for (call, rows), outcomes in zip(batches, self.runtime.answer(batches),
                                              strict=True):
                for (_, text), outcome in zip(rows, outcomes, strict=True):
                    self._answers[(call, text)] = outcome

    def answer(self, function: str, batches: Sequence[tuple[BoundCall, list[Row]]]
               ) -> list[list[Outcome]]:
        """``runtime.answer(batches)``, except that a cascade's rows are recorded (collecting)
        or answered from what the collect pass learned."""
        plain = [(call, rows) for call, rows in batches if call.cascade is None]
        answered = iter(self.runtime.answer(plain) if plain else [])
        results: list[list[Outcome]] = []
        for call, rows in batches:
            if call.cascade is None:
                results.append(next(answered))
            elif self._collecting:  # known rows answered, so what depends on them shows up
                outcomes = []
                with self._lock:
                    for row in rows:
                        known = None if row[1] is None else self._answers.get((call, row[1]))
                        if row[1] is not None and known is None:
                            self._pending.setdefault(call, {})[(row[0], row[1])] = None
                        outcomes.append(known or NULL_OUTCOME)
                results.append(outcomes)
            else:
                results.append([self._known(function, call, row) for row in rows])
        return results

    def _known(self, function: str, call: BoundCall, row: Row) -> Outcome:
        if row[1] is None:
            return NULL_OUTCOME
        outcome = self._answers.get((call, row[1]))
        if outcome is None:
            raise InferenceConfigError(
                f"{function}: a cascade learns its thresholds over all the rows of the call at "
                "once, while DuckDB hands a function 2048 rows at a time: run the statement "
                "through dagster_batchllm.sql.execute(con, query), which collects them first.")
        return outcome
