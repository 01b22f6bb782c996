"""``llm.filter`` and ``llm.classify``: ai_filter and ai_classify over a DataFrame, with cascades.

Both send exactly the requests SQL's ``ai_filter`` and ``ai_classify`` send (the catalogue's
system prompt and JSON schema), so answers are shared through the ledger. A row's text is its
one column, or ``"<column>: <value>"`` lines for several (NULL cells left out). Unlike SQL,
where an unreadable answer is a bare NULL, every NULL here has its reason:
``result.null_reasons`` (and the ``<output>_error`` column) says, per row, "no text" (nothing
was sent), ``invalid_structured_output: ...`` (the reply could not be read) or the request's
error. Nothing is dropped silently: ``result.df`` holds the rows that passed, ``result.table``
every row with the answer and its reason.

``mode="batch_api"`` sends the requests through an endpoint's offline batch API at its batch
price and waits for the answers; ``deadline=`` as for ``infer``. With a cascade, the oracle's
requests (the sample, then the uncertain rows) go as batches and the proxy answers online: its
confidence comes from logprobs, which batch result lines are not read for.

Example::

    from dagster_batchllm.semantic import Cascade

    kept = llm.filter(tickets, predicate="The customer asks for a refund", columns=["body"],
                      cascade=Cascade(proxy="llama-8b", oracle="llama-70b"))
    kept.df                # the rows whose answer is true
    kept.null_reasons      # row index -> why its answer is NULL
    kept.cascade           # thresholds, the sample's precision and recall, the oracle's share
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..ai_functions.calls import BoundCall, read_outcome, sendable
from ..ai_functions.cascade_options import Cascade
from ..ai_functions.catalogue import FUNCTIONS
from ..core import InferenceConfigError, InferenceStats, check_delivery, run_sync
from .cascade import CLASSIFY, FILTER, CascadeReport, acascade

NO_TEXT = "no_text: every column of the row is NULL or blank; nothing was sent"


@dataclasses.dataclass
class SemanticResult:
    """``table``: every input row (same index) with ``<output>`` and ``<output>_error`` (the
    reason of each NULL answer); ``df``: what the call gives (filter: the rows that passed,
    without the two columns; classify: ``table``); ``cascade``: its report, or None."""

    df: Any
    table: Any
    output_column: str
    error_column: str
    stats: InferenceStats
    cascade: CascadeReport | None = None

    @property
    def null_reasons(self) -> Any:
        """Row index -> why its answer is NULL, for each row whose answer is NULL."""
        answers = self.table[self.output_column]
        return self.table.loc[answers.isna(), self.error_column]


def filter_rows(client: Any, df: Any, *, predicate: str, columns: Sequence[str],
                model: str | None = None, cascade: Cascade | None = None,
                output_column: str = "passes", **where: Any) -> SemanticResult:
    """The rows of ``df`` that satisfy ``predicate`` (see the module)."""
    return run_sync(afilter_rows(client, df, predicate=predicate, columns=columns, model=model,
                                 cascade=cascade, output_column=output_column, **where))


async def afilter_rows(client: Any, df: Any, *, predicate: str, columns: Sequence[str],
                       model: str | None = None, cascade: Cascade | None = None,
                       output_column: str = "passes", **where: Any) -> SemanticResult:
    """:func:`filter_rows`, awaited."""
    bound = FUNCTIONS["ai_filter"].bind({"predicate": predicate, "cascade": cascade})
    result = await _aanswer(client, df, bound, FILTER, columns, model, output_column, where)
    passed = result.table[output_column].eq(True).to_numpy()
    result.df = df.loc[passed]
    return result


def classify_rows(client: Any, df: Any, *, labels: Sequence[str], column: str,
                  model: str | None = None, cascade: Cascade | None = None,
                  output_column: str = "label", **where: Any) -> SemanticResult:
    """Each row's label among ``labels`` (see the module)."""
    return run_sync(aclassify_rows(client, df, labels=labels, column=column, model=model,
                                   cascade=cascade, output_column=output_column, **where))


async def aclassify_rows(client: Any, df: Any, *, labels: Sequence[str], column: str,
                         model: str | None = None, cascade: Cascade | None = None,
                         output_column: str = "label", **where: Any) -> SemanticResult:
    """:func:`classify_rows`, awaited."""
    bound = FUNCTIONS["ai_classify"].bind({"labels": list(labels), "cascade": cascade})
    return await _aanswer(client, df, bound, CLASSIFY, [column], model, output_column, where)


