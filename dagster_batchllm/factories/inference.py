"""``build_inference_asset``: "this table, this prompt, this model, this column" as an asset."""


import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from .checks import inference_check_specs
from ..core.delivery.batch_api.mode import check_mode
from ..core.tasks.chat.call import InferenceCall
from ..core.errors import InferenceConfigError
from ..core.ledger.stores import validate_identifier
from .metadata import (
    answer_figures,
    batch_figures,
    column_schema,
    run_figures,
    summary_line,
    table_figures,
)
from .partitions import call_per_partition, partition_events


def build_inference_asset(
    *,
    name: str,
    source: Any,
    call: InferenceCall | None = None,
    expand_fields: bool = True,
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
    mode: str = "online",
    wait: bool = True,
    **call_fields: Any,
) -> dg.AssetsDefinition:
    """Build a software-defined asset that runs batch inference over an upstream table.

    What to send is an :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`: pass one as
    ``call``, or its fields as keywords (``prompt=``, ``model=``, ``output_column=``,
    ``max_tokens=``, ``response_format=``, ``generation_params=``, ``token_budget=`` ...).
    The upstream asset's value (a pandas DataFrame, loaded by its IO manager) gets
    ``output_column`` and ``<output_column>_error``; with a JSON-schema ``response_format`` the
    reply's fields also become columns. Partitioned assets infer only their partitions' rows;
    with ``partition_column`` a single run can cover many partitions (a single-run backfill) and
    each partition's rows are still recorded in the ledger under their own partition key, so the
    retry-partitions sensor can re-run exactly the partitions with failed or deferred rows.

    Each partition's materialization carries that partition's own figures, also in a
    single-run backfill: its rows (which failed, and why: ``key_columns`` name the columns that
    identify a row in that table), what this run paid for it (``batchllm/run/...``) and what
    the answers it holds cost (``batchllm/answers/...``, from the ledger); the checks are
    partitioned too (see :mod:`dagster_batchllm.factories.metadata` and :mod:`dagster_batchllm.factories.checks`).
    The asset's code version is the call's (:attr:`InferenceCall.code_version`), so editing the
    prompt, model or generation parameters marks it and what it feeds unsynced.

    ``asset_attributes`` are Dagster's asset attributes (what a component's
    ``asset_attributes:`` resolves to): ``group_name``, ``description``, ``kinds``, ``tags``,
    ``owners``, ``metadata``, ``deps``, ``code_version``, ``automation_condition``,
    ``freshness_policy``. ``group_name=`` ... ``owners=`` are the same attributes as keywords.

    ``mode="batch_api"`` sends the rows through the provider's offline batch API (an endpoint
    with ``batch_api=True``) at its batch price; with ``wait=False`` a run returns once the
    batches are submitted, its rows deferred, and ``build_batch_collect_sensor`` launches the
    partition again when its batches end (that run collects, submitting nothing).

    Example::

        import dagster as dg
        from dagster_batchllm import BatchInferenceResource, Endpoint, build_inference_asset

        summaries = build_inference_asset(
            name="transcript_summaries",
            source="cleaned_transcripts",
            prompt="Summarize this call transcript: {transcript_text}",
            model="llama-70b",
            output_column="summary",
            max_tokens=128,
        )
        defs = dg.Definitions(
            assets=[summaries],
            resources={"llm": BatchInferenceResource(endpoints=[Endpoint(
                name="gpu-a", base_url="http://127.0.0.1:8000/v1", models=["llama-70b"])])},
        )
    """
    where = f"build_inference_asset('{name}')"
    try:
        validate_identifier(name, "name")
        call = InferenceCall.of(call, **call_fields)
        check_mode(mode, wait)
    except InferenceConfigError as exc:
        raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
    _check_definition(
        where, warn_failed_rate=warn_failed_rate, error_failed_rate=error_failed_rate,
        partitions_def=partitions_def, partition_column=partition_column,
        backfill_policy=backfill_policy,
    )
    if partitions_def is not None and backfill_policy is None:
        backfill_policy = (dg.BackfillPolicy.single_run() if partition_column
                           else dg.BackfillPolicy.multi_run(1))
    source_key = _asset_key(source)
    asset_key = dg.AssetKey([name])
    output_column = call.output_column
    schema_fields = _schema_fields(call.response_format) if expand_fields else []
    attributes = _asset_attributes(
        where, asset_attributes, group_name=group_name, description=description, kinds=kinds,
        tags=tags, owners=owners,
    )
    attributes.update(
        description=attributes.get("description") or _describe(call, schema_fields),
        # Which servers answer is the resource's to say (llm.asset_kinds()); the factory cannot
        # know it, so it does not claim "openai" for a llama.cpp or the embedded default.
        kinds=set(attributes.get("kinds") or {"batchllm", "pandas"}),
        tags=dict(attributes.get("tags") or {}),
        owners=list(attributes["owners"]) if attributes.get("owners") else None,
        metadata={**attributes.get("metadata", {}), "batchllm/output_column": output_column,
                  **({"batchllm/mode": mode, "batchllm/wait": wait} if mode != "online"
                     else {})},
        # Every request key changes with it: Dagster then calls the asset and its downstream
        # unsynced. An explicit code_version (e.g. from asset_attributes) is the user's call.
        code_version=attributes.get("code_version") or call.code_version,
    )
    key_columns = list(key_columns or [])

    with warnings.catch_warnings():
        # backfill_policy is "beta" in Dagster; it is the documented way to run single-run
        # backfills, and users of this factory did not pass it themselves.
        warnings.simplefilter("ignore", dg.BetaWarning)
        decorator = dg.asset(
            name=name,
            ins={"source_table": dg.AssetIn(key=source_key)},
            partitions_def=partitions_def,
            backfill_policy=backfill_policy,
            check_specs=inference_check_specs(asset_key, partitions_def),
            required_resource_keys={resource_key},
            io_manager_key=io_manager_key,
            pool=pool,
            **attributes,
        )

    def _inference_asset(context: dg.AssetExecutionContext, source_table):
        llm = getattr(context.resources, resource_key)
        missing = [c for c in key_columns if c not in source_table.columns]
        if missing:
            raise dg.Failure(f"{where}: key_columns {missing} are not in the input table "
                             f"(columns: {list(source_table.columns)}); nothing was sent.")
        # Each call covers its whole partition, so records of requests this partition no
        # longer asks for (its input changed) are retired and stop marking it for retry.
        inferred, table = call_per_partition(
            context, source_table, partition_column,
            lambda frame, key: llm.infer(frame, call, context=context, partition_key=key,
                                         supersede_stale=key is not None, collect_keys=True,
                                         mode=mode, wait=wait))
        if schema_fields:
            table = _expand_fields(table, output_column, schema_fields)
        if transform is not None:
            table = transform(table)

        schema = column_schema(table, *_column_docs(call, schema_fields, source_table.columns))
        settings = llm.client.settings
        price_for = settings.batch_price_for if mode == "batch_api" else settings.price_for
        answers_of = _answers_of(llm)

        def figures(key, result, stats, rows_out):
            return {**run_figures(stats, price_for), **batch_figures(stats),
                    **answer_figures(answers_of(result), price_for),
                    **table_figures(rows_out, preview_rows, schema=schema)}

        def log_line(key, result, stats, rows_out):
            return summary_line(name, key, stats, answers_of(result), price_for,
                                models_named=_models_named(call, settings.model_when_unnamed))

        yield from partition_events(
            context, asset_key, table, inferred, source_table, partition_column=partition_column,
            key_columns=key_columns, warn_failed_rate=warn_failed_rate,
            error_failed_rate=error_failed_rate, figures=figures, log_line=log_line)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return decorator(_inference_asset)


