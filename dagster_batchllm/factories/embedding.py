"""``build_embedding_asset``: "this table, this text, this embedding model" as an asset.

The embeddings sibling of :func:`~dagster_batchllm.factories.inference.build_inference_asset`, with
the same arguments and reusing its helpers: the same partitions, single-run backfills, per
partition figures and checks, so the retry-partitions sensor works on it unchanged; the rows
get one float32 vector each (a 1-D numpy array) in ``output_column``.
"""

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
import numpy as np

from .inference import _answers_of, _asset_attributes, _asset_key, _check_definition
from .checks import inference_check_specs
from ..core.tasks.embed.call import EmbedCall
from ..core.errors import InferenceConfigError
from ..core.ledger.stores import validate_identifier
from .metadata import answer_figures, column_schema, run_figures, summary_line, table_figures
from .partitions import call_per_partition, partition_events


def build_embedding_asset(
    *,
    name: str,
    source: Any,
    call: EmbedCall | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
    partition_column: str | None = None,
    backfill_policy: dg.BackfillPolicy | None = None,
    transform: Callable[[Any], Any] | None = None,
    resource_key: str = "llm",
    io_manager_key: str | None = None,
    group_name: str | None = None,
    description: str | None = None,
    kinds: set[str] | None = None,
    tags: Mapping[str, str] | None = None,
    owners: Sequence[str] | None = None,
    pool: str | None = None,
    warn_failed_rate: float = 0.01,
    error_failed_rate: float = 0.10,
    preview_rows: int = 5,
    key_columns: Sequence[str] | None = None,
    asset_attributes: Mapping[str, Any] | None = None,
    **call_fields: Any,
) -> dg.AssetsDefinition:
    """Build a software-defined asset that embeds a text of each row of an upstream table.

    What to embed is an :class:`~dagster_batchllm.core.tasks.embed.call.EmbedCall`: pass one as
    ``call``, or its fields as keywords (``input=`` a template or ``input_column=``,
    ``model=``, ``output_column=``, ``dimensions=``, ``inputs_per_request=`` ...). The other
    arguments are those of ``build_inference_asset``. Each partition's materialization
    carries its rows' figures, what the run paid, ``batchllm/dimensions`` and the checks.

    Example::

        from dagster_batchllm import build_embedding_asset

        embeddings = build_embedding_asset(name="transcript_embeddings",
                                           source="cleaned_transcripts",
                                           input_column="transcript_text", model="bge-large")
    """
    where = f"build_embedding_asset('{name}')"
    try:
        validate_identifier(name, "name")
        call = EmbedCall.of(call, **call_fields)
    except InferenceConfigError as exc:
        raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
    _check_definition(
        where, warn_failed_rate=warn_failed_rate, error_failed_rate=error_failed_rate,
        partitions_def=partitions_def, partition_column=partition_column,
        backfill_policy=backfill_policy)
    if partitions_def is not None and backfill_policy is None:
        backfill_policy = (dg.BackfillPolicy.single_run() if partition_column
                           else dg.BackfillPolicy.multi_run(1))
    asset_key = dg.AssetKey([name])
    attributes = _asset_attributes(
        where, asset_attributes, group_name=group_name, description=description, kinds=kinds,
        tags=tags, owners=owners)
    attributes.update(
        description=attributes.get("description") or _describe(call),
        kinds=set(attributes.get("kinds") or {"batchllm", "pandas"}),
        tags=dict(attributes.get("tags") or {}),
        owners=list(attributes["owners"]) if attributes.get("owners") else None,
        metadata={**attributes.get("metadata", {}),
                  "batchllm/output_column": call.output_column, "batchllm/task": "embed"},
        code_version=attributes.get("code_version") or call.code_version,
    )
    key_columns = list(key_columns or [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # backfill_policy is "beta"
        decorator = dg.asset(
            name=name, ins={"source_table": dg.AssetIn(key=_asset_key(source))},
            partitions_def=partitions_def, backfill_policy=backfill_policy,
            check_specs=inference_check_specs(asset_key, partitions_def),
            required_resource_keys={resource_key}, io_manager_key=io_manager_key, pool=pool,
            **attributes)

    def _embedding_asset(context: dg.AssetExecutionContext, source_table):
        llm = getattr(context.resources, resource_key)
        missing = [c for c in key_columns if c not in source_table.columns]
        if missing:
            raise dg.Failure(f"{where}: key_columns {missing} are not in the input table "
                             f"(columns: {list(source_table.columns)}); nothing was sent.")
        embedded, table = call_per_partition(
            context, source_table, partition_column,
            lambda frame, key: llm.embed(frame, call, context=context, partition_key=key,
                                         supersede_stale=key is not None, collect_keys=True))
        if transform is not None:
            table = transform(table)
        schema = column_schema(table, *_column_docs(call))
        settings = llm.client.settings
        answers_of = _answers_of(llm)

        def figures(key, result, stats, rows_out):
            return {**run_figures(stats, settings.price_for),
                    **answer_figures(answers_of(result), settings.price_for),
                    **_dimensions(rows_out, call.output_column),
                    **table_figures(rows_out, preview_rows, schema=schema)}

        def log_line(key, result, stats, rows_out):
            return summary_line(
                name, key, stats, answers_of(result), settings.price_for,
                models_named=call.model or ", ".join(sorted(settings.embedding_models)))

        yield from partition_events(
            context, asset_key, table, embedded, source_table, partition_column=partition_column,
            key_columns=key_columns, warn_failed_rate=warn_failed_rate,
            error_failed_rate=error_failed_rate, figures=figures, log_line=log_line)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return decorator(_embedding_asset)


def _dimensions(table: Any, column: str) -> dict[str, Any]:
    """The vectors' size (nothing before any row has one)."""
    if column not in table.columns:
        return {}
    sizes = sorted({len(v) for v in table[column] if isinstance(v, Sequence | np.ndarray)})
    if not sizes:
        return {}
    return {"batchllm/dimensions": sizes[0] if len(sizes) == 1 else ", ".join(map(str, sizes))}


def _column_docs(call: EmbedCall) -> tuple[dict[str, str], dict[str, str]]:
    descriptions = {
        call.output_column: ("The row's embedding: a float32 vector (1-D numpy array); null "
                             f"where the row failed or was deferred (see `{call.error_column}`)."),
        call.error_column: ("Why the row has no vector, as '<error_type>: <reason>'; null "
                            "where it succeeded."),
    }
    return descriptions, {call.output_column: "float32[]", call.error_column: "string"}


def _describe(call: EmbedCall) -> str:
    who = (f"model `{call.model}`" if call.model else
           "the endpoints' only embedding model")
    what = (f"the text `{call.input}`" if call.input is not None
            else f"column `{call.input_column}`")
    size = f", {call.dimensions} dimensions" if call.dimensions else ""
    return (f"Embeddings with {who}{size}: {what}, {call.inputs_per_request} inputs per request;"
            f" vectors in `{call.output_column}`, failed rows' reasons in "
            f"`{call.error_column}`.\n\nCode version `{call.code_version}`: it changes with the "
            "text, model or size, and every row's request key with it.")
