"""The resource's config classes: ``Endpoint``, ``MlflowModel``, ``ManagedEndpoint``,
``PriceConfig``, each mirroring a plain-data spec of the core (its one home for defaults and
descriptions), and the helpers that read config into those specs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import dagster as dg
from pydantic import Field, field_validator, model_validator

from .core import (
    DESCRIPTION,
    EVERY_MODEL,
    EndpointSpec,
    InferenceConfigError,
    InferenceSettings,
    MlflowModelSpec,
    Price,
)
from .managed.start import ManagedEndpointSpec


def declared(spec: type, name: str) -> Any:
    """The pydantic Field of config that mirrors field ``name`` of the plain-data ``spec``,
    with that field's default and description: the spec is their one home."""
    source = _SPEC_FIELDS[spec][name]
    options: dict[str, Any] = {"description": source.metadata[DESCRIPTION]}
    if isinstance(source.default, tuple):  # config lists are lists; the specs' are tuples
        options["default_factory"] = functools.partial(list, source.default)
    elif source.default is not dataclasses.MISSING:
        options["default"] = source.default
    elif source.default_factory is not dataclasses.MISSING:
        options["default_factory"] = source.default_factory
    if not source.repr:
        options["repr"] = False
    return Field(**options)


def declared_prices(spec: type) -> Any:
    """The config field of a spec's ``prices``: a mapping model -> :class:`PriceConfig`
    (``'*'``: every model), with the spec's description; a Price or a mapping of Prices given
    in code becomes config through :func:`as_price_config`, which the class calls before
    pydantic checks the field."""
    return Field(default_factory=dict,
                 description=_SPEC_FIELDS[spec]["prices"].metadata[DESCRIPTION])


def spec_values(config: dg.Config, spec: type, *, converted: Iterable[str] = ()) -> dict:
    """The values of ``spec``'s fields, read from the config by name (lists as tuples: the
    specs are frozen), except the ``converted`` ones, which the caller builds itself."""
    skip = set(converted)
    return {f.name: _frozen(_resolved(getattr(config, f.name), config, f.name))
            for f in dataclasses.fields(spec) if f.name not in skip}


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _resolved(value: Any, config: Any, field: str) -> Any:
    """A ``dg.EnvVar`` read now. In a Dagster run, Dagster has read it already; outside one
    (a script, a notebook) this is where it is read, so the same definitions work in both."""
    if not isinstance(value, dg.EnvVar):
        return value
    found = value.get_value()
    if found is None:
        owner = getattr(config, "name", None)
        where = f"{type(config).__name__}{f' {owner!r}' if isinstance(owner, str) else ''}"
        raise InferenceConfigError(
            f"{where}: {field}=dg.EnvVar({value.env_var_name!r}) but the environment variable "
            f"{value.env_var_name} is not set; export it or pass the value itself.")
    return found


_SPEC_FIELDS = {spec: {f.name: f for f in dataclasses.fields(spec)}
                for spec in (EndpointSpec, ManagedEndpointSpec, InferenceSettings,
                             MlflowModelSpec, Price)}


class PriceConfig(dg.Config):
    """A :class:`~dagster_batchllm.core.pricing.Price` as config (YAML, the launchpad): its
    fields, with its defaults and descriptions, checked as it checks them when built.

    ``Endpoint.prices`` and the resource's ``prices`` are mappings model -> these fields,
    ``'*'`` standing for every model; in code they take Prices::

        prices:
          gpt-4o: {input_per_mtok: 2.5, output_per_mtok: 10, cached_input_per_mtok: 1.25}
          '*': {input_per_mtok: 0.2, output_per_mtok: 0.6}
    """

    input_per_mtok: float = declared(Price, "input_per_mtok")
    output_per_mtok: float = declared(Price, "output_per_mtok")
    cached_input_per_mtok: float | None = declared(Price, "cached_input_per_mtok")
    batch_discount: float = declared(Price, "batch_discount")
    batch_input_per_mtok: float | None = declared(Price, "batch_input_per_mtok")
    batch_output_per_mtok: float | None = declared(Price, "batch_output_per_mtok")

    @model_validator(mode="after")
    def _a_valid_price(self) -> PriceConfig:
        self.to_price()  # refused here, as Price refuses it, not at the first call
        return self

    def to_price(self) -> Price:
        return Price(**spec_values(self, Price))


def as_price_config(value: Any) -> Any:
    """Prices as given in code (one Price for every model, a mapping model -> Price) in their
    config form; config already in that form passes as it is (pydantic checks it)."""
    if isinstance(value, Price):
        value = {EVERY_MODEL: value}
    if isinstance(value, Mapping):
        return {model: PriceConfig(**dataclasses.asdict(price)) if isinstance(price, Price)
                else price for model, price in value.items()}
    return value