def _check_definition(where: str, *, warn_failed_rate, error_failed_rate, partitions_def,
                      partition_column, backfill_policy) -> None:
    if not 0 <= warn_failed_rate <= error_failed_rate <= 1:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: need 0 <= warn_failed_rate <= error_failed_rate <= 1, got "
            f"{warn_failed_rate} and {error_failed_rate}."
        )
    if partition_column is not None and partitions_def is None:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: partition_column is only meaningful with partitions_def."
        )
    if (partitions_def is not None and partition_column is None and backfill_policy is not None
            and (backfill_policy.max_partitions_per_run or 2) > 1):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: a backfill policy with several partitions per run needs "
            "partition_column= (the column holding each row's partition key), so each "
            "partition's rows are recorded under their own key."
        )


# Dagster's asset attributes (a component's asset_attributes) that dg.asset takes as they are.
_ASSET_ATTRIBUTES = frozenset({
    "group_name", "description", "kinds", "tags", "owners", "metadata", "deps", "code_version",
    "automation_condition", "freshness_policy",
})


def _asset_attributes(where: str, asset_attributes: Mapping[str, Any] | None,
                      **keywords: Any) -> dict[str, Any]:
    """``asset_attributes`` with the attributes given as keywords, each given once."""
    attributes = dict(asset_attributes or {})
    if "partitions_def" in attributes:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: set partitions_def itself, not in asset_attributes (it also decides the "
            "backfill policy and how partition_column splits a run)."
        )
    unknown = sorted(set(attributes) - _ASSET_ATTRIBUTES)
    if unknown:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: asset_attributes {unknown} do not apply to an inference asset; it takes "
            f"{sorted(_ASSET_ATTRIBUTES)}."
        )
    given = {k: v for k, v in keywords.items() if v is not None}
    both = sorted(set(given) & set(attributes))
    if both:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: {both} given both as keywords and in asset_attributes; give each once."
        )
    return {**attributes, **given}


