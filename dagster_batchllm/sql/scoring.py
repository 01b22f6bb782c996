"""``ai_query`` on a traditional ML model: the SQL runtime's rows for a scoring model, predicted.

Databricks documents ``ai_query('<custom model endpoint>', named_struct('f1', a, 'f2', b),
returnType => 'DOUBLE')`` for custom models: the struct's fields are the model's features. On
DuckDB the struct arrives as JSON (``to_json``), on SQLite it is JSON text already
(``json_object('f1', a, 'f2', b)``). A plain text request (the seed's ``ai_query(
'my_registered_model', input_text)``) is the value of the model's one input, named by its
signature. Rows go to ``InferenceClient.apredict``: the same ledger, grouping and per-row errors
as ``predict()``.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import InferenceConfigError, looks_like_uri, resolve_models, single_required_input


def is_scoring_model(settings: Any, name: str) -> bool:
    return name in settings.scoring_models or (
        name not in settings.models and looks_like_uri(name))


async def score_rows(client: Any, rows: list[tuple[str, str]], *, partition_key: str | None,
                     scope: str | None, run_id: str | None, logger: Any = None
                     ) -> tuple[list[tuple[Any, str | None]], list[Any]]:
    """(prediction text, error) per ``(model, request)`` row, and each call's stats."""
    import pandas as pd

    outcomes: list[tuple[Any, str | None]] = [(None, None)] * len(rows)
    by_model: dict[str, list[int]] = {}
    for i, (model, _) in enumerate(rows):
        by_model.setdefault(model, []).append(i)
    stats = []
    for model, indices in by_model.items():
        features: list[dict[str, Any] | None] = []
        for i in indices:
            features.append(_features(rows[i][1]))
        names = list(dict.fromkeys(k for f in features if f is not None for k in f
                                   if k != _PLAIN))
        if any(f is not None and _PLAIN in f for f in features):
            single = await _single_input(client, model)
            if single is None:
                for i, f in zip(indices, features, strict=True):
                    if f is not None and _PLAIN in f:
                        outcomes[i] = (None, f"invalid_input: ai_query: model '{model}' needs "
                                             "its inputs by name: pass named_struct('feature', "
                                             "value, ...) as the request")
                features = [None if f is not None and _PLAIN in f else f for f in features]
            else:
                features = [{single: f[_PLAIN]} if f is not None and _PLAIN in f else f
                            for f in features]
                names = list(dict.fromkeys([*names, single]))
        keep = [(i, f) for i, f in zip(indices, features, strict=True) if f is not None]
        if not keep:
            continue
        frame = pd.DataFrame([[f.get(n) for n in names] for _, f in keep], columns=names)
        result = await client.apredict(frame, model=model, input_columns=names,
                                       output_column="output", partition_key=partition_key or "",
                                       scope=scope or "", run_id=run_id, logger=logger)
        stats.append(result.stats)
        for (i, _), value, error in zip(keep, result.df["output"], result.df["output_error"],
                                        strict=True):
            outcomes[i] = (_as_reply(value), error)
    return outcomes, stats


_PLAIN = "\0plain"  # a request that was not a struct: the value of the model's one input


def _features(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return {_PLAIN: text}
    if isinstance(value, dict):
        return value
    return {_PLAIN: value}


def _as_reply(value: Any) -> Any:
    """A prediction as the SQL side reads replies: returnType coerces text ('0.93' to DOUBLE)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


async def _single_input(client: Any, model: str) -> str | None:
    """The name of the model's only required input (from its signature), or None."""
    import asyncio

    resolved = (await asyncio.to_thread(resolve_models, client.settings, [model]))[model]
    if resolved.error:
        raise InferenceConfigError(f"ai_query: {resolved.error}")
    return await asyncio.to_thread(single_required_input, resolved)
