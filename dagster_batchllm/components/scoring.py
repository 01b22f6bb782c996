"""``ModelScoringComponent``: declare a scoring asset (an MLflow model over a table) in YAML.

It resolves its attributes from YAML and calls
:func:`~dagster_batchllm.factories.scoring.build_scoring_asset`, so an asset built from YAML is
the one built in Python (partitions, metadata with the model's name, version and alias, checks,
a code version that follows the model version). As in
:class:`~.inference.BatchInferenceComponent`, the factory's shared keywords come from
:class:`~dagster_batchllm.factories.shared.AssetOptions` (see :mod:`.attributes`),
``asset_attributes`` are Dagster's own and ``resource`` is the resource's fields.
``model_version`` also builds the observable asset of the registry version the scores depend on
(:func:`~dagster_batchllm.factories.scoring.build_model_version_asset`), and ``alias_sensor``
the sensor that re-scores when the alias moves.
"""

from dataclasses import dataclass
from typing import Annotated, Any

import dagster as dg

from ..factories.scoring import (
    build_model_alias_sensor,
    build_model_version_asset,
    build_scoring_asset,
)
from .attributes import (
    ExternalSource,
    as_resolved,
    external_source_specs,
    factory_option_attributes,
    values,
    with_attributes,
)
from .resource_attributes import DeclaresResource, ResolvedResource, provided_resources
from .scaffolder import ScoringScaffolder

# The factory's keywords every asset factory shares (name, source, partitions, checks, ...).
FACTORY_ATTRIBUTES = factory_option_attributes(build_scoring_asset)


@dataclass
class ModelVersionArgs(dg.Resolvable):
    """The observable asset of the model's registry version (the scores depend on it)."""

    name: Annotated[str, dg.Resolver.default(
        description="The model asset's name, e.g. risk_model.")]
    model_uri: Annotated[str | None, dg.Resolver.default(
        description="What to watch, e.g. models:/risk@champion; by default the model_uri of "
        "the resource's MlflowModel that `model` names, or the served_model_uri of the "
        "mlflow endpoint serving it.")] = None
    registry_uri: Annotated[str | None, dg.Resolver.default(
        description="The MLflow registry; by default that model's, else the resource's "
        "mlflow_registry_uri, else MLflow's own (MLFLOW_TRACKING_URI).")] = None


@dataclass
class AliasSensorArgs(dg.Resolvable):
    """The sensor that watches ``model_version``'s alias (see
    :func:`~dagster_batchllm.factories.scoring.build_model_alias_sensor`)."""

    minimum_interval_seconds: int = 60
    rerun: Annotated[bool, dg.Resolver.default(
        description="Request a run of the scores (each materialized partition) when the alias "
        "moves; false: only mark them stale.")] = True
    running: Annotated[bool, dg.Resolver.default(
        description="Start the sensor running (default: stopped until turned on in the UI).",
    )] = False


