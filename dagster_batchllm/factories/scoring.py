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
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from ..core import (
    InferenceConfigError,
    InferenceSettings,
    MlflowModelSpec,
    ModelsUnresolvedError,
    PredictCall,
    ResolvedModel,
    resolve_models,
    validate_identifier,
)
from .partitions import Figures, LogLine
from .shared import AssetJob, AssetOptions, asset_factory, asset_key_of, build_asset

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
            # Not registered yet, as when the asset that trains it runs in the same run (the
            # observation cannot wait for it): recorded as such, not a failed run. What scores
            # with it fails and names the asset to materialize first.
            context.log.warning(f"batchllm: {model_uri} has no version yet: {model.error}")
            return dg.ObserveResult(data_version=dg.DataVersion(_data_version(model)),
                                    metadata={"batchllm/model/error": model.error})
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


@asset_factory(without=("backfill_policy", "transform", "io_manager_key", "kinds", "tags",
                         "owners", "pool"))
def build_scoring_asset(
    options: AssetOptions,
    *,
    input_columns: Sequence[str],
    model: str | None = None,
    model_column: str | None = None,
    output_column: str = "prediction",
    model_asset: dg.SourceAsset | None = None,
    deps: Sequence[Any] | None = None,
    prepare: Callable[[Any], Any] | None = None,
    rows_per_request: int | None = None,
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

    def job() -> ScoringJob:
        call = PredictCall(input_columns=tuple(input_columns), model=model,
                           model_column=model_column, output_column=output_column,
                           rows_per_request=rows_per_request)
        return ScoringJob(call, model_asset=model_asset, deps=deps, prepare=prepare)

    return build_asset("build_scoring_asset", options, job)


class ScoringJob(AssetJob):
    """A prediction per row from an MLflow model; the code version follows the model version
    the watched alias resolves to when the definitions load."""

    kinds = frozenset({"mlflow", "pandas"})
    call: PredictCall

    def __init__(self, call: PredictCall, *, model_asset: dg.SourceAsset | None,
                 deps: Sequence[Any] | None, prepare: Callable[[Any], Any] | None) -> None:
        super().__init__(call)
        self.model_asset, self.upstream, self.prepare_table = model_asset, deps or [], prepare
        self.watched = _watched(model_asset) if model_asset is not None else None
        self.version = _version_at_load(*self.watched) if self.watched else None
        self._code_version = hashlib.sha256(json.dumps([
            list(call.input_columns), call.model, call.model_column, call.output_column,
            self.version.identity if self.version is not None else None]).encode()
        ).hexdigest()[:16]

    def send(self, llm: Any, frame: Any, **run: Any) -> Any:
        try:
            return llm.predict(frame, self.call, **run)
        except ModelsUnresolvedError as exc:  # one model or all of a column's: no row can pass
            raise dg.Failure(f"{exc}. Nothing was sent. {self._first_step()}") from exc

    def _first_step(self) -> str:
        """What makes the model exist: the assets this one depends on (other than the model
        version it watches), which a run must materialize before scoring."""
        upstream = [asset_key_of(d).to_user_string() for d in self.upstream]
        if upstream:
            return (f"If the model is trained and registered upstream, materialize "
                    f"{' and '.join(upstream)} first, then this asset.")
        if self.model_asset is not None:
            return (f"Register the model {self.watched[0]} resolves to (watched by "
                    f"{self.model_asset.key.to_user_string()}) first, then this asset.")
        return "Register the model, or fix the model name or URI."

    def code_version(self, resource: Any = None) -> str:
        if resource is None:
            return self._code_version
        # What the resource pins of the model (a served version, an in-process model's URI).
        return hashlib.sha256(json.dumps([self._code_version, resource.code_version_of(
            self.call)]).encode()).hexdigest()[:16]

    def version_covers(self) -> str:
        return ("the model, its input and output columns"
                + (f" and the version {self.watched[0]} resolved to when the definitions loaded"
                   if self.watched else ""))

    def deps(self) -> list[Any]:
        return [*([self.model_asset.key] if self.model_asset is not None else []),
                *(asset_key_of(d) for d in self.upstream)]

    def prepare(self, table: Any) -> Any:
        return self.prepare_table(table) if self.prepare_table is not None else table

    def description(self) -> str:
        call = self.call
        who = (f"model `{call.model}`" if call.model
               else f"per-row models from column `{call.model_column}`")
        if self.version is not None and self.version.version:
            loaded = f"version {self.version.version} when the definitions loaded"
            who += f" ({self.watched[0]}: {loaded})"
        return (f"Scores with {who}: features "
                f"{', '.join(f'`{c}`' for c in call.input_columns)}; predictions in "
                f"`{call.output_column}`, failed rows' reasons in `{call.error_column}`.")

    def column_docs(self, input_columns: Sequence[str]
                    ) -> tuple[dict[str, str], dict[str, str]]:
        return {
            self.call.output_column: "The model's prediction; null where the row failed.",
            self.call.error_column: "Why the row has no prediction, as '<error_type>: "
                                    "<reason>'.",
        }, {}

    def figures(self, llm: Any, asset: str) -> tuple[Figures, LogLine]:
        """What the run did (requests, speed) and which model versions answered."""
        model = self.call.model

        def figures(key, result, stats, rows_out):
            if result is None:
                return {}
            return {
                "batchllm/run/requests": stats.requests,
                "batchllm/run/rows_per_s": round(stats.rows_per_s, 2),
                "batchllm/run/elapsed_s": round(stats.elapsed_s, 3),
                "batchllm/models": dg.MetadataValue.json(result.models),
                **(_model_metadata(result.models.get(model, {}), model)
                   if model is not None else {}),
            }

        def log_line(key, result, stats, rows_out):
            if result is None:
                return None
            return (f"batchllm: {asset} {key or ''}: {stats.summary()}; models "
                    f"{json.dumps(result.models)}")

        return figures, log_line


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
