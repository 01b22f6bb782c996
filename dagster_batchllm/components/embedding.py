"""``BatchEmbeddingComponent``: declare an embeddings asset in ``defs.yaml``.

The YAML twin of :func:`~dagster_batchllm.factories.embedding.build_embedding_asset`, built
as :class:`~.inference.BatchInferenceComponent` is: the call's attributes are the fields of
:class:`~dagster_batchllm.core.tasks.embed.call.EmbedCall`, the factory's shared keywords the
fields of :class:`~dagster_batchllm.factories.shared.AssetOptions` (see :mod:`.attributes`),
``asset_attributes`` are Dagster's own and ``resource`` is the resource's fields.
"""

from dataclasses import dataclass
from typing import Any

import dagster as dg

from ..core import EmbedCall
from ..factories.embedding import build_embedding_asset
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

# EmbedCall's fields that each run sets (the asset's key, the run's partition), not YAML.
CALL_ATTRIBUTES = call_field_attributes(EmbedCall, frozenset({"scope", "partition_key"}))
FACTORY_ATTRIBUTES = factory_option_attributes(build_embedding_asset)


@dataclass
@with_attributes(CALL_ATTRIBUTES, FACTORY_ATTRIBUTES)
class BatchEmbeddingComponent(dg.Component, dg.Resolvable, DeclaresResource):
    """One embedding (a float32 vector) per row of an upstream table, declared in YAML.

    The attributes are those of :func:`~dagster_batchllm.build_embedding_asset`: the call's
    (``input`` or ``input_column``, ``model``, ``output_column``, ``dimensions``,
    ``inputs_per_request``, ...), the factory's own (partitions, checks, keys), Dagster's
    ``asset_attributes``, ``mode``/``wait``/``deadline`` and ``resource``, as for
    :class:`~.inference.BatchInferenceComponent`.

    Example ``defs.yaml``::

        type: dagster_batchllm.BatchEmbeddingComponent
        attributes:
          name: transcript_embeddings
          source: cleaned_transcripts
          input_column: transcript_text
          model: local-embedder
          partitions_def: {type: daily, start_date: "2026-11-01"}
          resource:
            managed_endpoints: [{}]
    """

    # with_attributes adds one attribute per field of EmbedCall and per keyword every asset
    # factory takes (name, source, partitions_def, ...: FACTORY_ATTRIBUTES).
    external_source: ExternalSource = False
    resource: ResolvedResource = None
    mode: BatchMode = "online"
    wait: BatchWait = True
    deadline: Deadline = None

    def call_attributes(self) -> dict[str, Any]:
        """The call's attributes, by EmbedCall's field names."""
        return values(self, CALL_ATTRIBUTES)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = build_embedding_asset(
            **values(self, FACTORY_ATTRIBUTES), resource=self.resource, mode=self.mode,
            wait=self.wait,
            deadline=parse_duration(f"BatchEmbeddingComponent '{self.name}'", self.deadline),
            **self.call_attributes())
        return dg.Definitions(assets=[*external_source_specs(self), asset],
                              resources=provided_resources(self, context))
