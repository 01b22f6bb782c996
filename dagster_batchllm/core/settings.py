"""Plain-data configuration of the inference core.

These dataclasses are what travels to Spark executors and subprocesses: they hold no clients,
no locks and import nothing heavy (no dagster). The Dagster resource converts its typed config
into them with ``BatchInferenceResource.to_settings()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EndpointSpec:
    """One OpenAI-compatible server (vLLM, TGI, llama.cpp, OpenAI)."""

    name: str
    base_url: str
    models: tuple[str, ...]
    max_concurrency: int = 32
    api_key: str | None = field(default=None, repr=False)
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    rate_limit_window_s: float = 60.0
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("An endpoint needs a non-empty name.")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Endpoint '{self.name}': base_url must start with http:// or https:// "
                f"(got {self.base_url!r}); for vLLM it usually ends with /v1."
            )
        if not self.models:
            raise ValueError(f"Endpoint '{self.name}': list at least one model it serves.")
        if self.max_concurrency < 1:
            raise ValueError(f"Endpoint '{self.name}': max_concurrency must be at least 1.")
        if self.rate_limit_window_s <= 0:
            raise ValueError(f"Endpoint '{self.name}': rate_limit_window_s must be positive.")

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class InferenceSettings:
    """Everything the engine needs to run; safe to pickle."""

    endpoints: tuple[EndpointSpec, ...]
    # Hidden from repr(): a PostgreSQL URL may hold a password.
    store_url: str | None = field(default="sqlite:///batchllm.db", repr=False)
    ledger_table: str = "batchllm_requests"
    max_attempts: int = 6
    request_timeout_s: float = 120.0
    retry_initial_backoff_s: float = 0.5
    retry_max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0
    breaker_failure_threshold: int = 5
    breaker_cooldown_s: float = 10.0
    default_max_tokens: int = 512
    token_budget: int | None = None
    chunk_rows: int = 4096
    ledger_flush_rows: int = 64
    ledger_flush_interval_s: float = 0.25
    progress_interval_s: float = 5.0
    http_client: str = "aiohttp"
    coordinate_runs: bool = True
    coordination_interval_s: float = 0.5
    model_prices: tuple[tuple[str, float, float], ...] = ()
    default_model: str | None = None

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("Configure at least one endpoint.")
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"Endpoint names must be unique, got {names}.")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1.")
        if self.http_client not in ("aiohttp", "openai"):
            raise ValueError("http_client must be 'aiohttp' (lean, default) or 'openai'.")

    @property
    def models(self) -> frozenset[str]:
        return frozenset(m for e in self.endpoints for m in e.models)

    @property
    def model_when_unnamed(self) -> str | None:
        """The model a call that names none uses: ``default_model``, else the only one served."""
        if self.default_model:
            return self.default_model
        models = self.models
        return next(iter(models)) if len(models) == 1 else None

    def price_for(self, model: str) -> tuple[float, float] | None:
        """(USD per 1M prompt tokens, USD per 1M completion tokens) for a model, if configured."""
        for name, prompt_price, completion_price in self.model_prices:
            if name == model:
                return prompt_price, completion_price
        return None

    def replace(self, **changes) -> InferenceSettings:
        return dataclasses.replace(self, **changes)