def _asset_key(source: Any) -> dg.AssetKey:
    if isinstance(source, dg.AssetsDefinition):
        return source.key
    if isinstance(source, dg.AssetSpec):
        return source.key
    return dg.AssetKey.from_coercible(source)


def _schema_fields(response_format: Mapping[str, Any] | None) -> list[str]:
    if not response_format or response_format.get("type") != "json_schema":
        return []
    schema = response_format["json_schema"].get("schema") or {}
    properties = schema.get("properties")
    return list(properties) if schema.get("type") == "object" and properties else []


def _expand_fields(df: Any, output_column: str, fields: list[str]) -> Any:
    """Structured replies: one column per schema field, and the reply itself as JSON text."""
    out = df.copy()
    values = out[output_column]
    for field in fields:
        column = field if field not in out.columns else f"{output_column}_{field}"
        out[column] = values.map(lambda v, f=field: v.get(f) if isinstance(v, dict) else None)
    out[output_column] = values.map(lambda v: json.dumps(v) if isinstance(v, dict) else v)
    return out


def _models_named(call: InferenceCall, default_model: str | None) -> str:
    """The model(s) the call names, for a log line when no figure names one."""
    if call.model:
        return call.model
    if call.model_column:
        return f"models from column {call.model_column}"
    return default_model or "the resource's default_model"


_JSON_TYPES = {"string": "string", "integer": "int", "number": "float", "boolean": "bool",
               "array": "json", "object": "json"}


def _column_docs(call: InferenceCall, schema_fields: list[str], input_columns: Sequence[str]
                 ) -> tuple[dict[str, str], dict[str, str]]:
    """Descriptions and types of the columns the asset adds (the others are the input's)."""
    unanswered = f"null where the row failed or was deferred (see `{call.error_column}`)"
    descriptions = {
        call.output_column: (f"The model's reply as JSON text; {unanswered}." if call.structured
                             else f"The model's answer; {unanswered}."),
        call.error_column: ("Why the row has no answer, as '<error_type>: <reason>' (what each "
                            "type means: batchllm/errors_by_type); null where it succeeded."),
    }
    types = {call.output_column: "json" if call.structured else "string",
             call.error_column: "string"}
    properties = (call.schema or {}).get("properties") or {}
    for field in schema_fields:
        spec = properties.get(field) or {}
        choices = f": one of {', '.join(map(str, spec['enum']))}" if spec.get("enum") else ""
        text = f"Field `{field}` of the structured reply{choices}; {unanswered}."
        kind = spec.get("type")
        # The column _expand_fields gives the field: its name, unless an input column has it.
        column = field if field not in input_columns else f"{call.output_column}_{field}"
        descriptions[column] = text
        if isinstance(kind, str) and kind in _JSON_TYPES:
            types[column] = _JSON_TYPES[kind]
    return descriptions, types


def _describe(call: InferenceCall, schema_fields: Sequence[str] = ()) -> str:
    """What the asset sends, in the words a user looks for: model, prompts, schema."""
    if call.model:
        who = f"model `{call.model}`"
    elif call.model_column:
        who = f"per-row models from column `{call.model_column}`"
    else:
        who = "the resource's `default_model`"
    what = (f"the prompt template `{call.prompt}`" if call.prompt else
            f"prompts from column `{call.prompt_column or call.messages_column}`")
    parts = [f"Batch LLM inference with {who}: {what}; answers in `{call.output_column}`, "
             f"failed rows' reasons in `{call.error_column}`."]
    if call.system:
        parts.append(f"System prompt:\n\n```text\n{call.system}\n```")
    if call.schema is not None:
        parts.append("JSON schema of the replies"
                     + (f" (its fields become columns: {', '.join(schema_fields)})"
                        if schema_fields else "")
                     + f":\n\n```json\n{json.dumps(call.schema, indent=2)}\n```")
    params = call.request_params
    if params:
        parts.append("Generation parameters: "
                     + ", ".join(f"`{k}={v}`" for k, v in sorted(params.items())) + ".")
    parts.append(f"Code version `{call.code_version}`: it changes with the prompt, model or "
                 "parameters, and every row's request key with it.")
    return "\n\n".join(parts)


def _answers_of(llm: Any) -> Callable[[Any], dict[str, Any]]:
    """What the answers a result's rows hold cost: its own request keys, looked up once."""
    seen: dict[int, dict[str, Any]] = {}

    def answers(result: Any) -> dict[str, Any]:
        if result is None:
            return {}
        if id(result) not in seen:
            seen[id(result)] = llm.ledger.answer_tokens(result.request_keys)
        return seen[id(result)]

    return answers
