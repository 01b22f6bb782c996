"""``BatchInferenceComponent``: declare an inference asset in ``defs.yaml``.

It resolves its attributes from YAML and calls :func:`build_inference_asset`, so an asset built
from YAML is the same asset as one built in Python (partitions, metadata, checks and all). What
the YAML can say comes from where each concept lives: the call's attributes are the fields of
:class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`, ``asset_attributes`` are Dagster's own, and
``resource`` is the resource's fields.
"""

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import dagster as dg
from dagster.components.resolved.core_models import (
    AssetsDefUpdateKwargs,
    DailyPartitionsDefinitionModel,
    HourlyPartitionsDefinitionModel,
    MultiRunBackfillPolicyModel,
    SingleRunBackfillPolicyModel,
    StaticPartitionsDefinitionModel,
    TimeWindowPartitionsDefinitionModel,
    WeeklyPartitionsDefinitionModel,
    resolve_assets_def_update_kwargs_to_mapping,
    resolve_backfill_policy,
    resolve_partitions_def,
)

from ..factories.inference import build_inference_asset
from ..core.tasks.chat.call import InferenceCall
from ..core.settings import DEFAULT_LEDGER_TABLE
from ..sensors.batches import build_batch_collect_sensor
from ..sensors.retry_partitions import build_retry_partitions_sensor
from .resource_attributes import ResolvedResource
from .scaffolder import InferenceScaffolder

# InferenceCall's fields that each run sets (the asset's key, the run's partition), not YAML.
SET_PER_RUN = frozenset({"scope", "partition_key"})
# The call's attributes, in InferenceCall's order.
CALL_FIELDS = tuple(f for f in dataclasses.fields(InferenceCall) if f.name not in SET_PER_RUN)
# Attributes that cannot have their field's name (Resolvable owns a model() classmethod); the
# YAML still says `model:`.
ATTRIBUTE_NAMES = {"model": "model_name"}


def _as_resolved(_context: dg.ResolutionContext, value: Any) -> Any:
    return value  # the Resolver rendered a template in it already (inject_before_resolve)


def _call_attribute(call_field: dataclasses.Field, hint: Any) -> tuple[str, Any, Any]:
    """The component attribute for a field of InferenceCall: name, annotation, default."""
    description = call_field.metadata["description"]
    attribute = ATTRIBUTE_NAMES.get(call_field.name, call_field.name)
    if attribute == call_field.name:
        resolver = dg.Resolver.default(description=description)
    else:
        # Not Resolver.default: Dagster 1.13 drops model_field_name from default resolvers of
        # optionals.
        resolver = dg.Resolver(_as_resolved, model_field_name=call_field.name,
                               model_field_type=hint, description=description)
    default = (call_field.default if call_field.default is not dataclasses.MISSING
               else dataclasses.field(default_factory=call_field.default_factory))
    return attribute, Annotated[hint, resolver], default


def _with_call_attributes(cls: type) -> type:
    """Give ``cls`` (before ``@dataclass``) one attribute per field in ``CALL_FIELDS``, with the
    field's type, default and description, after its required attributes (so the schema reads
    name, source, prompt, ...)."""
    hints = typing.get_type_hints(InferenceCall)
    own = dict(cls.__annotations__)
    required = {name: own.pop(name) for name in list(own) if name not in vars(cls)}
    added = {}
    for call_field in CALL_FIELDS:
        attribute, annotation, default = _call_attribute(call_field, hints[call_field.name])
        added[attribute] = annotation
        setattr(cls, attribute, default)
    cls.__annotations__ = {**required, **added, **own}
    return cls


def _resolve_asset_attributes(context: dg.ResolutionContext,
                              model: Any) -> Mapping[str, Any] | None:
    if model is None:
        return None
    # Only the attributes the YAML sets, so the factory's defaults (kinds, description) stay.
    attributes = dict(resolve_assets_def_update_kwargs_to_mapping(context, model))
    if "code_version" in attributes:  # templating reads code_version: "3" as the number 3
        attributes["code_version"] = str(attributes["code_version"])
    return attributes


ResolvedAssetAttributes = Annotated[
    Mapping[str, Any] | None,
    dg.Resolver(
        _resolve_asset_attributes,
        model_field_type=AssetsDefUpdateKwargs.model() | None,
        description="Dagster's asset attributes: group_name, description, kinds, tags, owners, "
        "metadata, deps, code_version, automation_condition, freshness_policy.",
    ),
]


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

