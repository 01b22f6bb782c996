"""One chaos scenario's figures, the rows it classifies, and the requirements it checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core import ErrorType
from .data import expected_reply

ERROR_CODES = {e.value for e in ErrorType} | {"internal_error"}


@dataclass
class Outcome:
    """One scenario's figures and the requirements it broke (``problems``: empty when it passed)."""

    name: str
    # The output rows: each ok (``wrong`` if with another row's answer), failed (``failures``:
    # by error code), deferred, or missing (no outcome at all).
    rows: int = 0
    ok: int = 0
    wrong: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    deferred: int = 0
    missing: int = 0
    # Measured at the servers: requests that arrived (``statuses``: by answer), 200 answers
    # given to a request already answered (``allowed_duplicates``: those in flight at crashes),
    # tokens billed (``clean_tokens``: with nothing going wrong) against the ``budget``.
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    allowed_duplicates: int = 0
    tokens: int = 0
    clean_tokens: int | None = None
    budget: int | None = None
    limits: str = ""
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def require(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    def as_row(self) -> list[str]:
        tokens = f"{self.tokens:,}"
        if self.clean_tokens:
            tokens += f" ({self.tokens / self.clean_tokens:.2f}x of {self.clean_tokens:,})"
        if self.budget is not None:
            tokens += f"; budget {self.budget:,}"
        dups = str(self.duplicates)
        if self.allowed_duplicates:
            dups += f" (<= {self.allowed_duplicates} in flight at crashes)"
        return [
            self.name,
            f"{self.ok} / {self.failed} / {self.deferred} / {self.missing}",
            str(self.requests), dups, tokens, self.limits, f"{self.wall_s:.1f}",
        ]


def classify_rows(outcome: Outcome, frames: list, *, structured: bool = False) -> None:
    """Count ok / failed / deferred / missing rows over (input, output) pairs of frames (the
    output None when the run gave none); check every answer."""
    for df, out in frames:
        outcome.rows += len(df)
        if out is None or len(out) != len(df) or not out.index.equals(df.index):
            outcome.missing += len(df)
            outcome.problems.append("the result lost rows or reordered the index")
            continue
        for ticket, text, value, error in zip(df["ticket"], df["text"], out["summary"],
                                              out["summary_error"], strict=True):
            if error is None and value is not None:
                outcome.ok += 1
                if value != expected_reply(ticket, text, structured):
                    outcome.wrong += 1
            elif isinstance(error, str) and value is None and error.startswith("deferred:"):
                outcome.deferred += 1
            elif (isinstance(error, str) and value is None
                  and error.split(":", 1)[0] in ERROR_CODES and len(error.split(":", 1)[1]) > 2):
                outcome.failed += 1
                code = error.split(":", 1)[0]
                outcome.failures[code] = outcome.failures.get(code, 0) + 1
            else:
                outcome.missing += 1


def finish(outcome: Outcome) -> Outcome:
    """Check the requirements every scenario has."""
    outcome.require(outcome.missing == 0, f"{outcome.missing} rows have no outcome")
    outcome.require(outcome.wrong == 0, f"{outcome.wrong} rows got another row's answer")
    outcome.require(outcome.duplicates <= outcome.allowed_duplicates,
                    f"{outcome.duplicates} duplicate deliveries "
                    f"(allowed: {outcome.allowed_duplicates}, the requests in flight at crashes)")
    if outcome.budget is not None:
        outcome.require(outcome.tokens <= outcome.budget,
                        f"the servers billed {outcome.tokens} tokens over a budget of "
                        f"{outcome.budget}")
    return outcome
