"""``embed`` and its dry run over a DataFrame: what ``InferenceClient.embed`` does.

The run is the engine's, as for ``infer``: the :class:`~.embeddings.EmbedTask` says how rows
become inputs and replies become vectors; nothing here knows about HTTP or the ledger's rows.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from .call import EmbedCall
from .task import EmbedTask
from ...run.engine import InferenceRun
from ...errors import InferenceConfigError
from ...run.prompts import distinct_requests, row_tuples
from ...results import InferenceEstimate, InferenceResult
from ...run.figures import estimate_cost

if TYPE_CHECKING:
    from ...client import InferenceClient

_MAX_ROOM = 8192


def bind_embed_call(client: InferenceClient, df: Any, call: EmbedCall | None,
                    fields: dict[str, Any]) -> EmbedCall:
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise InferenceConfigError(f"embed() takes a pandas DataFrame, got {type(df).__name__}")
    settings = client.settings
    return EmbedCall.of(call, **fields).bind(list(df.columns), settings.embedding_models,
                                             settings.models)


async def embed_frame(client: InferenceClient, df: Any, call: EmbedCall | None, *,
                      run_id: str | None = None, supersede_stale: bool = False,
                      collect_keys: bool = False, logger: Any = None,
                      **fields: Any) -> InferenceResult:
    """One float32 vector per row of ``df`` in ``call.output_column`` (None where the row
    failed, with its reason in the error column)."""

    call = bind_embed_call(client, df, call, fields)
    for name in (call.output_column, call.error_column):
        if name in df.columns:
            raise InferenceConfigError(
                f"The input already has a column '{name}'; choose another output_column.")
    settings = client.settings
    # A grouped reply settles a request's worth of rows at once: the writer's room (how many
    # unwritten answers pause sending) holds what every request in flight may answer, or the
    # workers would stall (and all wake) at each write. The journal keeps those answers safe
    # from a kill meanwhile; 8,192 base64 vectors of 384 dimensions are ~20 MB.
    in_flight = client.pool.capacity(call.model) * call.inputs_per_request
    room = max(settings.ledger_flush_rows, min(_MAX_ROOM, 2 * in_flight))
    if room != settings.ledger_flush_rows:
        settings = settings.replace(ledger_flush_rows=room)
    budget = call.token_budget if call.token_budget is not None else settings.token_budget
    log = logger or client.log
    run = InferenceRun(
        settings, call, df[call.input_columns()], pool=client.pool, ledger=client.ledger,
        token_budget=budget, partition_key=call.partition_key, run_id=run_id, scope=call.scope,
        logger=log, collect_keys=collect_keys or bool(supersede_stale and call.partition_key),
        task=EmbedTask(call))
    stats = await run.run()
    if supersede_stale and call.partition_key:
        await asyncio.to_thread(client.ledger.mark_superseded, call.partition_key, run.keys,
                                call.scope)
    log.info(f"batchllm: embeddings of '{call.model}': {stats.summary()}")
    return InferenceResult.of_run(df, run, output_column=call.output_column,
                                  error_column=call.error_column)


def estimate_embeddings(client: InferenceClient, df: Any, call: EmbedCall | None,
                        fields: dict[str, Any]) -> InferenceEstimate:
    """A dry run of ``embed`` with the same arguments: nothing is sent. ``requests_to_send``
    counts requests of ``inputs_per_request`` inputs (fewer where the token cap closes one)."""
    call = bind_embed_call(client, df, call, fields)
    task = EmbedTask(call)
    distinct, invalid, duplicates = distinct_requests(
        task.requests(row_tuples(df[call.input_columns()])))
    hits = client.ledger.lookup_ok(list(distinct), call.partition_key, call.scope)
    missing = [item for key, item in distinct.items() if key not in hits]
    prompt_tokens = sum(item.typical_prompt_tokens for item in missing)
    by_count = math.ceil(len(missing) / call.inputs_per_request)
    by_tokens = (math.ceil(sum(i.reserve_tokens for i in missing) / call.max_request_tokens)
                 if call.max_request_tokens else 0)
    tokens_by_model = ({call.model: {"prompt_tokens": prompt_tokens, "completion_tokens": 0}}
                       if missing else {})
    return InferenceEstimate(
        rows=len(df), requests_to_send=max(by_count, by_tokens),
        rows_answered_by_ledger=len(distinct) - len(missing), rows_deduplicated=duplicates,
        invalid_rows=invalid, estimated_prompt_tokens=prompt_tokens, max_completion_tokens=0,
        tokens_by_model=tokens_by_model,
        estimated_cost_usd=estimate_cost(client.settings, tokens_by_model))
