"""``BatchInferenceComponent``: declare an inference asset in ``defs.yaml``.

It resolves its attributes from YAML and calls :func:`build_inference_asset`, so an asset built
from YAML is the same asset as one built in Python (partitions, metadata, checks and all). What
the YAML can say comes from where each concept lives: the factory's shared keywords are the
fields of :class:`~dagster_batchllm.factories.shared.AssetOptions` (see :mod:`.attributes`), the
call's attributes are the fields of :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`,
``asset_attributes`` are Dagster's own, and ``resource`` is the resource's fields.
"""

from dataclasses import dataclass
from typing import Annotated, Any

import dagster as dg

from ..core import DEFAULT_LEDGER_TABLE, InferenceCall
from ..factories.inference import build_inference_asset
from ..sensors.batches import build_batch_collect_sensor
from ..sensors.retry_partitions import build_retry_partitions_sensor
from .attributes import (
    BatchMode,
    BatchWait,
    Deadline,
    ExternalSource,
    call_field_attributes,
    external_source_specs,
    factory_option_attributes,
    parse_duration,
    values,
    with_attributes,
)
from .resource_attributes import DeclaresResource, ResolvedResource, provided_resources
from .scaffolder import InferenceScaffolder

# InferenceCall's fields that each run sets (the asset's key, the run's partition), not YAML.
SET_PER_RUN = frozenset({"scope", "partition_key"})
# The call's attributes, in InferenceCall's order.
CALL_ATTRIBUTES = call_field_attributes(InferenceCall, SET_PER_RUN)
# The factory's keywords every asset factory shares (name, source, partitions, checks, ...).
FACTORY_ATTRIBUTES = factory_option_attributes(build_inference_asset)


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
@with_attributes(CALL_ATTRIBUTES, FACTORY_ATTRIBUTES)
class BatchInferenceComponent(dg.Component, dg.Resolvable, DeclaresResource):
    """Batch LLM inference over an upstream table, declared in YAML.

    The attributes are those of :func:`build_inference_asset`: the call's (``prompt``,
    ``system``, ``model``, ``output_column``, ``max_tokens``, ``response_format``,
    ``generation_params``, ``token_budget``, ... : the fields of
    :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`), Dagster's
    ``asset_attributes``, and the factory's own (partitions, checks, keys). The endpoints live
    in the ``BatchInferenceResource`` under ``resource_key`` (``llm`` by default): given as
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

    # with_attributes adds one attribute per field of InferenceCall and per keyword every
    # asset factory takes (name, source, partitions_def, ...: FACTORY_ATTRIBUTES).
    expand_fields: Annotated[bool, dg.Resolver.default(
        description="With a JSON-schema response_format, each property of the reply becomes a "
        "column.")] = True
    external_source: ExternalSource = False
    resource: ResolvedResource = None
    retry_partitions: Annotated[RetryPartitionsSensorArgs | None, dg.Resolver.default(
        description="Also build a sensor that re-materializes the partitions with failed or "
        "deferred rows.")] = None
    mode: BatchMode = "online"
    wait: BatchWait = True
    deadline: Deadline = None
    batch_collect: Annotated[BatchCollectSensorArgs | None, dg.Resolver.default(
        description="Also build a sensor that re-materializes a partition when the batches its "
        "rows wait for end (mode batch_api, wait false), or when its deadline's switch time "
        "has come.")] = None

    def call_attributes(self) -> dict[str, Any]:
        """The call's attributes, by InferenceCall's field names."""
        return values(self, CALL_ATTRIBUTES)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = build_inference_asset(
            **values(self, FACTORY_ATTRIBUTES), resource=self.resource,
            expand_fields=self.expand_fields, mode=self.mode, wait=self.wait,
            deadline=parse_duration(f"BatchInferenceComponent '{self.name}'", self.deadline),
            **self.call_attributes())
        resources = provided_resources(self, context)
        sensors = [] if self.retry_partitions is None else [self._retry_sensor(asset)]
        if self.batch_collect is not None:
            if self.resource is None:
                raise dg.DagsterInvalidDefinitionError(
                    f"BatchInferenceComponent '{self.name}': batch_collect needs the "
                    "component's resource (the sensor polls its batch endpoints).")
            sensors.append(build_batch_collect_sensor(
                asset, resource=resources[self.resource_key],
                minimum_interval_seconds=self.batch_collect.minimum_interval_seconds,
                default_status=(dg.DefaultSensorStatus.RUNNING if self.batch_collect.running
                                else dg.DefaultSensorStatus.STOPPED)))
        return dg.Definitions(assets=[*external_source_specs(self), asset], sensors=sensors,
                              resources=resources)

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
