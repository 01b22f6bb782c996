"""MLflow models for ``predict()``: which exact model a name or URI means, and loading it once.

A call names models as the user thinks of them (``risk``, ``models:/risk@champion``, a run's
artifact, a folder). Before anything is sent each is *resolved* to what pins it: a registered
model's version (an alias or stage read from the registry now, so a moved alias means the new
version), a run's artifact, a folder's ``model_uuid``. That identity goes into every request key,
so the ledger keeps each version's predictions apart and a new version is scored afresh. A served
model (an ``mlflow`` endpoint) is pinned the same way where its endpoint declares what it serves
(``served_model_uri``, read from the registry, or ``served_model_version``); undeclared, its key
covers the name only.

Loading is per process and per identity (:func:`load_model`): a Spark Python worker, a Dagster
step or a script loads each model once, whatever the number of batches or calls.

``mlflow`` is imported only here and only when a model is used, so the rest of the library works
without it (``pip install 'dagster-batchllm[mlflow]'``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InferenceConfigError
from ...settings import EndpointSpec, InferenceSettings, MlflowModelSpec
from .registry import ready_registry

IN_PROCESS, SERVED = "in_process", "served"
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<ref>[^/]+))?/?$")


@dataclass(frozen=True)
class ResolvedModel:
    """What one model name of a call means, pinned. Picklable: it travels to Spark executors."""

    name: str  # as the call or the model column says it
    kind: str  # IN_PROCESS or SERVED
    identity: str  # what request keys cover: changes exactly when the model does
    uri: str | None = None  # the pinned URI an in-process model is loaded from
    registry_uri: str | None = None
    registered_name: str | None = None
    version: str | None = None
    alias: str | None = None
    run_id: str | None = None
    rows_per_batch: int = 1024
    error: str | None = None  # why it cannot be used: its rows fail with this

    @property
    def served(self) -> bool:
        """Served by an endpoint (``mlflow`` protocol), not loaded in this process."""
        return self.kind == SERVED

    def describe(self) -> dict[str, Any]:
        """For metadata and logs (no secrets: registry URIs may hold a password, left out)."""
        return {k: v for k, v in (("kind", self.kind), ("uri", self.uri),
                                  ("registered_name", self.registered_name),
                                  ("version", self.version), ("alias", self.alias),
                                  ("run_id", self.run_id), ("error", self.error)) if v}


def looks_like_uri(ref: str) -> bool:
    return ref.startswith(("models:/", "runs:/", "file:", "/", "./", "../")) or os.path.isdir(ref)


def resolve_models(settings: InferenceSettings, refs: list[str]) -> dict[str, ResolvedModel]:
    """Each model a call names, resolved (unknown or unresolvable ones carry ``error``)."""
    specs = {m.name: m for m in settings.mlflow_models}
    served: dict[str, list[EndpointSpec]] = {}
    for endpoint in settings.endpoints:
        if endpoint.protocol == "mlflow":
            for model in endpoint.models:
                served.setdefault(model, []).append(endpoint)
    out: dict[str, ResolvedModel] = {}
    for ref in dict.fromkeys(refs):
        if ref in served:
            out[ref] = _resolve_served(ref, served[ref], settings)
        elif ref in specs:
            out[ref] = _resolve_uri(ref, specs[ref], settings)
        elif looks_like_uri(ref):
            out[ref] = _resolve_uri(ref, MlflowModelSpec(name=ref, model_uri=ref), settings)
        else:
            known = sorted(specs) + sorted(served)
            out[ref] = ResolvedModel(
                name=ref, kind=IN_PROCESS, identity="",
                error=f"unknown model '{ref}': configure it (mlflow_models=[MlflowModel(name="
                      f"'{ref}', model_uri=...)]) or name a URI (models:/..., runs:/..., a path); "
                      f"known: {known}")
    return out


def _resolve_served(ref: str, endpoints: list[EndpointSpec], settings: InferenceSettings
                    ) -> ResolvedModel:
    """A served model, pinned as far as its endpoints declare what they serve: the version
    (``served_model_uri`` read from the registry now, or ``served_model_version``) joins the
    name in the key, so a redeploy of another version under the same name is scored afresh.
    Undeclared, the key covers the name only (the server's version is its own business)."""
    declared = {(e.served_model_uri, e.served_model_version) for e in endpoints}
    base = ResolvedModel(name=ref, kind=SERVED, identity=f"served:{ref}")
    if len(declared) > 1:  # the pool spreads rows over them: which version answered is unknown
        said = ", ".join(f"'{e.name}': {e.served_model_uri or e.served_model_version or '-'}"
                         for e in endpoints)
        return replace(base, error=f"served model '{ref}': its endpoints declare different "
                                   f"models ({said}); a model's endpoints must serve the same")
    uri, version = declared.pop()
    if version is not None:
        return replace(base, identity=f"served:{ref}|version:{version}", version=version)
    if uri is None:
        return base
    pinned = _resolve_uri(ref, MlflowModelSpec(name=ref, model_uri=uri), settings)
    if pinned.error:
        return replace(base, uri=uri, error=pinned.error.replace(
            f"model '{ref}'", f"served model '{ref}' (served_model_uri)", 1))
    # The pinned URI is what the server loaded; nothing here loads it (kind stays SERVED).
    return replace(pinned, kind=SERVED, identity=f"served:{ref}|{pinned.identity}")


def _resolve_uri(ref: str, spec: MlflowModelSpec, settings: InferenceSettings) -> ResolvedModel:
    registry = spec.registry_uri or settings.mlflow_registry_uri
    base = ResolvedModel(name=ref, kind=IN_PROCESS, identity="", uri=spec.model_uri,
                         registry_uri=registry, rows_per_batch=spec.rows_per_batch)
    try:
        return _pin(base, spec.model_uri)
    except ImportError:
        raise InferenceConfigError(
            "predict() with MLflow models needs mlflow: pip install 'dagster-batchllm[mlflow]' "
            "(or mlflow-skinny)") from None
    except Exception as exc:  # the registry's own words: no such model, version or alias
        return replace(base, error=f"model '{ref}' ({spec.model_uri}) cannot be resolved: "
                                   f"{_short(exc)}")


def _pin(base: ResolvedModel, uri: str) -> ResolvedModel:
    match = _MODELS_URI.match(uri)
    if match:
        from mlflow import MlflowClient

        ready_registry(base.registry_uri)
        client = MlflowClient(tracking_uri=base.registry_uri, registry_uri=base.registry_uri)
        name, alias, ref = match["name"], match["alias"], match["ref"]
        if alias:
            version = client.get_model_version_by_alias(name, alias)
        elif ref and ref.isdigit():
            version = client.get_model_version(name, ref)
        else:  # a stage (Production, Staging) or "latest" / nothing: the newest such version
            stages = None if ref in (None, "latest") else [ref]
            found = client.get_latest_versions(name, stages=stages)
            if not found:
                raise LookupError(f"registered model '{name}' has no version in stage {ref!r}")
            version = max(found, key=lambda v: int(v.version))
        pinned = f"models:/{name}/{version.version}"
        return replace(base, uri=pinned, identity=f"{pinned}|{version.source}",
                       registered_name=name, version=str(version.version), alias=alias,
                       run_id=version.run_id)
    if uri.startswith("runs:/"):
        run_id = uri[len("runs:/"):].split("/", 1)[0]
        return replace(base, identity=uri, run_id=run_id)  # a run's artifacts do not change
    path = os.path.abspath(uri[len("file://"):] if uri.startswith("file://") else uri)
    mlmodel = os.path.join(path, "MLmodel")
    if not os.path.isfile(mlmodel):
        raise FileNotFoundError(f"no MLmodel file in {path}")
    from mlflow.models import Model

    # Saving a model again gives it a new uuid: the key changes exactly when the model does.
    model_uuid = Model.load(mlmodel).model_uuid or str(os.path.getmtime(mlmodel))
    return replace(base, uri=path, identity=f"{path}|{model_uuid}")


# -- loading, once per process and model ---------------------------------------------------------
_loaded: dict[str, Any] = {}
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_uri_lock = threading.RLock()  # MLflow's tracking/registry URI is process-wide
#: Loads per model identity in this process (a Spark worker's own count).
load_counts: Counter[str] = Counter()


def load_model(model: ResolvedModel) -> Any:
    """The pyfunc model for ``model``, loaded on first use in this process."""
    found = _loaded.get(model.identity)
    if found is not None:
        return found
    with _locks_guard:
        lock = _locks.setdefault(model.identity, threading.Lock())
    with lock:
        found = _loaded.get(model.identity)
        if found is None:
            import mlflow.pyfunc

            if model.uri and model.uri.startswith(("models:/", "runs:/")):
                ready_registry(model.registry_uri)
            with mlflow_uris(model.registry_uri):
                found = mlflow.pyfunc.load_model(model.uri)
            _loaded[model.identity] = found
            load_counts[model.identity] += 1
    return found


@contextlib.contextmanager
def mlflow_uris(uri: str | None):
    """MLflow's process-wide tracking and registry URI set to ``uri`` for the block, then put
    back exactly as they were, environment included: ``mlflow.set_registry_uri`` also exports
    ``MLFLOW_REGISTRY_URI``, which would otherwise outlive the block and send every later
    subprocess (and the user's own ``mlflow`` calls) to this registry."""
    if uri is None:
        yield
        return
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    with _uri_lock:
        saved = (getattr(tracking_utils, "_tracking_uri", None),
                 getattr(registry_utils, "_registry_uri", None),
                 {name: os.environ.get(name) for name in _URI_VARIABLES})
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        try:
            yield
        finally:
            tracking_utils._tracking_uri, registry_utils._registry_uri = saved[0], saved[1]
            for name, value in saved[2].items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def input_problem(pyfunc_model: Any, columns: list[str]) -> str | None:
    """Why ``columns`` cannot feed the model, from its signature (required inputs missing)."""
    try:
        schema = pyfunc_model.metadata.get_input_schema()
    except Exception:
        return None
    if schema is None or not schema.has_input_names():
        return None
    required = [spec.name for spec in schema.inputs if getattr(spec, "required", True)]
    missing = [name for name in required if name not in columns]
    if missing:
        return (f"the model's signature needs input(s) {missing}, which input_columns "
                f"{columns} do not give; pass them in input_columns")
    return None


def single_required_input(model: ResolvedModel) -> str | None:
    """The name of an in-process model's only required input (its signature's), or None: what
    a request that is one plain value (SQL's ``ai_query('model', text)``) is fed as."""
    if model.kind != IN_PROCESS or model.error:
        return None
    try:
        schema = load_model(model).metadata.get_input_schema()
    except Exception:
        return None
    if schema is None or not schema.has_input_names():
        return None
    required = [spec.name for spec in schema.inputs if getattr(spec, "required", True)]
    return required[0] if len(required) == 1 else None


def short_error(exc: BaseException, limit: int = 300) -> str:
    """An exception in a line: MLflow's schema errors quote the whole batch, which is cut."""
    return _short(exc, limit)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    # "Failed to enforce schema of data '<the frame>' with schema '<...>'. Error: <reason>"
    if "Error: " in text and text.startswith("Failed to enforce schema"):
        text = "input does not match the model's schema: " + text.rsplit("Error: ", 1)[1]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
