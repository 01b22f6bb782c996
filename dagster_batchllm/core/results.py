"""What a call returns: the table with its new columns, each row's outcome as data, and the
figures of the run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class RowStatus(IntEnum):
    """How a row ended (the engine keeps one byte per row; ``PENDING`` until it ends)."""

    PENDING = 0
    OK = 1  # answered by the endpoint, or by an identical row of the same call
    CACHED = 2  # answered from the ledger
    FAILED = 3
    DEFERRED = 4  # not sent: the token budget ran out; a later call sends it

    @property
    def label(self) -> str:
        return self.name.lower()


# The figures of InferenceStats that several calls' add up to (InferenceStats.add).
_SUMMED = ("rows", "succeeded", "failed", "deferred", "cached", "deduplicated", "requests",
           "retries", "prompt_tokens", "completion_tokens", "cached_tokens", "elapsed_s",
           "usage_corrected")


@dataclass
class InferenceStats:
    """Figures of one ``infer`` call; ``as_dict()`` feeds Dagster metadata."""

    rows: int = 0
    succeeded: int = 0
    failed: int = 0
    deferred: int = 0
    cached: int = 0
    deduplicated: int = 0
    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens_by_model: dict[str, dict[str, int]] = field(default_factory=dict)
    errors_by_type: dict[str, int] = field(default_factory=dict)
    estimated_cost_usd: float | None = None
    #: What this call paid: the sum of the costs of the replies it got, each at the price of
    #: the endpoint that gave it (cached prompt tokens at the cached price, batch lines at
    #: the batch price), as the ledger keeps them; None where a reply had no price.
    cost_usd: float | None = None
    #: Of ``prompt_tokens``, those the servers answered from their prefix caches.
    cached_tokens: int = 0
    #: "online", or "batch_api" (priced at the batch price; online_cost_usd: the same tokens
    #: at the online price)
    mode: str = "online"
    online_cost_usd: float | None = None
    #: A batch-mode call with a deadline: the deadline and when the call finished, whether
    #: it was met, when the rows still unanswered went online, rows answered by batch and
    #: online, and rows answered by both (``duplicate_rows``, ``duplicate_cost_usd``).
    deadline: dict[str, Any] | None = None
    #: Replies whose usage a server reported as no token count (negative, fractional, not a
    #: number) or past the request's bound, counted at that bound instead (see
    #: ``core/usage.py``; the ledger's rows say what was reported, ``usage_corrected``).
    usage_corrected: int = 0

    def add(self, other: InferenceStats) -> None:
        """Add another call's figures to these (several calls reported as one): counts, tokens
        per model, errors by type and the costs that are known. Latency percentiles and the
        per-endpoint figures are not added."""
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for model, tokens in other.tokens_by_model.items():
            mine = self.tokens_by_model.setdefault(model, {})
            for key, value in tokens.items():
                mine[key] = mine.get(key, 0) + value
        for error_type, n in other.errors_by_type.items():
            self.errors_by_type[error_type] = self.errors_by_type.get(error_type, 0) + n
        for name, digits in (("cost_usd", 9), ("estimated_cost_usd", 6)):
            if getattr(other, name) is not None:
                setattr(self, name, round((getattr(self, name) or 0.0) + getattr(other, name),
                                          digits))

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def failure_rate(self) -> float:
        return self.failed / self.rows if self.rows else 0.0

    @property
    def cached_share(self) -> float:
        """The share of the prompt tokens sent that the servers' prefix caches answered."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rows_per_s"] = round(self.rows_per_s, 2)
        data["failure_rate"] = round(self.failure_rate, 6)
        data["cached_share"] = round(self.cached_share, 6)
        return data

    def summary(self) -> str:
        corrected = (f", {self.usage_corrected} with the server's usage corrected to the "
                     "request's bound" if self.usage_corrected else "")
        return (
            f"{self.rows} rows: {self.succeeded} ok ({self.cached} from the ledger), "
            f"{self.failed} failed, {self.deferred} deferred; {self.requests} requests, "
            f"{self.retries} retries, {self.prompt_tokens + self.completion_tokens} tokens"
            f"{corrected}, {self.elapsed_s:.1f} s ({self.rows_per_s:.0f} rows/s)"
        )


@dataclass
class InferenceResult:
    """``df``: the input rows, same index and order, plus ``<output>`` and ``<output>_error``.

    Per row, as data aligned with ``df.index`` (so nobody parses the error text):
    ``error_types``, the :class:`~.errors.ErrorType` value of its error (``ErrorType.DEFERRED``
    for a row the token budget deferred) or None; ``statuses``, how it ended: the label of its
    :class:`RowStatus` (ok, cached: from the ledger, failed or deferred).
    """

    df: Any
    stats: InferenceStats
    output_column: str
    error_column: str
    error_types: Any  # pandas Series of str | None
    statuses: Any  # pandas Series, categorical over the RowStatus labels
    # The distinct request keys the rows asked for, when the call collected them
    # (``collect_keys=True``, or ``supersede_stale``); None otherwise (they cost memory per row).
    request_keys: frozenset[str] | None = None

    @classmethod
    def of_run(cls, df: Any, run: Any, *, output_column: str, error_column: str,
               **fields: Any) -> Any:
        """The result of an engine run over ``df`` (its outputs, errors and outcomes per row,
        in input order); ``fields``: what a subclass adds."""
        import pandas as pd

        out = df.copy(deep=False)
        out[output_column] = pd.Series(run.outputs, index=df.index, dtype=object)
        out[error_column] = pd.Series(run.errors, index=df.index, dtype=object)
        error_types, statuses = row_outcome_columns(run.error_types, run.row_status, df.index)
        return cls(df=out, stats=run.stats, output_column=output_column,
                   error_column=error_column, error_types=error_types, statuses=statuses,
                   request_keys=frozenset(run.keys) if run.keys is not None else None, **fields)

    @property
    def failed_rows(self):
        """Rows with an error: failed or deferred (see ``statuses`` to tell them apart)."""
        return self.df[self.df[self.error_column].notna()]

    @property
    def deferred_rows(self):
        return self.df[(self.statuses == RowStatus.DEFERRED.label).to_numpy()]


def row_outcome_columns(error_types: Sequence[str | None], statuses: bytes | bytearray,
                        index: Any) -> tuple[Any, Any]:
    """The ``error_types`` and ``statuses`` Series of a result, from what the engine keeps:
    ``error_types``, each row's error type (None for a row without an error); ``statuses``,
    one ``RowStatus`` byte per row."""
    import numpy as np
    import pandas as pd

    types = np.empty(len(statuses), dtype=object)
    types[:] = error_types
    labels = [status.label for status in RowStatus]
    return (pd.Series(types, index=index, dtype=object),
            pd.Series(pd.Categorical.from_codes(np.frombuffer(statuses, dtype=np.uint8),
                                                categories=labels), index=index))


@dataclass
class InferenceEstimate:
    """A dry run: what ``infer`` with the same arguments would send, without sending anything."""

    rows: int
    requests_to_send: int
    rows_answered_by_ledger: int
    rows_deduplicated: int
    invalid_rows: int
    estimated_prompt_tokens: int
    max_completion_tokens: int
    tokens_by_model: dict[str, dict[str, int]]
    estimated_cost_usd: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