# Beside partitions_def in every component that scores a table (inference, scoring).
ResolvedPartitionColumn = Annotated[str | None, dg.Resolver.default(
    description="The input column holding each row's partition key (enables single-run "
    "backfills that still record each partition separately).")]

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

    store_url: Annotated[str | None, dg.Resolver.default(
        description="SQLAlchemy URL of the ledger the resource writes (its store_url), e.g. "
        "\"{{ env.BATCHLLM_STORE_URL }}\"; by default the component's resource's.",
    )] = None
    ledger_table: Annotated[str | None, dg.Resolver.default(
        description="The ledger table; by default the component's resource's, else "
        f"{DEFAULT_LEDGER_TABLE}.",
    )] = None
    max_rounds: int = 5
    base_delay_s: float = 60.0
    max_delay_s: float = 3600.0
    minimum_interval_seconds: int = 30
    running: Annotated[bool, dg.Resolver.default(
        description="Start the sensor running (default: stopped until turned on in the UI).",
    )] = False


@dataclass
class BatchCollectSensorArgs(dg.Resolvable):
    """The batch-collect sensor of a ``BatchInferenceComponent`` with ``mode: batch_api`` and
    ``wait: false`` (see :func:`build_batch_collect_sensor`); it needs the component's
    ``resource``, whose batch endpoints it polls."""

    minimum_interval_seconds: int = 60
    running: Annotated[bool, dg.Resolver.default(
        description="Start the sensor running (default: stopped until turned on in the UI).",
    )] = False


