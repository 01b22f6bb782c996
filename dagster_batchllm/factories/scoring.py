"""Traditional ML models as Dagster assets: the model's registry version, scoring, a sensor.

* :func:`build_model_version_asset`: an observable source asset whose data version is the
  registry version an alias (or stage) points at now. Observing it after the alias moved gives
  it a new data version, which marks the scoring assets that depend on it stale.
* :func:`build_scoring_asset`: "this table, this model, these features, this column" as an
  asset over ``BatchInferenceResource.predict``: partitions (single-run backfills keep each
  partition's ledger records apart), metadata with the model's name, version, alias and run,
  rows/s and failures, the inference checks, and a code version that covers the model version
  resolved when the definitions load.
* :func:`build_model_alias_sensor`: observes the model on each tick; when the alias has moved it
  records the new version (so the UI shows the scoring asset stale) and requests a run of the
  scoring asset (each materialized partition of a partitioned one). The rerun scores every row
  again under the new version: the version is part of each request key, and the old version's
  records of the partition are retired.
"""

import hashlib
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from .inference import _asset_attributes, _asset_key
from .checks import inference_check_specs
from ..core.errors import InferenceConfigError
from ..core.tasks.predict.models import ResolvedModel, resolve_models
from ..core.tasks.predict.task import PredictCall
from ..core.settings import InferenceSettings, MlflowModelSpec
from ..core.ledger.stores import validate_identifier
from .metadata import column_schema, table_figures
from .partitions import call_per_partition, partition_events

MODEL_URI = "batchllm/model_uri"
REGISTRY_URI = "batchllm/registry_uri"


def resolve_registered(model_uri: str, registry_uri: str | None) -> ResolvedModel:
    """What ``model_uri`` points at in the registry now (without loading it)."""
    settings = InferenceSettings(endpoints=(), mlflow_models=(
        MlflowModelSpec(name="watched", model_uri=model_uri, registry_uri=registry_uri),))
    return resolve_models(settings, ["watched"])["watched"]


def model_version_metadata(model: ResolvedModel) -> dict[str, Any]:
    return {f"batchllm/model/{k}": v for k, v in model.describe().items() if k != "kind"}


def _data_version(model: ResolvedModel) -> str:
    return model.identity or f"unresolved: {model.error}"


def build_model_version_asset(*, name: str, model_uri: str, registry_uri: str | None = None,
                              group_name: str | None = None,
                              description: str | None = None) -> dg.SourceAsset:
    """An observable source asset for a registered model: its data version is the identity of
    the version ``model_uri`` (``models:/risk@champion``) resolves to when observed."""
    validate_identifier(name, "name")

    def _model_version(context) -> dg.ObserveResult:
        model = resolve_registered(model_uri, registry_uri)
        if model.error:
            raise dg.Failure(model.error)
        context.log.info(f"batchllm: {model_uri} is version {model.version} ({model.uri})")
        return dg.ObserveResult(data_version=dg.DataVersion(_data_version(model)),
                                metadata=model_version_metadata(model))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # observable_source_asset is "beta"
        return dg.observable_source_asset(
            name=name, group_name=group_name,
            description=description or f"The MLflow model `{model_uri}`: its data version is the "
            "registry version it resolves to, so a moved alias marks what scores with it stale.",
            metadata={MODEL_URI: model_uri,
                      **({REGISTRY_URI: registry_uri} if registry_uri else {})},
        )(_model_version)


def _watched(model_asset: dg.SourceAsset) -> tuple[str, str | None]:
    metadata = model_asset.metadata or {}
    uri = metadata.get(MODEL_URI)
    if uri is None:
        raise dg.DagsterInvalidDefinitionError(
            f"{model_asset.key.to_user_string()} was not built by build_model_version_asset")
    registry = metadata.get(REGISTRY_URI)
    value = lambda v: getattr(v, "value", v)  # noqa: E731 - metadata values are wrapped
    return value(uri), value(registry) if registry is not None else None