async def _aanswer(client: Any, df: Any, bound: BoundCall, kind: str, columns: Sequence[str],
                   model: str | None, output_column: str, where: dict[str, Any]
                   ) -> SemanticResult:
    import pandas as pd

    function = bound.function
    texts = row_texts(df, columns, function)
    error_column = f"{output_column}_error"
    for name in (output_column, error_column):
        if name in df.columns:
            raise InferenceConfigError(
                f"{function}: the input already has a column '{name}'; pass another "
                "output_column.")
    unknown = sorted(set(where) - {"partition_key", "scope", "run_id", "logger", "mode",
                                   "wait", "deadline"})
    if unknown:
        raise InferenceConfigError(f"{function}: unknown argument(s) {unknown}.")
    delivery = _delivery(function, where)
    served = client.settings.models
    if bound.cascade is not None:
        if model is not None:
            raise InferenceConfigError(
                f"{function}: pass model= or cascade=, not both: the cascade names its models.")
        bound.cascade.check_models(served, function)
    else:
        model = model or client.settings.model_when_unnamed
        if model not in served:
            said = f"model '{model}' is not served" if model else "no model is named"
            raise InferenceConfigError(
                f"{function}: {said}; pass model= (one of {sorted(served)}) or cascade=.")
    strict = dataclasses.replace(bound, null_when_unreadable=False)  # every NULL has a reason
    sent = [i for i, text in enumerate(texts) if text is not None]
    outcomes: list[tuple[Any, str | None]] = [(None, NO_TEXT)] * len(texts)
    report, stats = None, InferenceStats()
    if sent and bound.cascade is not None:
        done = await acascade(client, bound, [texts[i] for i in sent], bound.cascade,
                              kind=kind, oracle_delivery=delivery, **where)
        report, stats, answered = done.report, done.stats, done.outcomes
    elif sent:
        call = bound.inference_call(prompt_column="prompt", output_column="output",
                                    error_column="error", model=model,
                                    partition_key=where.get("partition_key"),
                                    scope=where.get("scope"))
        result = await client.arun_call(pd.DataFrame({"prompt": [texts[i] for i in sent]}),
                                        call, run_id=where.get("run_id"),
                                        logger=where.get("logger"), **delivery)
        stats = result.stats
        answered = [read_outcome(strict, raw) for raw in zip(
            result.df["output"].tolist(), result.df["error"].tolist(), strict=True)]
    for i, outcome in zip(sent, answered if sent else [], strict=True):
        outcomes[i] = outcome
    table = df.copy(deep=False)
    table[output_column] = pd.Series([v for v, _ in outcomes], index=df.index, dtype=object)
    table[error_column] = pd.Series([e for _, e in outcomes], index=df.index, dtype=object)
    return SemanticResult(df=table, table=table, output_column=output_column,
                          error_column=error_column, stats=stats, cascade=report)


def _delivery(function: str, where: dict[str, Any]) -> dict[str, Any]:
    """``mode``/``wait``/``deadline`` of the call (of a cascade's oracle), taken out of
    ``where`` and checked now: a cascade's proxy is paid before the oracle's call would check
    them. Through a batch API the call waits for its batches: the rows a filter keeps are
    known only once every row is answered."""
    mode, wait = where.pop("mode", "online"), where.pop("wait", True)
    deadline = where.pop("deadline", None)
    try:
        check_delivery(mode, wait, deadline)
    except InferenceConfigError as exc:
        raise InferenceConfigError(f"{function}: {exc}") from None
    if wait is not True:
        raise InferenceConfigError(
            f"{function}: wait must be True: which rows pass is known only once every row is "
            "answered (for answers collected later, infer() with wait=False and the "
            "batch-collect sensor).")
    return {} if mode == "online" else {"mode": mode, "wait": True, "deadline": deadline}


def row_texts(df: Any, columns: Sequence[str], function: str) -> list[str | None]:
    """Each row's text: its one column, or ``"<column>: <value>"`` lines; None: nothing."""
    if isinstance(columns, str) or not columns:
        raise InferenceConfigError(
            f"{function}: columns must be a non-empty list of column names, got {columns!r}.")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InferenceConfigError(
            f"{function}: column(s) {missing} are not in the table; its columns: "
            f"{list(df.columns)[:50]}.")
    cells = [df[c].tolist() for c in columns]
    texts: list[str | None] = []
    for row in zip(*cells, strict=True):
        present = [(c, str(v)) for c, v in zip(columns, row, strict=True) if sendable(v)
                   and str(v).strip()]
        if not present:
            texts.append(None)
        elif len(columns) == 1:
            texts.append(present[0][1])
        else:
            texts.append("\n".join(f"{c}: {v}" for c, v in present))
    return texts