@dg.scaffold_with(ScoringScaffolder)
@dataclass
@with_attributes(FACTORY_ATTRIBUTES)
class ModelScoringComponent(dg.Component, dg.Resolvable, DeclaresResource):
    """Scores an upstream table with a traditional ML model (MLflow), declared in YAML.

    The attributes are those of :func:`~dagster_batchllm.build_scoring_asset`, Dagster's
    ``asset_attributes``, and ``resource`` (the ``BatchInferenceResource`` provided under
    ``resource_key``; without it, the project's definitions provide it).

    Example ``defs.yaml``::

        type: dagster_batchllm.ModelScoringComponent
        attributes:
          name: risk_scores
          source: features
          model: risk
          input_columns: [f1, f2]
          output_column: risk
          key_columns: [row_id]
          model_version: {name: risk_model}      # watches the resource's models:/risk@champion
          alias_sensor: {minimum_interval_seconds: 300}
          asset_attributes: {group_name: scoring, owners: ["team:risk"]}
          resource:
            mlflow_models:
              - {name: risk, model_uri: "models:/risk@champion"}
            mlflow_registry_uri: sqlite:///data/mlflow/mlflow.db
            store_url: {env: BATCHLLM_STORE_URL}

    ``dg scaffold defs dagster_batchllm.ModelScoringComponent <name>`` writes a defs.yaml that
    loads as it is (see :mod:`.scaffolder`).
    """

    # with_attributes adds one attribute per keyword every asset factory takes (name, source,
    # partitions_def, ...: FACTORY_ATTRIBUTES).
    input_columns: Annotated[list[str], dg.Resolver.default(
        description="The columns the model reads, named as its features.")]
    # `model` in the YAML (Resolvable owns a model() classmethod, so not the attribute's name).
    model_name: Annotated[str | None, dg.Resolver(
        as_resolved, model_field_name="model", model_field_type=str | None,
        description="The model: a name of the resource's mlflow_models, a model an mlflow "
        "endpoint serves, or a URI (models:/risk@champion). Or model_column.")] = None
    model_column: Annotated[str | None, dg.Resolver.default(
        description="A column naming each row's model instead of `model`.")] = None
    output_column: Annotated[str, dg.Resolver.default(
        description="The prediction column; failed rows' reasons go in <output>_error.",
    )] = "prediction"
    rows_per_request: Annotated[int | None, dg.Resolver.default(
        description="Most rows in one predict() / one /invocations request (default: the "
        "model's rows_per_batch).")] = None
    model_version: Annotated[ModelVersionArgs | None, dg.Resolver.default(
        description="Also build the observable asset of the model's registry version: the "
        "scores depend on it, their code version follows it.")] = None
    alias_sensor: Annotated[AliasSensorArgs | None, dg.Resolver.default(
        description="Also build the sensor that marks the scores stale and re-scores them "
        "when model_version's alias moves (needs model_version).")] = None
    external_source: ExternalSource = False
    resource: ResolvedResource = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = f"ModelScoringComponent '{self.name}'"
        model_asset = None
        if self.model_version is not None:
            uri, registry = self._watched(where)
            model_asset = build_model_version_asset(
                name=self.model_version.name, model_uri=uri, registry_uri=registry,
                group_name=(self.asset_attributes or {}).get("group_name"))
        asset = build_scoring_asset(
            **values(self, FACTORY_ATTRIBUTES), resource=self.resource,
            input_columns=self.input_columns,
            model=self.model_name, model_column=self.model_column,
            output_column=self.output_column, model_asset=model_asset,
            rows_per_request=self.rows_per_request)
        sensors = []
        if self.alias_sensor is not None:
            if model_asset is None:
                raise dg.DagsterInvalidDefinitionError(
                    f"{where}: alias_sensor watches model_version's alias; add "
                    "model_version: {name: <model asset>}.")
            args = self.alias_sensor
            sensors.append(build_model_alias_sensor(
                asset, model_asset, minimum_interval_seconds=args.minimum_interval_seconds,
                rerun=args.rerun,
                default_status=(dg.DefaultSensorStatus.RUNNING if args.running
                                else dg.DefaultSensorStatus.STOPPED)))
        assets = [*external_source_specs(self), model_asset, asset]
        return dg.Definitions(assets=[a for a in assets if a is not None], sensors=sensors,
                              resources=provided_resources(self, context))

    def _watched(self, where: str) -> tuple[str, str | None]:
        """model_version's URI and registry, from the resource where the YAML leaves them out."""
        args = self.model_version
        uri, registry = args.model_uri, args.registry_uri
        resource = self.resource
        if resource is not None:
            for model in resource.mlflow_models:
                if model.name == self.model_name:
                    uri = uri or model.model_uri
                    registry = registry or _plain(model.registry_uri)
            for endpoint in resource.endpoints:
                if endpoint.protocol == "mlflow" and self.model_name in endpoint.models:
                    uri = uri or endpoint.served_model_uri
            registry = registry or _plain(resource.mlflow_registry_uri)
        if uri is None:
            why = ("the rows name their models (model_column)" if self.model_name is None else
                   f"the component's resource has no MlflowModel '{self.model_name}' nor an "
                   "mlflow endpoint with served_model_uri serving it")
            raise dg.DagsterInvalidDefinitionError(
                f"{where}: model_version needs model_uri (e.g. models:/risk@champion): {why}.")
        return uri, registry


def _plain(value: Any) -> str | None:
    """A registry URI as the definitions load ({env: NAME} read now: the version it resolves
    to is part of the code version)."""
    return value.get_value() if isinstance(value, dg.EnvVar) else value
