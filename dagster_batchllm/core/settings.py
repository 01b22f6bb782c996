"""Plain-data configuration of the inference core.

These dataclasses are what travels to Spark executors and subprocesses: they hold no clients,
no locks and import nothing heavy (no dagster). They are also the one home of each setting's
default and description: the Dagster resource (``BatchInferenceResource``, ``Endpoint``)
declares its config fields from them and converts back with ``to_settings()`` / ``to_spec()``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

from .descriptions import described
from .pricing import EVERY_MODEL, Price, price_on, price_pairs

# Where answers are kept unless configured otherwise: a SQLite file in the working directory.
DEFAULT_STORE_URL = "sqlite:///batchllm.db"
DEFAULT_LEDGER_TABLE = "batchllm_requests"


ENDPOINT_PROTOCOLS = ("openai", "mlflow")
BATCH_PROTOCOLS = ("openai", "anthropic")


@dataclass(frozen=True)
class MlflowModelSpec:
    """A traditional ML model scored in this process by MLflow's pyfunc flavour (predict())."""

    name: str = described("The name calls use for it (predict(model=...), a model column).")
    model_uri: str = described(
        "Where MLflow finds it: models:/name@alias, models:/name/3, runs:/<run id>/model or a "
        "local path. An alias is resolved when a call starts, so a moved alias scores under "
        "the new version (and the ledger keeps each version's answers apart).")
    registry_uri: str | None = described(
        "The MLflow registry (and tracking) URI for models:/ and runs:/ URIs, e.g. "
        "sqlite:///data/mlflow.db; None: the settings' mlflow_registry_uri, else MLflow's own "
        "(MLFLOW_TRACKING_URI).", None)
    rows_per_batch: int = described(
        "Most rows handed to one predict() call.", 1024)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("An MLflow model needs a non-empty name.")
        if not self.model_uri:
            raise ValueError(f"MLflow model '{self.name}': model_uri is empty.")
        if self.rows_per_batch < 1:
            raise ValueError(f"MLflow model '{self.name}': rows_per_batch must be at least 1.")