@dg.scaffold_with(InferenceScaffolder)
@dataclass
@_with_call_attributes
class BatchInferenceComponent(dg.Component, dg.Resolvable):
    """Batch LLM inference over an upstream table, declared in YAML.

    The attributes are those of :func:`build_inference_asset`: the call's (``prompt``,
    ``system``, ``model``, ``output_column``, ``max_tokens``, ``response_format``,
    ``generation_params``, ``token_budget``, ... : the fields of
    :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`), Dagster's ``asset_attributes``, and the
    factory's own (partitions, checks, keys). The endpoints live in the
    ``BatchInferenceResource`` under ``resource_key`` (``llm`` by default): given as
    ``resource``, the component provides it, so a ``defs.yaml`` alone declares everything;
    without it, the project's definitions provide it.

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
          asset_attributes: {group_name: calls, owners: ["team:support"]}
          error_failed_rate: 0.2
          retry_partitions: {max_rounds: 3}
          resource:
            endpoints:
              - name: gpu-a
                base_url: http://10.0.0.5:8000/v1
                models: [llama-70b]
                api_key: {env: GPU_A_API_KEY}
            default_model: llama-70b
            store_url: {env: BATCHLLM_STORE_URL}

    Dagster renders ``{{ ... }}`` in YAML values as Jinja (``{{ env.NAME }}``), so a prompt
    whose text needs literal braces (``{{`` in a template) goes in a raw block:
    ``prompt: "{% raw %}Reply as {{\"label\": ...}} for: {text}{% endraw %}"``.
    ``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>`` writes a defs.yaml
    that loads as it is (see :mod:`.scaffolder`).

    or, without ``resource``, the resource in the project's ``definitions.py``::

        import dagster as dg
        from dagster_batchllm import BatchInferenceResource, Endpoint

        @dg.definitions
        def resources():
            return dg.Definitions(resources={"llm": BatchInferenceResource(
                endpoints=[Endpoint(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                    models=["llama-70b"])],
                default_model="llama-70b", store_url="sqlite:///batchllm.db",
            )})

    (with ``retry_partitions: {store_url: "{{ env.BATCHLLM_STORE_URL }}"}``, as the sensor then
    has no resource to read the ledger's location from).
    """

    name: Annotated[str, dg.Resolver.default(
        description="The asset's name (also the ledger scope of its rows).")]
    # The upstream asset whose table is inferred, e.g. cleaned_transcripts or warehouse/calls.
    source: dg.ResolvedAssetKey
    # Here _with_call_attributes adds one attribute per field of InferenceCall.
    expand_fields: Annotated[bool, dg.Resolver.default(
        description="With a JSON-schema response_format, each property of the reply becomes a "
        "column.")] = True
    partitions_def: ResolvedPartitionsDefinition = None
    partition_column: ResolvedPartitionColumn = None
    backfill_policy: ResolvedBackfillPolicy = None
    resource_key: str = "llm"
    io_manager_key: str | None = None
    pool: Annotated[str | None, dg.Resolver.default(
        description="A Dagster concurrency pool, to cap how many of these steps run at once.",
    )] = None
    warn_failed_rate: Annotated[float, dg.Resolver.default(
        description="failed_row_rate check: WARN above this share of failed rows.")] = 0.01
    error_failed_rate: Annotated[float, dg.Resolver.default(
        description="failed_row_rate check: ERROR above this share of failed rows.")] = 0.10
    preview_rows: int = 5
    key_columns: Annotated[list[str] | None, dg.Resolver.default(
        description="Input columns that identify a row (e.g. [call_id]); the metadata's table "
        "of failed rows names them by these.")] = None
    asset_attributes: ResolvedAssetAttributes = None
    resource: ResolvedResource = None
    retry_partitions: Annotated[RetryPartitionsSensorArgs | None, dg.Resolver.default(
        description="Also build a sensor that re-materializes the partitions with failed or "
        "deferred rows.")] = None
    mode: Annotated[Literal["online", "batch_api"], dg.Resolver.default(
        description="'online' (each row a request now) or 'batch_api' (the provider's "
        "offline batch API, about half the price; an endpoint with batch_api: true).",
    )] = "online"
    wait: Annotated[bool, dg.Resolver.default(
        description="With mode batch_api: poll until the batches are answered (true), or end "
        "the run once they are submitted, the rows deferred (false; see batch_collect).",
    )] = True
    batch_collect: Annotated[BatchCollectSensorArgs | None, dg.Resolver.default(
        description="Also build a sensor that re-materializes a partition when the batches its "
        "rows wait for end (mode batch_api, wait false).")] = None

    def call_attributes(self) -> dict[str, Any]:
        """The call's attributes, by InferenceCall's field names."""
        return {f.name: getattr(self, ATTRIBUTE_NAMES.get(f.name, f.name)) for f in CALL_FIELDS}

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = build_inference_asset(
            name=self.name, source=self.source, expand_fields=self.expand_fields,
            partitions_def=self.partitions_def, partition_column=self.partition_column,
            backfill_policy=self.backfill_policy, resource_key=self.resource_key,
            io_manager_key=self.io_manager_key, pool=self.pool,
            warn_failed_rate=self.warn_failed_rate, error_failed_rate=self.error_failed_rate,
            preview_rows=self.preview_rows, key_columns=self.key_columns,
            asset_attributes=self.asset_attributes, mode=self.mode, wait=self.wait,
            **self.call_attributes(),
        )
        sensors = [] if self.retry_partitions is None else [self._retry_sensor(asset)]
        if self.batch_collect is not None:
            if self.resource is None:
                raise dg.DagsterInvalidDefinitionError(
                    f"BatchInferenceComponent '{self.name}': batch_collect needs the "
                    "component's resource (the sensor polls its batch endpoints).")
            sensors.append(build_batch_collect_sensor(
                asset, resource=self.resource,
                minimum_interval_seconds=self.batch_collect.minimum_interval_seconds,
                default_status=(dg.DefaultSensorStatus.RUNNING if self.batch_collect.running
                                else dg.DefaultSensorStatus.STOPPED)))
        resources = {} if self.resource is None else {self.resource_key: self.resource}
        return dg.Definitions(assets=[asset], sensors=sensors, resources=resources)

    def _retry_sensor(self, asset: dg.AssetsDefinition) -> dg.SensorDefinition:
        args = self.retry_partitions
        store_url = args.store_url
        if store_url is None:
            if self.resource is None:
                raise dg.DagsterInvalidDefinitionError(
                    f"BatchInferenceComponent '{self.name}': retry_partitions needs store_url "
                    "(the ledger the resource writes) when the component has no resource."
                )
            store_url = self.resource.store_url
        ledger_table = args.ledger_table or (
            self.resource.ledger_table if self.resource is not None else DEFAULT_LEDGER_TABLE)
        return build_retry_partitions_sensor(
            asset, store_url=store_url, ledger_table=ledger_table, max_rounds=args.max_rounds,
            base_delay_s=args.base_delay_s, max_delay_s=args.max_delay_s,
            minimum_interval_seconds=args.minimum_interval_seconds,
            default_status=(dg.DefaultSensorStatus.RUNNING if args.running
                            else dg.DefaultSensorStatus.STOPPED),
        )
