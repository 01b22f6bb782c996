"""``ai_agg`` and ``ai_summarize_agg`` on DuckDB and SQLite: aggregates answered in bulk.

DuckDB's Python API has no aggregate UDFs, but its macros may hold aggregates: ``ai_agg(expr,
instruction)`` is a macro over ``list(expr)``, the group's values as one list, handed to a
vectorized scalar function. DuckDB calls it with a whole vector of groups (up to 2048), and
every group of the vector is reduced at once, level by level, through the pool (one ``infer``
per level; :mod:`dagster_batchllm.semantic.reduce`)::

    ai_agg(expr, instruction, endpoint := NULL)
      -> __batchllm_agg('ai_agg', list(CAST(expr AS VARCHAR)), CAST(min(instruction) AS
                        VARCHAR), CAST(max(instruction) AS VARCHAR), CAST(min(endpoint) AS VARCHAR))

SQLite's ``create_aggregate`` takes a class whose ``finalize`` must return the group's value
before SQLite asks for the next group's: so there each group is reduced on its own (its levels'
requests still concurrent), one after another; arguments are positional (``ai_agg(expr,
instruction[, endpoint])``). Both engines answer through the connection's runtime, so the
answers share the ledger with every other AI function.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..ai_functions.aggregates import (
    AGGREGATES,
    AggregateFunction,
    group_failure,
    one_instruction,
)
from ..ai_functions.calls import sendable
from ..core import InferenceConfigError
from ..semantic.reduce import GroupInput, reduce_groups, reduce_options
from .runtime import Runtime

AGG_UDF = "__batchllm_agg"
# (texts, lowest instruction, highest instruction, endpoint) of one group; texts None: a group
# of no rows (a global aggregate over no input, whose every argument is NULL)
Group = tuple[Sequence[Any] | None, Any, Any, Any]
_SQLITE_ANSWERS_KEPT = 4096  # groups a connection remembers (each collect pass asks again)


def answer_groups(runtime: Runtime, function: AggregateFunction, groups: Sequence[Group]
                  ) -> list[str | None]:
    """Each group's answer (None for a group of no text); a group that fails fails the query,
    saying why, after every other group's answers are in the ledger. A group of no rows is
    NULL before its arguments are judged: it has no instruction or endpoint to judge (DuckDB
    hands NULL for each, as SQLite never finalizes such a group and Python has no group)."""
    settings = runtime.client.settings
    by_model: dict[str, list[int]] = {}
    inputs: dict[int, GroupInput] = {}
    for i, (values, lowest, highest, endpoint) in enumerate(groups):
        if values is None:
            continue
        instruction = one_instruction(function, lowest, highest)
        model = runtime.model_for(function.name, endpoint, required=False)
        by_model.setdefault(model, []).append(i)
        inputs[i] = GroupInput(instruction, [v for v in values if sendable(v)])
    answers: list[str | None] = [None] * len(groups)
    if not inputs:
        return answers
    runs = []
    for model, indices in by_model.items():
        options = reduce_options(
            settings, model=model, instructions=[inputs[i].instruction for i in indices],
            scope=runtime.scope or "", partition_key=runtime.partition_key or "",
            run_id=runtime.run_id, logger=runtime.logger)
        runs.append((indices, options))

    async def reduce_all() -> list:
        return list(await asyncio.gather(*(
            reduce_groups(runtime.client, [inputs[i] for i in indices], options)
            for indices, options in runs)))

    errors: list[str] = []
    # On the runtime's loop, as its batches run: the pool, its limits and breakers are shared.
    reduced = runtime.run(reduce_all())
    for (indices, _), (outcomes, figures) in zip(runs, reduced, strict=True):
        runtime.add_figures(figures.stats)
        for i, (answer, error) in zip(indices, outcomes, strict=True):
            answers[i] = answer
            if error is not None:
                errors.append(error)
    if errors:
        raise group_failure(function, errors, len(inputs))
    return answers


def install(engine: Any) -> None:
    """The aggregates on the connection of a DuckDBFunctions or SQLiteFunctions ``engine``."""
    if engine.name == "duckdb":
        install_duckdb(engine.connection, engine.runtime)
    else:
        install_sqlite(engine.connection, engine)


# -- DuckDB ------------------------------------------------------------------------------------
def install_duckdb(connection: Any, runtime: Runtime) -> None:
    """The UDF and one macro per aggregate on a DuckDB connection (again: replaced)."""
    import duckdb
    import pyarrow as pa

    try:
        connection.remove_function(AGG_UDF)
    except duckdb.InvalidInputException:
        pass  # not registered yet

    def answer(function, texts, lowest, highest, endpoint):
        spec = AGGREGATES[function[0].as_py()]
        # list(expr) is NULL only for a group of no rows ([NULL, ...] for rows of NULL text)
        groups = list(zip(texts.to_pylist(), lowest.to_pylist(), highest.to_pylist(),
                          endpoint.to_pylist(), strict=True))
        return pa.array(answer_groups(runtime, spec, groups), type=pa.string())

    # side_effects=True: each group's value is asked for once, never folded or repeated.
    connection.create_function(AGG_UDF, answer, ["VARCHAR", "VARCHAR[]", "VARCHAR", "VARCHAR",
                                                 "VARCHAR"], "VARCHAR", type="arrow",
                               null_handling="special", side_effects=True)
    for spec in AGGREGATES.values():
        connection.execute(duckdb_macro(spec))


def duckdb_macro(spec: AggregateFunction) -> str:
    instruction = ("CAST(min(instruction) AS VARCHAR), CAST(max(instruction) AS VARCHAR)"
                   if spec.takes_instruction else "NULL, NULL")
    params = ", ".join(p if p != "endpoint" else "endpoint := NULL" for p in spec.params)
    return (f"CREATE OR REPLACE TEMP MACRO {spec.name}({params}) AS {AGG_UDF}('{spec.name}', "
            f"list(CAST(expr AS VARCHAR)), {instruction}, CAST(min(endpoint) AS VARCHAR))")


# -- SQLite ------------------------------------------------------------------------------------
def install_sqlite(connection: Any, engine: Any) -> None:
    """One aggregate per function on a sqlite3 connection; ``engine``: its SQLiteFunctions
    (whose ``last_error`` carries the real error past SQLite's generic message)."""
    answered: OrderedDict[str, str | None] = OrderedDict()

    for spec in AGGREGATES.values():
        connection.create_aggregate(spec.name, -1, _sqlite_aggregate(spec, engine, answered))


def _sqlite_aggregate(spec: AggregateFunction, engine: Any,
                      answered: OrderedDict[str, str | None]) -> type:
    least, most = len(spec.params) - 1, len(spec.params)

    class Aggregate:
        def __init__(self) -> None:
            self.texts: list[Any] = []
            self.instructions: set[Any] = set()
            self.endpoints: set[Any] = set()
            self.mistake: BaseException | None = None

        def step(self, *args: Any) -> None:
            if not least <= len(args) <= most:
                self.mistake = InferenceConfigError(
                    f"{spec.name} takes {least} to {most} arguments, got {len(args)}: "
                    f"{spec.signature()}.")
                return
            values = dict(zip(spec.params, args, strict=False))
            text = values["expr"]
            if text is not None and not isinstance(text, str):
                text = str(text)  # as DuckDB's CAST(expr AS VARCHAR)
            self.texts.append(text)
            self.instructions.add(values.get("instruction"))
            self.endpoints.add(values.get("endpoint"))

        def finalize(self) -> Any:
            try:
                if self.mistake is not None:
                    raise self.mistake
                return self._answer()
            except Exception as exc:  # SQLite hides the message; execute() re-raises this
                engine.last_error = exc
                raise

        def _answer(self) -> str | None:
            given = sorted(self.instructions, key=repr) or [None]
            if len(self.endpoints) > 1:
                raise InferenceConfigError(
                    f"{spec.name}: the endpoint differs between rows of one group.")
            endpoint = next(iter(self.endpoints), None)
            key = hashlib.sha256(repr((spec.name, given, endpoint, sorted(
                t for t in self.texts if sendable(t)))).encode()).hexdigest()
            if key not in answered:
                answered[key] = answer_groups(engine.runtime, spec, [
                    (self.texts, given[0], given[-1], endpoint)])[0]
                while len(answered) > _SQLITE_ANSWERS_KEPT:
                    answered.popitem(last=False)
            return answered[key]

    Aggregate.__name__ = spec.name
    return Aggregate