def build_scoring_asset(
    *,
    name: str,
    source: Any,
    input_columns: Sequence[str],
    model: str | None = None,
    model_column: str | None = None,
    output_column: str = "prediction",
    model_asset: dg.SourceAsset | None = None,
    deps: Sequence[Any] | None = None,
    prepare: Callable[[Any], Any] | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
    partition_column: str | None = None,
    key_columns: Sequence[str] | None = None,
    rows_per_request: int | None = None,
    resource_key: str = "llm",
    group_name: str | None = None,
    description: str | None = None,
    warn_failed_rate: float = 0.01,
    error_failed_rate: float = 0.10,
    preview_rows: int = 5,
    asset_attributes: Mapping[str, Any] | None = None,
) -> dg.AssetsDefinition:
    """A software-defined asset scoring an upstream table with an MLflow model.

    ``model``: a name of the resource's ``mlflow_models`` (or a model an ``mlflow`` endpoint
    serves, or a URI); ``model_column``: a column naming each row's model instead.
    ``model_asset`` (from :func:`build_model_version_asset`): the asset depends on it, so a
    moved alias marks it stale; its code version covers the version resolved at load. For a
    served model, declare what the endpoint serves (``Endpoint(..., protocol="mlflow",
    served_model_uri="models:/risk@champion")``) and watch that URI: the predictions are then
    keyed, and the metadata named, by the served version as for an in-process model.
    ``deps``: other upstream assets (e.g. the asset that trains and registers the model);
    ``prepare``: a function applied to the upstream table before scoring (e.g. adding the
    model column). ``asset_attributes``: Dagster's (what a component's ``asset_attributes:``
    resolves to: ``group_name``, ``description``, ``kinds``, ``tags``, ``owners``,
    ``metadata``, ``deps``, ``code_version``, ``automation_condition``, ``freshness_policy``);
    ``deps`` add to the model asset, an explicit ``code_version`` replaces the one that
    follows the model version.

    Example::

        risk_model = build_model_version_asset(name="risk_model",
                                               model_uri="models:/risk@champion")
        scores = build_scoring_asset(name="risk_scores", source="features", model="risk",
                                     input_columns=["f1", "f2"], output_column="risk",
                                     model_asset=risk_model)
    """
    where = f"build_scoring_asset('{name}')"
    try:
        validate_identifier(name, "name")
        call = PredictCall(input_columns=tuple(input_columns), model=model,
                           model_column=model_column, output_column=output_column,
                           rows_per_request=rows_per_request)
    except InferenceConfigError as exc:
        raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
    if partition_column is not None and partitions_def is None:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: partition_column is only meaningful with partitions_def.")
    attributes = _asset_attributes(where, asset_attributes, group_name=group_name,
                                   description=description)
    asset_key = dg.AssetKey([name])
    watched = _watched(model_asset) if model_asset is not None else None
    version = _version_at_load(*watched) if watched else None
    code_version = hashlib.sha256(json.dumps([
        list(call.input_columns), call.model, call.model_column, call.output_column,
        version.identity if version is not None else None]).encode()).hexdigest()[:16]
    who = f"model `{model}`" if model else f"per-row models from column `{model_column}`"
    if version is not None and version.version:
        who += f" ({watched[0]}: version {version.version} when the definitions loaded)"
    key_columns = list(key_columns or [])
    backfill_policy = None
    if partitions_def is not None:
        backfill_policy = (dg.BackfillPolicy.single_run() if partition_column
                           else dg.BackfillPolicy.multi_run(1))

    def _scoring_asset(context: dg.AssetExecutionContext, source_table):
        llm = getattr(context.resources, resource_key)
        if prepare is not None:
            source_table = prepare(source_table)
        missing = [c for c in key_columns if c not in source_table.columns]
        if missing:
            raise dg.Failure(f"{where}: key_columns {missing} are not in the input table.")
        scored, table = call_per_partition(
            context, source_table, partition_column,
            lambda frame, key: llm.predict(frame, call, context=context, partition_key=key,
                                           supersede_stale=key is not None))
        schema = column_schema(table, {
            output_column: "The model's prediction; null where the row failed.",
            call.error_column: "Why the row has no prediction, as '<error_type>: <reason>'."})

        def figures(key, result, stats, rows_out):
            out: dict[str, Any] = {**table_figures(rows_out, preview_rows, schema=schema)}
            if result is not None:
                out.update({
                    "batchllm/run/requests": stats.requests,
                    "batchllm/run/rows_per_s": round(stats.rows_per_s, 2),
                    "batchllm/run/elapsed_s": round(stats.elapsed_s, 3),
                    "batchllm/models": dg.MetadataValue.json(result.models),
                })
                if model is not None:
                    out.update(_model_metadata(result.models.get(model, {}), model))
            return out

        def log_line(key, result, stats, rows_out):
            if result is None:
                return None
            return (f"batchllm: {name} {key or ''}: {stats.summary()}; models "
                    f"{json.dumps(result.models)}")

        yield from partition_events(
            context, asset_key, table, scored, source_table, partition_column=partition_column,
            key_columns=key_columns, warn_failed_rate=warn_failed_rate,
            error_failed_rate=error_failed_rate, figures=figures, log_line=log_line)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # backfill_policy is "beta"
        return dg.asset(
            name=name,
            ins={"source_table": dg.AssetIn(key=_asset_key(source))},
            partitions_def=partitions_def,
            backfill_policy=backfill_policy,
            check_specs=inference_check_specs(asset_key, partitions_def),
            required_resource_keys={resource_key},
            **{**attributes,
               "deps": [*([model_asset.key] if model_asset is not None else []),
                        *(_asset_key(d) for d in [*(deps or []),
                                                  *(attributes.get("deps") or [])])] or None,
               "kinds": set(attributes.get("kinds") or {"mlflow", "pandas"}),
               # The user's own code_version is their call (it then no longer follows the model).
               "code_version": attributes.get("code_version") or code_version,
               "description": attributes.get("description") or (
                   f"Scores with {who}: features "
                   f"{', '.join(f'`{c}`' for c in call.input_columns)}; predictions in "
                   f"`{output_column}`, failed rows' reasons in `{call.error_column}`. "
                   f"Code version `{code_version}` covers the model version."),
               "metadata": {**(attributes.get("metadata") or {}),
                            "batchllm/output_column": output_column}},
        )(_scoring_asset)