@dataclass(frozen=True)
class EndpointSpec:
    """One OpenAI-compatible server (vLLM, TGI, llama.cpp, OpenAI)."""

    name: str = described("A unique name, used in logs, metadata and the ledger.")
    base_url: str = described(
        "The OpenAI-compatible base URL, usually ending in /v1, e.g. http://10.0.0.5:8000/v1.")
    models: tuple[str, ...] = described(
        "The model names this endpoint serves on /chat/completions.", ())
    max_concurrency: int = described("Most requests in flight to this endpoint at once.", 32)
    api_key: str | None = described(
        "Bearer token; pass dg.EnvVar('NAME'). Never logged or shown.", None, repr=False)
    tokens_per_minute: int | None = described(
        "Prompt + completion tokens per minute this endpoint allows.", None)
    requests_per_minute: int | None = described(
        "Requests per minute this endpoint allows.", None)
    rate_limit_window_s: float = described(
        "The sliding window over which the per-minute limits are enforced (scaled to it); "
        "shorter windows spread requests more evenly.", 60.0)
    max_context_tokens: int | None = described(
        "The model's context length; longer prompts fail as rows before sending.", None)
    embedding_models: tuple[str, ...] = described(
        "The model names this endpoint serves on /embeddings (for embed()), e.g. bge-large.",
        ())
    batch_api: bool = described(
        "The endpoint also takes offline batches (OpenAI's Files and Batches API: about half "
        "the price, answered within 24 h): calls with mode='batch_api' go here.", False)
    max_requests_per_batch: int = described(
        "Most request lines in one batch file (OpenAI: 50,000).", 50_000)
    max_bytes_per_batch: int = described(
        "Largest batch file in bytes (OpenAI: 200 MB).", 200_000_000)
    batch_protocol: str = described(
        "The batch API the endpoint speaks with batch_api=True: 'openai' (Files + Batches: "
        "OpenAI, Azure OpenAI, Together, Groq, Mistral) or 'anthropic' (Message Batches; "
        "base_url https://api.anthropic.com/v1, whose OpenAI-compatible chat route answers "
        "online calls).", "openai")
    protocol: str = described(
        "What the server speaks: 'openai' (chat completions below base_url) or 'mlflow' "
        "(MLflow's scoring protocol, POST <base_url>/invocations, as `mlflow models serve` and "
        "Databricks custom model serving answer it; used by predict()).", "openai")
    served_model_uri: str | None = described(
        "protocol='mlflow': the MLflow model the server was started with, as "
        "`mlflow models serve -m` names it (models:/risk@champion, models:/risk/3, runs:/...). "
        "Resolved through the registry (mlflow_registry_uri) once when a call starts; the "
        "version enters the request keys and the metadata, so a redeploy of a new version "
        "under the same name scores afresh and the same version is answered from the ledger. "
        "None (and no served_model_version): the keys cover the served model's name only.",
        None)
    tokenize_route: bool = described(
        "The server counts a request's prompt tokens at POST /tokenize beside /v1, as vLLM "
        "does (a managed vLLM sets this): plan() then asks it for the exact prompt tokens of "
        "up to 256 requests per model instead of estimating them.", False)
    prices: tuple[tuple[str, Price], ...] = described(
        "What this endpoint charges: a Price per model it serves ({'gpt-4o': Price(...)}), or "
        "one Price for every model (in config, under the model name '*'); a model without one "
        "here takes the resource-wide prices. The same model may cost differently at "
        "different providers: answers are priced at the endpoint that gave them.", ())
    served_model_version: str | None = described(
        "protocol='mlflow': the version the server serves, declared instead of looked up "
        "(e.g. '3', a Databricks served entity's version, or your deploy's tag); it enters the "
        "request keys and metadata as served_model_uri's version does.", None)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("An endpoint needs a non-empty name.")
        # Given as one Price or a mapping; kept as sorted pairs (frozen, hashable data).
        object.__setattr__(self, "prices", price_pairs(self.prices,
                                                       where=f"Endpoint '{self.name}'"))
        unserved = [m for m, _ in self.prices if m != EVERY_MODEL and m not in self.served_models]
        if unserved:
            raise ValueError(f"Endpoint '{self.name}': prices name {unserved}, which it does "
                             f"not serve (it serves {list(self.served_models)}).")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Endpoint '{self.name}': base_url must start with http:// or https:// "
                f"(got {self.base_url!r}); for vLLM it usually ends with /v1."
            )
        if not self.models and not self.embedding_models:
            raise ValueError(f"Endpoint '{self.name}': list at least one model it serves "
                             "(models=[...], or embedding_models=[...] for embeddings).")
        if self.max_concurrency < 1:
            raise ValueError(f"Endpoint '{self.name}': max_concurrency must be at least 1.")
        if self.rate_limit_window_s <= 0:
            raise ValueError(f"Endpoint '{self.name}': rate_limit_window_s must be positive.")
        if self.max_requests_per_batch < 1 or self.max_bytes_per_batch < 1024:
            raise ValueError(f"Endpoint '{self.name}': max_requests_per_batch must be at least "
                             "1 and max_bytes_per_batch at least 1024.")
        if self.batch_protocol not in BATCH_PROTOCOLS:
            raise ValueError(f"Endpoint '{self.name}': batch_protocol must be one of "
                             f"{list(BATCH_PROTOCOLS)}, got {self.batch_protocol!r}.")
        if self.protocol not in ENDPOINT_PROTOCOLS:
            raise ValueError(f"Endpoint '{self.name}': protocol must be one of "
                             f"{list(ENDPOINT_PROTOCOLS)}, got {self.protocol!r}.")
        declared = self.served_model_uri is not None or self.served_model_version is not None
        if declared and self.protocol != "mlflow":
            raise ValueError(f"Endpoint '{self.name}': served_model_uri and "
                             "served_model_version describe an MLflow scoring server; set "
                             "protocol='mlflow' or leave them out.")
        if self.served_model_uri is not None and self.served_model_version is not None:
            raise ValueError(f"Endpoint '{self.name}': give served_model_uri (looked up in the "
                             "registry) or served_model_version (declared), not both.")
        if self.served_model_uri == "" or self.served_model_version == "":
            raise ValueError(f"Endpoint '{self.name}': served_model_uri / "
                             "served_model_version is empty; leave it out (None) instead.")

    @property
    def served_models(self) -> tuple[str, ...]:
        """Every model it serves, chat and embedding: what the pool routes by."""
        return tuple(dict.fromkeys(self.models + self.embedding_models))

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class InferenceSettings:
    """Everything the engine needs to run; safe to pickle."""

    endpoints: tuple[EndpointSpec, ...] = described(
        "The servers to spread requests over (with the managed endpoints, once started).")
    store_url: str | None = described(
        "SQLAlchemy URL of the results ledger (SQLite file or PostgreSQL); "
        "None keeps an in-memory ledger that lasts one process.",
        DEFAULT_STORE_URL,
        repr=False,  # a PostgreSQL URL may hold a password
    )
    ledger_table: str = described("The ledger table name.", DEFAULT_LEDGER_TABLE)
    max_attempts: int = described("Attempts per request, the first included.", 6)
    request_timeout_s: float = described("Timeout of one HTTP request.", 120.0)
    retry_initial_backoff_s: float = described(
        "First backoff between attempts (grows exponentially, jittered).", 0.5)
    retry_max_backoff_s: float = described("Longest backoff.", 30.0)
    max_retry_after_s: float = described(
        "Cap on how long a server's Retry-After is honoured.", 120.0)
    breaker_failure_threshold: int = described(
        "Consecutive failures after which an endpoint is cooled down.", 5)
    breaker_cooldown_s: float = described(
        "How long a failing endpoint rests before a probe request.", 10.0)
    default_max_tokens: int = described(
        "max_tokens sent when a call gives none (replies stay bounded).", 512)
    token_budget: int | None = described(
        "Default token budget per call; rows beyond it are deferred.", None)
    chunk_rows: int = described("Rows rendered and looked up at a time.", 4096)
    ledger_flush_rows: int = described("Ledger write batch size.", 64)
    ledger_flush_interval_s: float = described(
        "Longest a finished request waits before it is written.", 0.25)
    progress_interval_s: float = described("Seconds between progress lines.", 5.0)
    http_client: str = described(
        "'aiohttp' (lean, ~10x less CPU per request) or 'openai' (official client).", "aiohttp")
    coordinate_runs: bool = described(
        "Split each endpoint's limits among the runs using it at once, through the ledger "
        "database (so a backfill of many runs does not multiply the load).", True)
    prefix_affinity: bool = described(
        "Send chat rows whose prompts share a long head (a system message, instructions, "
        "few-shot examples: their first 1,024 bytes) to the endpoint that served that head "
        "last, while it has room and is healthy, so its prefix cache (vLLM's) holds it; "
        "False: every request to the least-loaded endpoint.", True)
    coordination_interval_s: float = described(
        "Seconds between a run's heartbeats in the ledger database, by which runs that share "
        "endpoints (coordinate_runs) see each other and split the limits.", 0.5)
    prices: tuple[tuple[str, Price], ...] = described(
        "Resource-wide prices, for the endpoints whose own prices (Endpoint.prices) name the "
        "model not: a Price per model ({'llama-70b': Price(input_per_mtok=0.6, "
        "output_per_mtok=0.6)}), or one Price for every model (in config, under the model "
        "name '*'). Each model named must be one an endpoint serves.", ())
    default_model: str | None = described("The model used when a call names none.", None)
    batch_poll_initial_s: float = described(
        "First wait between polls of a batch's status (mode='batch_api', wait=True); it "
        "grows by half each poll.", 1.0)
    batch_poll_max_s: float = described("Longest wait between polls of a batch.", 60.0)
    mlflow_models: tuple[MlflowModelSpec, ...] = described(
        "Traditional ML models scored in process by predict() (MLflow pyfunc).", ())
    mlflow_registry_uri: str | None = described(
        "The MLflow registry (and tracking) URI for models:/ and runs:/ URIs that a model "
        "names no registry for (model column cells too); None: MLflow's own "
        "(MLFLOW_TRACKING_URI).", None)
    endpoint_unreachable_after_s: float = described(
        "Seconds every endpoint of a model may refuse connections (or fail DNS or TLS) before "
        "the rows still to send fail with endpoint_unreachable; a slow endpoint is waited for.",
        15.0)
    endpoint_failing_after_s: float = described(
        "Seconds every endpoint of a model may answer nothing usable (5xx, a 200 whose body is "
        "not a reply, a connection closed mid-body, timeouts) while rows wait before the rows "
        "still to send fail with endpoint_failing, naming the last failure (a later run sends "
        "them); a server's Retry-After longer than this defers the row instead of waiting.",
        60.0)
    ledger_outage_s: float = described(
        "Seconds ledger writes may keep failing because the database is away (restarted, a "
        "network cut) while the run pauses and retries them; past it the run fails, and the "
        "answers kept in its journal are written by the next run.", 120.0)
    ledger_statement_timeout_s: float = described(
        "Seconds a ledger database server may leave a statement unanswered before the "
        "connection is closed and the statement retried (a connection can stay open with "
        "nothing behind it; SQLite files have no such wait).", 30.0)
    files_roots: tuple[str, ...] = described(
        "The folders a path cell (images=, SQL files =>, ai_parse_document) may name a file "
        "under; a path outside them (after resolving '..' and symlinks), a directory, a FIFO "
        "or a device is that row's invalid_input error, never opened. Empty: the working "
        "directory when the call starts.", ())
    allow_image_urls: bool = described(
        "Pass http(s) image URLs in image cells on to the model server (which fetches them); "
        "False: such a cell is that row's invalid_input error.", True)
    max_reply_bytes: int | None = described(
        "Largest reply body read from an endpoint, in bytes; a longer one is refused while it "
        "is read (the connection closed) and its row fails with response_too_large. None: "
        "each request's own bound, from what it asks for: a chat request 64 bytes a token of "
        "max_tokens (more with logprobs) plus 64 KiB, at most 4 MiB; embeddings 24 bytes a "
        "dimension (8,192 where the call names none) an input; other routes 64 KiB a row.",
        None)

    def __post_init__(self) -> None:
        if not self.endpoints and not self.mlflow_models:
            raise ValueError("Configure at least one endpoint (or an MLflow model).")
        mlflow_names = [m.name for m in self.mlflow_models]
        if len(set(mlflow_names)) != len(mlflow_names):
            raise ValueError(f"MLflow model names must be unique, got {mlflow_names}.")
        both = set(mlflow_names) & {m for e in self.endpoints for m in e.models}
        if both:
            raise ValueError(f"{sorted(both)}: named both as an MLflow model scored in process "
                             "and as a model an endpoint serves; give one of them another name.")
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"Endpoint names must be unique, got {names}.")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1.")
        for bound in ("endpoint_unreachable_after_s", "endpoint_failing_after_s",
                      "ledger_outage_s", "ledger_statement_timeout_s"):
            if not getattr(self, bound) > 0:
                raise ValueError(f"{bound} must be a positive number of seconds.")
        if self.max_reply_bytes is not None and self.max_reply_bytes < 1024:
            raise ValueError("max_reply_bytes must be at least 1024 (or None: each request's "
                             "own bound).")
        if self.http_client not in ("aiohttp", "openai"):
            raise ValueError("http_client must be 'aiohttp' (lean, default) or 'openai'.")
        if isinstance(self.files_roots, str | bytes):
            raise ValueError("files_roots is a list of folders, e.g. files_roots=['/data/scans'].")
        # Folders given as paths or a list are kept as a tuple of text (settings are frozen).
        object.__setattr__(self, "files_roots", tuple(os.fsdecode(os.fspath(root))
                                                      for root in self.files_roots))
        object.__setattr__(self, "prices", price_pairs(self.prices, where="Resource-wide"))
        served = {m for e in self.endpoints for m in e.served_models}
        unserved = [m for m, _ in self.prices if m != EVERY_MODEL and m not in served]
        if unserved:
            raise ValueError(
                f"Resource-wide prices name {unserved}, which no endpoint serves (served: "
                f"{sorted(served)}); name the model as its endpoint lists it, or drop the "
                "price.")

    @property
    def models(self) -> frozenset[str]:
        """The chat models (served over the OpenAI protocol)."""
        return frozenset(m for e in self.endpoints if e.protocol == "openai" for m in e.models)

    @property
    def scoring_models(self) -> frozenset[str]:
        """The models predict() can use: in-process MLflow models and MLflow-served ones."""
        return frozenset([m.name for m in self.mlflow_models]
                         + [m for e in self.endpoints if e.protocol == "mlflow" for m in e.models])

    @property
    def embedding_models(self) -> frozenset[str]:
        return frozenset(m for e in self.endpoints for m in e.embedding_models)

    @property
    def model_when_unnamed(self) -> str | None:
        """The model a call that names none uses: ``default_model``, else the only one served."""
        if self.default_model:
            return self.default_model
        models = self.models
        return next(iter(models)) if len(models) == 1 else None

    @property
    def embedding_model_when_unnamed(self) -> str | None:
        """The model an embedding call that names none uses: the only embedding model served."""
        models = self.embedding_models
        return next(iter(models)) if len(models) == 1 else None

    def pinned_versions(self, model: str) -> tuple[str, ...]:
        """What the configuration pins of which version of ``model`` answers, sorted: the
        ``served_model_version`` or ``served_model_uri`` of the mlflow endpoints serving it (as
        the request keys have it, see ``core.tasks.predict.models``) and the ``model_uri`` of
        the in-process MLflow model of that name. Empty for a model served over the OpenAI
        protocol: which weights its server loaded is the server's own business."""
        pins = {f"served_model_version={e.served_model_version}" if e.served_model_version
                else f"served_model_uri={e.served_model_uri}"
                for e in self.endpoints if e.protocol == "mlflow" and model in e.models
                and (e.served_model_version or e.served_model_uri)}
        pins.update(f"model_uri={m.model_uri}" for m in self.mlflow_models if m.name == model)
        return tuple(sorted(pins))

    @functools.cached_property
    def _resource_prices(self) -> dict[str, Price]:
        return dict(self.prices)

    @functools.cached_property
    def _endpoints_by_name(self) -> dict[str, EndpointSpec]:
        return {e.name: e for e in self.endpoints}

    def price_at(self, model: str, endpoint: str | None = None) -> Price | None:
        """The price of ``model`` at ``endpoint`` (see :func:`.pricing.price_on`); with no
        endpoint (or one not configured, such as "ledger"), the dearest price among the
        endpoints serving it, so an estimate or a budget's bound is never too low."""
        spec = self._endpoints_by_name.get(endpoint) if endpoint is not None else None
        if spec is not None:
            return price_on(spec.prices, self._resource_prices, model)
        # Asked per request where a budget reserves each one's bound: looked up once a model.
        dearest = self._dearest_prices
        if model not in dearest:
            found = [price_on(e.prices, self._resource_prices, model)
                     for e in self.endpoints if model in e.served_models]
            found = [p for p in found if p is not None] or [
                p for p in [price_on((), self._resource_prices, model)] if p is not None]
            dearest[model] = max(found, key=lambda p: p.upper_bound(1, 1), default=None)
        return dearest[model]

    @functools.cached_property
    def _dearest_prices(self) -> dict[str, Price | None]:
        return {}

    def price_for(self, model: str) -> tuple[float, float] | None:
        """(USD per 1M prompt tokens, USD per 1M completion tokens) for a model, if priced
        (:meth:`price_at` without an endpoint)."""
        price = self.price_at(model)
        return (price.input_per_mtok, price.output_per_mtok) if price is not None else None

    def batch_price_for(self, model: str) -> tuple[float, float] | None:
        """The batch API's (prompt, completion) USD per 1M tokens for a model."""
        endpoint = self.batch_endpoint_for(model)
        price = self.price_at(model, endpoint.name if endpoint is not None else None)
        if price is None:
            return None
        prompt, _cached, completion = price.per_mtok(batch=True)
        return prompt, completion

    def batch_endpoint_for(self, model: str) -> EndpointSpec | None:
        """The first endpoint with ``batch_api=True`` that serves ``model``."""
        return next((e for e in self.endpoints if e.batch_api and model in e.served_models), None)

    def replace(self, **changes) -> InferenceSettings:
        return dataclasses.replace(self, **changes)