def spec_prices(prices: Mapping[str, PriceConfig]) -> dict[str, Price]:
    """Config prices as the core's, model -> Price."""
    return {model: price.to_price() for model, price in prices.items()}


class Endpoint(dg.Config):
    """One OpenAI-compatible server (vLLM, TGI, llama.cpp's llama-server, OpenAI).

    Its fields are those of :class:`~dagster_batchllm.core.settings.EndpointSpec`."""

    name: str = declared(EndpointSpec, "name")
    base_url: str = declared(EndpointSpec, "base_url")
    models: list[str] = declared(EndpointSpec, "models")
    max_concurrency: int = declared(EndpointSpec, "max_concurrency")
    api_key: str | None = declared(EndpointSpec, "api_key")
    tokens_per_minute: int | None = declared(EndpointSpec, "tokens_per_minute")
    requests_per_minute: int | None = declared(EndpointSpec, "requests_per_minute")
    rate_limit_window_s: float = declared(EndpointSpec, "rate_limit_window_s")
    max_context_tokens: int | None = declared(EndpointSpec, "max_context_tokens")
    embedding_models: list[str] = declared(EndpointSpec, "embedding_models")
    batch_api: bool = declared(EndpointSpec, "batch_api")
    max_requests_per_batch: int = declared(EndpointSpec, "max_requests_per_batch")
    max_bytes_per_batch: int = declared(EndpointSpec, "max_bytes_per_batch")
    batch_protocol: Literal["openai", "anthropic"] = declared(EndpointSpec, "batch_protocol")
    protocol: Literal["openai", "mlflow"] = declared(EndpointSpec, "protocol")
    served_model_uri: str | None = declared(EndpointSpec, "served_model_uri")
    served_model_version: str | None = declared(EndpointSpec, "served_model_version")
    tokenize_route: bool = declared(EndpointSpec, "tokenize_route")
    prices: dict[str, PriceConfig] = declared_prices(EndpointSpec)

    @field_validator("prices", mode="before")
    @classmethod
    def _prices_in_config_form(cls, value: Any) -> Any:
        return as_price_config(value)  # a Price, or a mapping of them, as the core takes it

    def to_spec(self) -> EndpointSpec:
        return EndpointSpec(prices=spec_prices(self.prices),
                            **spec_values(self, EndpointSpec, converted=("prices",)))


class MlflowModel(dg.Config):
    """A traditional ML model (MLflow pyfunc) scored in process by ``predict()``.

    Its fields are those of :class:`~dagster_batchllm.core.settings.MlflowModelSpec`."""

    name: str = declared(MlflowModelSpec, "name")
    model_uri: str = declared(MlflowModelSpec, "model_uri")
    registry_uri: str | None = declared(MlflowModelSpec, "registry_uri")
    rows_per_batch: int = declared(MlflowModelSpec, "rows_per_batch")

    def to_spec(self) -> MlflowModelSpec:
        return MlflowModelSpec(**spec_values(self, MlflowModelSpec))


class ManagedEndpoint(dg.Config):
    """An endpoint the resource starts on 127.0.0.1 at setup and stops at teardown.

    Its fields are those of :class:`~dagster_batchllm.managed.start.ManagedEndpointSpec`."""

    kind: Literal["classical", "vllm"] = declared(ManagedEndpointSpec, "kind")
    name: str = declared(ManagedEndpointSpec, "name")
    max_concurrency: int | None = declared(ManagedEndpointSpec, "max_concurrency")
    process: bool = declared(ManagedEndpointSpec, "process")
    model_path: str | None = declared(ManagedEndpointSpec, "model_path")
    model_name: str | None = declared(ManagedEndpointSpec, "model_name")
    aliases: list[str] = declared(ManagedEndpointSpec, "aliases")
    embedding: bool = declared(ManagedEndpointSpec, "embedding")
    max_num_seqs: int = declared(ManagedEndpointSpec, "max_num_seqs")
    max_model_len: int | None = declared(ManagedEndpointSpec, "max_model_len")
    gpus: list[int] = declared(ManagedEndpointSpec, "gpus")
    tensor_parallel_size: int = declared(ManagedEndpointSpec, "tensor_parallel_size")
    cpu_kv_cache_gib: int = declared(ManagedEndpointSpec, "cpu_kv_cache_gib")
    extra_args: list[str] = declared(ManagedEndpointSpec, "extra_args")
    startup_timeout_s: float = declared(ManagedEndpointSpec, "startup_timeout_s")

    def to_spec(self) -> ManagedEndpointSpec:
        return ManagedEndpointSpec(**spec_values(self, ManagedEndpointSpec))


# The settings fields that are not copied by name: to_settings() builds each from these
# resource fields of other shapes.
SETTINGS_BUILT_FROM = {
    "endpoints": ("endpoints", "managed_endpoints"),
    "prices": ("prices",),
    "mlflow_models": ("mlflow_models",),
}