def _version_at_load(model_uri: str, registry_uri: str | None) -> ResolvedModel | None:
    """The version the model resolves to as the definitions load; None where that would mean
    creating a registry (a SQLite file not there yet: the model is trained at setup) or mlflow
    is not installed. The code version then covers the call alone."""
    import os

    if registry_uri and registry_uri.startswith("sqlite:///") and not os.path.exists(
            registry_uri[len("sqlite:///"):]):
        return None
    try:
        return resolve_registered(model_uri, registry_uri)
    except InferenceConfigError:
        return None


def _model_metadata(described: dict[str, Any], name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"batchllm/model/name": name}
    for field in ("version", "alias", "registered_name", "uri", "run_id", "kind"):
        if described.get(field):
            out[f"batchllm/model/{field}"] = described[field]
    return out


def build_model_alias_sensor(scoring_asset: dg.AssetsDefinition, model_asset: dg.SourceAsset,
                             *, name: str | None = None, minimum_interval_seconds: int = 60,
                             rerun: bool = True,
                             default_status: dg.DefaultSensorStatus =
                             dg.DefaultSensorStatus.STOPPED) -> dg.SensorDefinition:
    """A sensor that watches where ``model_asset``'s alias points. When it moves, it records an
    observation with the new version (the scoring asset shows stale) and, with ``rerun``,
    requests a run of the scoring asset: each materialized partition of a partitioned one."""
    model_uri, registry_uri = _watched(model_asset)
    target = scoring_asset.key

    @dg.sensor(name=name or f"{target.to_python_identifier()}_model_alias",
               minimum_interval_seconds=minimum_interval_seconds,
               asset_selection=[target], default_status=default_status,
               description=f"Watches {model_uri}: when it resolves to a new version, marks "
               f"{target.to_user_string()} stale and re-scores it.")
    def _alias_sensor(context: dg.SensorEvaluationContext):
        model = resolve_registered(model_uri, registry_uri)
        if model.error:
            return dg.SkipReason(model.error)
        seen = context.cursor
        now = _data_version(model)
        if seen == now:
            return dg.SkipReason(f"{model_uri} is still version {model.version}")
        observation = dg.AssetObservation(
            asset_key=model_asset.key, metadata=model_version_metadata(model),
            tags={"dagster/data_version": now})
        requests = []
        if rerun and seen is not None:
            partitions = scoring_asset.partitions_def
            if partitions is None:
                requests = [dg.RunRequest(run_key=f"{target.to_python_identifier()}:{now}",
                                          asset_selection=[target])]
            else:
                done = context.instance.get_materialized_partitions(target)
                requests = [dg.RunRequest(run_key=f"{key}:{now}", partition_key=key,
                                          asset_selection=[target]) for key in sorted(done)]
        return dg.SensorResult(run_requests=requests, asset_events=[observation], cursor=now)

    return _alias_sensor
