"""``BatchInferenceResource``: the Dagster resource over the inference core."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlparse

import dagster as dg
from dagster._config.field import Field as ConfigField
from dagster._config.field_utils import Shape
from dagster._core.definitions.definition_config_schema import DefinitionConfigSchema
from pydantic import Field, PrivateAttr, field_validator

from .core import (
    CallBase,
    EmbedCall,
    EndpointSpec,
    InferenceCall,
    InferenceClient,
    InferenceEstimate,
    InferenceResult,
    InferenceSettings,
    MlflowModelSpec,
    Plan,
    Price,
)
from .factories.context import read_context
from .managed.start import RunningEndpoint, start_managed
from .resource_config import (
    SETTINGS_BUILT_FROM,
    Endpoint,
    ManagedEndpoint,
    MlflowModel,
    PriceConfig,
    as_price_config,
    declared,
    declared_prices,
    spec_prices,
    spec_values,
)

__all__ = ["SETTINGS_BUILT_FROM", "BatchInferenceResource", "Endpoint", "ManagedEndpoint",
           "MlflowModel"]


class BatchInferenceResource(dg.ConfigurableResource):
    """Batch LLM inference over tables on a pool of OpenAI-compatible endpoints.

    Every row is answered once: answers are kept in a ledger (any SQLAlchemy database) keyed by a
    hash of model, messages and generation parameters, so reruns, retries and backfills pay only
    for what is missing. Requests are spread over the endpoints by free capacity, within each
    endpoint's concurrency and rate limits, with retries, backoff and circuit breakers.

    Example::

        import dagster as dg
        import pandas as pd
        from dagster_batchllm import BatchInferenceResource, Endpoint

        @dg.asset
        def summaries(llm: BatchInferenceResource) -> pd.DataFrame:
            calls = pd.DataFrame({"transcript": ["Customer wants a refund for order 12."]})
            result = llm.infer(calls, prompt="Summarize this call: {transcript}",
                               model="llama-70b", output_column="summary", max_tokens=128)
            return result.df

        defs = dg.Definitions(
            assets=[summaries],
            resources={"llm": BatchInferenceResource(
                endpoints=[Endpoint(name="gpu-a", base_url="http://127.0.0.1:8000/v1",
                                    models=["llama-70b"], max_concurrency=64)],
                store_url="sqlite:///batchllm.db",
            )},
        )

    The fields are those of :class:`~dagster_batchllm.core.settings.InferenceSettings`, except
    ``endpoints``, ``managed_endpoints`` and ``prices``, from which ``to_settings()`` builds the
    settings' ``endpoints`` and ``prices``.

    Run config given at launch (the launchpad, ``launchRun``) is merged over the values set
    here: ``{"resources": {"llm": {"config": {"progress_interval_s": 1}}}}`` changes that one
    field and keeps the endpoints, ``store_url`` and ``default_model`` of the code. (A list,
    such as ``endpoints``, given at launch replaces the code's list.)
    """

    def __init__(self, **data: Any):
        super().__init__(**data)
        # Dagster makes the values set in code the default of the resource's config as a whole,
        # so run config that sets one field replaces them all with the class defaults (a new
        # ledger file ./batchllm.db, no default_model). Each value set in
        # code becomes its own field's default instead, so partial run config merges over it.
        state = self._state__internal__
        self._state__internal__ = state._replace(config_schema=DefinitionConfigSchema(
            _with_field_defaults(state.schema, state.resolved_config_dict)))

    endpoints: list[Endpoint] = Field(
        default_factory=list, description="The servers to spread requests over."
    )
    managed_endpoints: list[ManagedEndpoint] = Field(
        default_factory=list,
        description="Endpoints this resource starts itself (e.g. the embedded default) and pools "
        "with the others.",
    )
    prices: dict[str, PriceConfig] = declared_prices(InferenceSettings)
    mlflow_models: list[MlflowModel] = Field(
        default_factory=list,
        description="Traditional ML models (MLflow pyfunc) scored in process by predict().")
    # The other fields are InferenceSettings' own, with its defaults and descriptions.
    store_url: str | None = declared(InferenceSettings, "store_url")
    ledger_table: str = declared(InferenceSettings, "ledger_table")
    max_attempts: int = declared(InferenceSettings, "max_attempts")
    request_timeout_s: float = declared(InferenceSettings, "request_timeout_s")
    retry_initial_backoff_s: float = declared(InferenceSettings, "retry_initial_backoff_s")
    retry_max_backoff_s: float = declared(InferenceSettings, "retry_max_backoff_s")
    max_retry_after_s: float = declared(InferenceSettings, "max_retry_after_s")
    breaker_failure_threshold: int = declared(InferenceSettings, "breaker_failure_threshold")
    breaker_cooldown_s: float = declared(InferenceSettings, "breaker_cooldown_s")
    default_max_tokens: int = declared(InferenceSettings, "default_max_tokens")
    token_budget: int | None = declared(InferenceSettings, "token_budget")
    default_model: str | None = declared(InferenceSettings, "default_model")
    http_client: Literal["aiohttp", "openai"] = declared(InferenceSettings, "http_client")
    coordinate_runs: bool = declared(InferenceSettings, "coordinate_runs")
    coordination_interval_s: float = declared(InferenceSettings, "coordination_interval_s")
    prefix_affinity: bool = declared(InferenceSettings, "prefix_affinity")
    chunk_rows: int = declared(InferenceSettings, "chunk_rows")
    ledger_flush_rows: int = declared(InferenceSettings, "ledger_flush_rows")
    ledger_flush_interval_s: float = declared(InferenceSettings, "ledger_flush_interval_s")
    progress_interval_s: float = declared(InferenceSettings, "progress_interval_s")
    batch_poll_initial_s: float = declared(InferenceSettings, "batch_poll_initial_s")
    batch_poll_max_s: float = declared(InferenceSettings, "batch_poll_max_s")
    mlflow_registry_uri: str | None = declared(InferenceSettings, "mlflow_registry_uri")
    endpoint_unreachable_after_s: float = declared(InferenceSettings,
                                                    "endpoint_unreachable_after_s")
    endpoint_failing_after_s: float = declared(InferenceSettings, "endpoint_failing_after_s")
    ledger_outage_s: float = declared(InferenceSettings, "ledger_outage_s")
    ledger_statement_timeout_s: float = declared(InferenceSettings, "ledger_statement_timeout_s")
    files_roots: list[str] = declared(InferenceSettings, "files_roots")
    allow_image_urls: bool = declared(InferenceSettings, "allow_image_urls")
    max_reply_bytes: int | None = declared(InferenceSettings, "max_reply_bytes")

    _client: InferenceClient | None = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _running: list[RunningEndpoint] = PrivateAttr(default_factory=list)

    def to_settings(self) -> InferenceSettings:
        """The plain-data settings, safe to send to Spark executors or subprocesses.

        Managed endpoints appear once started (in a run, or after first use of ``client``).
        """
        if not self.endpoints and not self.managed_endpoints and not self.mlflow_models:
            raise dg.DagsterInvalidConfigError(
                "BatchInferenceResource needs at least one endpoint: set endpoints=[Endpoint("
                "name=..., base_url='http://host:8000/v1', models=[...])] or "
                "managed_endpoints=[ManagedEndpoint()] for the embedded default (or "
                "mlflow_models=[MlflowModel(...)] for predict()).",
                [], None,
            )
        endpoints = (tuple(e.to_spec() for e in self.endpoints)
                     + tuple(r.spec for r in self._running))
        return InferenceSettings(
            endpoints=endpoints, prices=self._prices_served(endpoints),
            mlflow_models=tuple(m.to_spec() for m in self.mlflow_models),
            **spec_values(self, InferenceSettings, converted=SETTINGS_BUILT_FROM),
        )

    def as_sent(self, call: CallBase) -> CallBase:
        """``call`` with what this resource fills in where it says nothing (its
        ``default_model``, else the only model served; its ``default_max_tokens``), read from
        the configuration alone (see :meth:`code_version_of`)."""
        return call.as_sent_by(self._configured_settings())

    def code_version_of(self, call: CallBase) -> str:
        """The code version of ``call`` as this resource answers it: what the call sends with
        what the resource fills in (:meth:`as_sent`), and what its endpoints declare of the
        model's served version (``served_model_version``, ``served_model_uri``) or the
        ``model_uri`` of its in-process MLflow model. Read from the configuration alone:
        managed endpoints count with the models they serve once started, no secret (api key,
        store URL) is read, and an ``EnvVar`` unset here counts as its name; so the same
        configuration gives the same version in every process."""
        return call.code_version_with(self._configured_settings())

    def _configured_settings(self) -> InferenceSettings:
        """The settings that decide what a call sends, from the configuration: the endpoints'
        models and declared versions (their addresses and keys are no part of it), the managed
        endpoints' models, ``default_model``, ``default_max_tokens`` and the MLflow models."""
        endpoints = [EndpointSpec(
            name=e.name, base_url="http://configured.invalid/v1",  # not part of what is sent
            models=tuple(map(_configured, e.models)),
            embedding_models=tuple(map(_configured, e.embedding_models)),
            protocol=e.protocol, served_model_uri=_configured(e.served_model_uri),
            served_model_version=_configured(e.served_model_version)) for e in self.endpoints]
        for managed in self.managed_endpoints:
            spec = managed.to_spec()
            models, embedding_models = spec.served_models()
            endpoints.append(EndpointSpec(name=spec.name, base_url="http://127.0.0.1/v1",
                                          models=models, embedding_models=embedding_models))
        return InferenceSettings(
            endpoints=tuple(endpoints), store_url=None,
            default_model=_configured(self.default_model),
            default_max_tokens=self.default_max_tokens,
            mlflow_models=tuple(MlflowModelSpec(name=_configured(m.name),
                                                model_uri=_configured(m.model_uri))
                                for m in self.mlflow_models))

    @field_validator("prices", mode="before")
    @classmethod
    def _prices_in_config_form(cls, value: Any) -> Any:
        return as_price_config(value)  # a Price, or a mapping of them, as the core takes it

    def _prices_served(self, endpoints: tuple[EndpointSpec, ...]) -> dict[str, Price]:
        """The resource-wide prices, less those of models that only managed endpoints not
        started yet will serve (settings read before they start, as a sensor's, have no
        endpoint serving them; a name no endpoint will serve is left for the settings to
        refuse)."""
        prices = spec_prices(self.prices)
        if self._running or not self.managed_endpoints:
            return prices
        later = {m for managed in self.managed_endpoints
                 for models in managed.to_spec().served_models() for m in models}
        now = {m for e in endpoints for m in e.served_models}
        return {m: p for m, p in prices.items() if m in now or m not in later}

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._log = context.log
        self._start_managed()
        self._client = InferenceClient(self.to_settings(), logger=context.log)
        self._client.ledger  # noqa: B018 - open the ledger now, so a bad store_url fails early

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def close(self) -> None:
        """Close the ledger and stop managed endpoints (done for you at the end of a run)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        running, self._running = self._running, []
        for endpoint in running:
            endpoint.stop()

    def _start_managed(self) -> None:
        if self._running or not self.managed_endpoints:
            return
        for managed in self.managed_endpoints:
            self._running.extend(start_managed(managed.to_spec()))

    @property
    def client(self) -> InferenceClient:
        """The core client (created on first use outside a Dagster run)."""
        if self._client is None:
            self._start_managed()
            self._client = InferenceClient(self.to_settings(), logger=self._log)
        return self._client

    def infer(self, df: Any, call: InferenceCall | None = None, /, *, context: Any = None,
              **kwargs: Any) -> InferenceResult:
        """Infer one output per row of ``df``; failures are data in ``<output>_error``.

        Arguments: ``prompt`` (a template over columns, e.g. ``"Summarize: {text}"``) or
        ``prompt_column`` or ``messages_column``; optional ``system``; ``model`` or
        ``model_column``; ``output_column``; generation parameters (``max_tokens``,
        ``temperature``, ``top_p``, ``stop``, ``seed`` ...); ``response_format`` (a JSON schema:
        replies are parsed and validated per row); ``token_budget``; ``partition_key``;
        ``mode="batch_api"`` (an endpoint's offline batch API, at its batch price) with
        ``wait=True`` (poll until answered) or ``wait=False`` (return once submitted).
        These are the fields of
        :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`; pass one as ``call``
        (the asset factory does) and keywords change it. Pass ``context=`` (an asset
        context) to record its run id, partition key and asset key in the ledger and log
        through it.
        """
        return self.client.infer(df, call, **_context_kwargs(context, call, kwargs))

    async def ainfer(self, df: Any, call: InferenceCall | None = None, /, *, context: Any = None,
                     **kwargs: Any) -> InferenceResult:
        return await self.client.ainfer(df, call, **_context_kwargs(context, call, kwargs))

    def estimate(self, df: Any, call: InferenceCall | None = None, /, *, context: Any = None,
                 **kwargs: Any) -> InferenceEstimate:
        """A dry run with the same arguments as :meth:`infer` (or as :meth:`embed` /
        :meth:`predict` with ``task="embed"`` / ``"predict"``, or any job's call): counts,
        tokens and cost; nothing is sent."""
        return self.client.estimate(df, call, **kwargs)

    def plan(self, df: Any, call: Any = None, /, *, context: Any = None, **kwargs: Any) -> Plan:
        """:meth:`estimate`'s forecast, calibrated by the ledger's past usage of the scope and
        model (``context=`` fills them in as for :meth:`infer`): a ``Plan``; nothing is sent."""
        return self.client.plan(df, call, **_context_kwargs(context, call, kwargs))

    def predict(self, df: Any, call: Any = None, /, *, context: Any = None,
                **kwargs: Any) -> Any:
        """One prediction per row of ``df`` from a traditional ML model; failures are data in
        ``<output>_error``. ``model=`` (an ``mlflow_models`` name, a model an ``mlflow``
        endpoint serves, or a URI: ``models:/name@alias``, ``models:/name/3``, ``runs:/...``,
        a path) or ``model_column=``; ``input_columns=[...]`` (named as the model's features);
        ``output_column=``; ``rows_per_request``; ``partition_key``. Returns a
        :class:`~dagster_batchllm.core.tasks.predict.task.PredictionResult` (``.models`` says which
        version each model name resolved to)."""
        return self.client.predict(df, call, **_context_kwargs(context, call, kwargs))

    async def apredict(self, df: Any, call: Any = None, /, *, context: Any = None,
                       **kwargs: Any) -> Any:
        return await self.client.apredict(df, call, **_context_kwargs(context, call, kwargs))

    def embed(self, df: Any, call: EmbedCall | None = None, /, *, context: Any = None,
              **kwargs: Any) -> InferenceResult:
        """One float32 vector (1-D numpy array) per row of ``df`` from a model of an
        Endpoint's ``embedding_models``; failures are data in ``<output>_error``.

        Arguments: ``input`` (a template, e.g. ``"{title}: {body}"``) or ``input_column``;
        ``model``; ``output_column`` (default ``embedding``); ``dimensions``;
        ``inputs_per_request`` (64); ``max_request_tokens``; ``token_budget``. These are the
        fields of :class:`~dagster_batchllm.core.tasks.embed.call.EmbedCall`. ``context=`` as for
        :meth:`infer`. The dry run is ``estimate(df, ..., task="embed")``.
        """
        return self.client.embed(df, call, **_context_kwargs(context, call, kwargs))

    async def aembed(self, df: Any, call: EmbedCall | None = None, /, *, context: Any = None,
                     **kwargs: Any) -> InferenceResult:
        return await self.client.aembed(df, call, **_context_kwargs(context, call, kwargs))

    def aggregate(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        """One answer per group of ``df``'s rows, however many: ``instruction=``, ``column=``
        (the text), ``by=[...]`` (none: the whole table), ``model=``, ``max_tokens=``,
        ``context_tokens=``, ``token_budget=`` / ``budget_usd=`` (all levels together). A group
        larger than the context is reduced level by level, never truncated; every request goes
        through the ledger, so a rerun sends nothing. ``context=`` as for :meth:`infer`.
        Returns an :class:`~dagster_batchllm.semantic.aggregate.AggregateResult`."""
        return self.client.aggregate(df, **_context_kwargs(context, None, kwargs))

    async def aaggregate(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        return await self.client.aaggregate(df, **_context_kwargs(context, None, kwargs))

    def run_call(self, df: Any, call: Any, /, *, context: Any = None,
                 **kwargs: Any) -> InferenceResult:
        """Any job's ``call`` over ``df`` (a call whose task is registered, see
        :mod:`dagster_batchllm.core.tasks.base`); ``context=`` as for :meth:`infer`, and
        ``mode=``, ``wait=``, ``collect_keys=``, ``supersede_stale=`` as for ``infer``."""
        call, merged = _call_in_context(call, context, kwargs)
        return self.client.run_call(df, call, **merged)

    async def arun_call(self, df: Any, call: Any, /, *, context: Any = None,
                        **kwargs: Any) -> InferenceResult:
        call, merged = _call_in_context(call, context, kwargs)
        return await self.client.arun_call(df, call, **merged)

    def filter(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        """The rows of ``df`` that satisfy ``predicate=`` over ``columns=`` (``ai_filter``'s
        requests), with a reason for every NULL answer; ``model=``; ``cascade=Cascade(...)``
        pays ``oracle`` only for the rows ``proxy`` is unsure of. ``context=`` as for
        :meth:`infer`. See :mod:`dagster_batchllm.semantic.filter`."""
        return self.client.filter(df, **_context_kwargs(context, None, kwargs))

    async def afilter(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        return await self.client.afilter(df, **_context_kwargs(context, None, kwargs))

    def classify(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        """Each row's label among ``labels=`` from ``column=`` (``ai_classify``'s requests),
        with a cascade as for :meth:`filter`. See :mod:`dagster_batchllm.semantic.filter`."""
        return self.client.classify(df, **_context_kwargs(context, None, kwargs))

    async def aclassify(self, df: Any, /, *, context: Any = None, **kwargs: Any) -> Any:
        return await self.client.aclassify(df, **_context_kwargs(context, None, kwargs))

    @property
    def ledger(self):
        return self.client.ledger

    def asset_kinds(self) -> set[str]:
        """Dagster kinds that say which servers answer: ``openai`` for OpenAI's API,
        ``vllm`` for a managed vLLM, ``batchllm`` for the embedded default and for
        OpenAI-compatible servers whose software a URL does not reveal (vLLM, TGI, ...)."""
        kinds = set()
        for endpoint in self.endpoints:
            host = urlparse(endpoint.base_url).hostname or ""
            kinds.add("openai" if host == "openai.com" or host.endswith(".openai.com")
                      else "batchllm")
        for managed in self.managed_endpoints:
            kinds.add("vllm" if managed.kind == "vllm" else "batchllm")
        return kinds or {"batchllm"}


def _configured(value: Any) -> Any:
    """A configured value for the code version: an ``EnvVar`` read now, or ``$NAME`` while
    unset (a definition loads without its run's environment; only a run needs the value)."""
    if isinstance(value, dg.EnvVar):
        return value.get_value() or f"${value.env_var_name}"
    return value


def _with_field_defaults(schema: ConfigField, values: dict[str, Any]) -> ConfigField:
    """The resource's config schema with ``values`` (those set in code, in config form) as the
    defaults of their fields, rather than of the whole."""
    shape = schema.config_type
    fields = {
        name: (ConfigField(field.config_type, default_value=values[name], is_required=False,
                           description=field.description) if name in values else field)
        for name, field in shape.fields.items()
    }
    return ConfigField(Shape(fields, description=shape.description,
                             field_aliases=shape.field_aliases),
                       description=schema.description)


def _call_in_context(call: Any, context: Any, kwargs: dict[str, Any]
                     ) -> tuple[Any, dict[str, Any]]:
    """``call`` with the context's partition and scope (they are the call's fields), and the
    rest of the keywords for ``run_call``."""
    merged = _context_kwargs(context, call, kwargs)
    fields = {name: merged.pop(name) for name in ("partition_key", "scope") if name in merged}
    return type(call).of(call, **fields), merged

def _context_kwargs(context: Any, call: InferenceCall | EmbedCall | None,
                    kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keywords with what the context says filled in, where neither the keywords
    nor the call say it already."""
    if context is None:
        return kwargs
    seen = read_context(context)
    merged = dict(kwargs)
    merged.setdefault("run_id", seen.run_id)
    merged.setdefault("logger", seen.logger)
    if "partition_key" not in merged and not (call and call.partition_key) and seen.partition_key:
        merged["partition_key"] = seen.partition_key
    if "scope" not in merged and not (call and call.scope) and seen.scope:
        merged["scope"] = seen.scope
    return merged
