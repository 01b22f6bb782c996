"""``BatchInferenceComponent``: declare an inference asset in ``defs.yaml``.

It resolves its attributes from YAML and calls :func:`build_inference_asset`, so an asset built
from YAML is the same asset as one built in Python (partitions, metadata, checks and all).
"""


from dataclasses import dataclass
from typing import Annotated, Any

import dagster as dg
from dagster.components.resolved.core_models import (
    DailyPartitionsDefinitionModel,
    HourlyPartitionsDefinitionModel,
    MultiRunBackfillPolicyModel,
    SingleRunBackfillPolicyModel,
    StaticPartitionsDefinitionModel,
    TimeWindowPartitionsDefinitionModel,
    WeeklyPartitionsDefinitionModel,
    resolve_backfill_policy,
    resolve_partitions_def,
)

from ..asset_factory import build_inference_asset
from ..sensors.retry_partitions import build_retry_partitions_sensor


def _as_is(_context: dg.ResolutionContext, value: Any) -> Any:
    return value


ResolvedPartitionsDefinition = Annotated[
    dg.PartitionsDefinition | None,
    dg.Resolver(
        resolve_partitions_def,
        model_field_type=DailyPartitionsDefinitionModel | HourlyPartitionsDefinitionModel
        | WeeklyPartitionsDefinitionModel | TimeWindowPartitionsDefinitionModel
        | StaticPartitionsDefinitionModel,
        description="Partitions of the asset, e.g. {type: daily, start_date: '2026-01-01'}; "
        "each run infers only its partitions' rows.",
    ),
]

ResolvedBackfillPolicy = Annotated[
    dg.BackfillPolicy | None,
    dg.Resolver(
        resolve_backfill_policy,
        model_field_type=SingleRunBackfillPolicyModel | MultiRunBackfillPolicyModel,
        description="How backfills run: {type: single_run} (needs partition_column) or "
        "{type: multi_run, max_partitions_per_run: 1}. Defaults to single_run with "
        "partition_column and one partition per run without.",
    ),
]


@dataclass
class RetryPartitionsSensorArgs(dg.Resolvable):
    """The retry-partitions sensor of a ``BatchInferenceComponent`` (see
    :func:`build_retry_partitions_sensor`)."""

    store_url: Annotated[str, dg.Resolver.default(
        description="SQLAlchemy URL of the ledger the resource writes (its store_url), e.g. "
        "\"{{ env.BATCHLLM_STORE_URL }}\".",
    )]
    ledger_table: str = "batchllm_requests"
    max_rounds: int = 5
    base_delay_s: float = 60.0
    max_delay_s: float = 3600.0
    minimum_interval_seconds: int = 30
    running: Annotated[bool, dg.Resolver.default(
        description="Start the sensor running (default: stopped until turned on in the UI).",
    )] = False


@dataclass
class BatchInferenceComponent(dg.Component, dg.Resolvable):
    """Batch LLM inference over an upstream table, declared in YAML.

    The attributes are those of :func:`build_inference_asset`; the endpoints live in the
    ``BatchInferenceResource`` (under ``resource_key``, ``llm`` by default) that the project's
    definitions provide.

    Example ``defs.yaml``::

        type: dagster_batchllm.BatchInferenceComponent
        attributes:
          name: transcript_summaries
          source: cleaned_transcripts
          prompt: "Summarize this call transcript: {transcript_text}"
          output_column: summary
          max_tokens: 128
          partitions_def: {type: daily, start_date: "2026-11-01"}
          partition_column: call_date
          error_failed_rate: 0.2
          retry_partitions: {store_url: "{{ env.BATCHLLM_STORE_URL }}", max_rounds: 3}

    and the resource, in the project's ``definitions.py``::

        import dagster as dg
        from dagster_batchllm import BatchInferenceResource, Endpoint

        @dg.definitions
        def resources():
            return dg.Definitions(resources={"llm": BatchInferenceResource(
                endpoints=[Endpoint(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                    models=["llama-70b"])],
                default_model="llama-70b", store_url="sqlite:///batchllm.db",
            )})
    """

    name: Annotated[str, dg.Resolver.default(
        description="The asset's name (also the ledger scope of its rows).")]
    # The upstream asset whose table is inferred, e.g. cleaned_transcripts or warehouse/calls.
    source: dg.ResolvedAssetKey
    output_column: Annotated[str, dg.Resolver.default(
        description="The column that receives the answers (errors go to <column>_error).")]
    prompt: Annotated[str | None, dg.Resolver.default(
        description="A prompt template over the input's columns, e.g. 'Summarize: {text}'.",
    )] = None
    prompt_column: str | None = None
    messages_column: str | None = None
    system: str | None = None
    # YAML `model:`; the attribute has another name because Resolvable owns `model()`. Not
    # Resolver.default: Dagster 1.13 drops model_field_name from default resolvers of optionals.
    model_name: Annotated[str | None, dg.Resolver(
        _as_is, model_field_name="model", model_field_type=str | None,
        description="The model; by default the resource's default_model.")] = None
    model_column: str | None = None
    response_format: Annotated[dict[str, Any] | None, dg.Resolver.default(
        description="A JSON schema (or an OpenAI response_format): replies are parsed and "
        "validated per row, and each property becomes a column.")] = None
    expand_fields: bool = True
    max_tokens: int | None = None
    temperature: float | None = None
    generation_params: dict[str, Any] | None = None
    token_budget: Annotated[int | None, dg.Resolver.default(
        description="Most tokens one run may spend; rows past it are deferred to a retry.",
    )] = None
    partitions_def: ResolvedPartitionsDefinition = None
    partition_column: Annotated[str | None, dg.Resolver.default(
        description="The input column holding each row's partition key (enables single-run "
        "backfills that still record each partition separately).")] = None
    backfill_policy: ResolvedBackfillPolicy = None
    resource_key: str = "llm"
    io_manager_key: str | None = None
    group_name: str | None = None
    description: str | None = None
    kinds: list[str] | None = None
    tags: dict[str, str] | None = None
    owners: list[str] | None = None
    pool: Annotated[str | None, dg.Resolver.default(
        description="A Dagster concurrency pool, to cap how many of these steps run at once.",
    )] = None
    warn_failed_rate: Annotated[float, dg.Resolver.default(
        description="failed_row_rate check: WARN above this share of failed rows.")] = 0.01
    error_failed_rate: Annotated[float, dg.Resolver.default(
        description="failed_row_rate check: ERROR above this share of failed rows.")] = 0.10
    preview_rows: int = 5
    retry_partitions: Annotated[RetryPartitionsSensorArgs | None, dg.Resolver.default(
        description="Also build a sensor that re-materializes the partitions with failed or "
        "deferred rows.")] = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = build_inference_asset(
            name=self.name, source=self.source, output_column=self.output_column,
            prompt=self.prompt, prompt_column=self.prompt_column,
            messages_column=self.messages_column, system=self.system, model=self.model_name,
            model_column=self.model_column, response_format=self.response_format,
            expand_fields=self.expand_fields, max_tokens=self.max_tokens,
            temperature=self.temperature, generation_params=self.generation_params,
            token_budget=self.token_budget, partitions_def=self.partitions_def,
            partition_column=self.partition_column, backfill_policy=self.backfill_policy,
            resource_key=self.resource_key, io_manager_key=self.io_manager_key,
            group_name=self.group_name, description=self.description,
            kinds=set(self.kinds) if self.kinds else None, tags=self.tags, owners=self.owners,
            pool=self.pool, warn_failed_rate=self.warn_failed_rate,
            error_failed_rate=self.error_failed_rate, preview_rows=self.preview_rows,
        )
        sensors = []
        if self.retry_partitions is not None:
            args = self.retry_partitions
            sensors.append(build_retry_partitions_sensor(
                asset, store_url=args.store_url, ledger_table=args.ledger_table,
                max_rounds=args.max_rounds, base_delay_s=args.base_delay_s,
                max_delay_s=args.max_delay_s,
                minimum_interval_seconds=args.minimum_interval_seconds,
                default_status=(dg.DefaultSensorStatus.RUNNING if args.running
                                else dg.DefaultSensorStatus.STOPPED),
            ))
        return dg.Definitions(assets=[asset], sensors=sensors)
