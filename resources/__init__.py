"""The example's resources, configured from the environment.

With no environment set, inference runs on the embedded default endpoint (classical NLP models
behind the OpenAI protocol on 127.0.0.1), so the pipeline works on a fresh machine with no GPU
and no network. To use real LLM servers instead:

    export BATCHLLM_ENDPOINTS=http://10.0.0.5:8000/v1,http://10.0.0.6:8000/v1   # vLLM, TGI, ...
    export BATCHLLM_MODEL=meta-llama/Llama-3.1-70B-Instruct
    export BATCHLLM_EMBEDDING_MODEL=bge-large  # optional: served on /v1/embeddings by them,
                                           # for transcript_embeddings (else that asset is left out)
    export BATCHLLM_API_KEY=...            # optional, read at run time, never logged
    export BATCHLLM_MAX_CONCURRENCY=64     # per endpoint
    export BATCHLLM_TOKENS_PER_MINUTE=2000000  # optional, per endpoint
    export BATCHLLM_USD_PER_1M_PROMPT_TOKENS=0.6 BATCHLLM_USD_PER_1M_COMPLETION_TOKENS=0.6
                                           # optional: the model's prices, for the cost figures
    export BATCHLLM_BATCH_API=1            # optional: through the endpoints' offline batch API
                                           # (OpenAI's Files + Batches), about half the price

The embedded models are priced at zero (they run on this machine), so the cost figures are
there from the first run; with real endpoints, set the prices above to see what a run costs.
"""

from __future__ import annotations

import os

import dagster as dg

from dagster_batchllm import BatchInferenceResource, Endpoint, ManagedEndpoint, Price
from dagster_batchllm.managed.classical import EMBEDDING_MODELS, LOCAL_MODELS
from dagster_batchllm.managed.classical.models import ALIAS

from .mlflow_registry import REGISTRY_URI, example_mlflow_models
from .warehouse import DEFAULT_DATA_DIR, WarehouseIOManager, WarehouseResource

EMBEDDED_MODEL = ALIAS
# The embedded models run on this machine: they cost nothing per token.
EMBEDDED_PRICES = {m: Price(input_per_mtok=0.0, output_per_mtok=0.0)
                   for m in (ALIAS, *LOCAL_MODELS, *EMBEDDING_MODELS)}


def build_llm_resource() -> BatchInferenceResource:
    urls = [u.strip() for u in os.environ.get("BATCHLLM_ENDPOINTS", "").split(",") if u.strip()]
    model = os.environ.get("BATCHLLM_MODEL") or (None if urls else EMBEDDED_MODEL)
    store_url = os.environ.get(
        "BATCHLLM_STORE_URL", f"sqlite:///{DEFAULT_DATA_DIR / 'batchllm_ledger.db'}"
    )
    if not urls:
        if batch_api_enabled():
            raise dg.DagsterInvalidConfigError(
                "BATCHLLM_BATCH_API is set but BATCHLLM_ENDPOINTS is not: the embedded default "
                "has no batch API; point BATCHLLM_ENDPOINTS at a provider that has one.", [], None)
        return BatchInferenceResource(
            managed_endpoints=[ManagedEndpoint(name="embedded", max_concurrency=16)],
            default_model=model, store_url=store_url, default_max_tokens=256,
            prices=EMBEDDED_PRICES,
            mlflow_models=example_mlflow_models(), mlflow_registry_uri=REGISTRY_URI,
        )
    if not model:
        raise dg.DagsterInvalidConfigError(
            "BATCHLLM_ENDPOINTS is set but BATCHLLM_MODEL is not: name the model the endpoints "
            "serve (as in their /v1/models).", [], None,
        )
    concurrency = int(os.environ.get("BATCHLLM_MAX_CONCURRENCY", "32"))
    tpm = os.environ.get("BATCHLLM_TOKENS_PER_MINUTE")
    api_key = dg.EnvVar("BATCHLLM_API_KEY") if os.environ.get("BATCHLLM_API_KEY") else None
    embedding = os.environ.get("BATCHLLM_EMBEDDING_MODEL")
    return BatchInferenceResource(
        endpoints=[
            Endpoint(name=f"endpoint-{i}", base_url=url, models=[model],
                     max_concurrency=concurrency, api_key=api_key,
                     tokens_per_minute=int(tpm) if tpm else None,
                     embedding_models=[embedding] if embedding else [],
                     batch_api=batch_api_enabled())
            for i, url in enumerate(urls)
        ],
        default_model=model,
        store_url=store_url,
        prices=_prices_from_environment(model),
        mlflow_models=example_mlflow_models(), mlflow_registry_uri=REGISTRY_URI,
    )


def batch_api_enabled() -> bool:
    """``BATCHLLM_BATCH_API=1``: the inference assets go through the endpoints' batch API (off
    by default: it needs a provider that has one, which the embedded default is not)."""
    return os.environ.get("BATCHLLM_BATCH_API", "").lower() in ("1", "true", "yes")


def serves_embeddings(llm: BatchInferenceResource) -> bool:
    """Whether the configured endpoints serve an embedding model (the embedded default does;
    real ones when BATCHLLM_EMBEDDING_MODEL names one), so the embeddings assets can run."""
    return bool(llm.managed_endpoints) or any(e.embedding_models for e in llm.endpoints)


def _prices_from_environment(model: str) -> dict[str, Price]:
    prompt = os.environ.get("BATCHLLM_USD_PER_1M_PROMPT_TOKENS")
    completion = os.environ.get("BATCHLLM_USD_PER_1M_COMPLETION_TOKENS")
    if prompt is None and completion is None:
        return {}  # the cost figures then say that no price is set, and how to set one
    return {model: Price(input_per_mtok=float(prompt or 0),
                         output_per_mtok=float(completion or 0))}


def describe_llm(llm: BatchInferenceResource) -> str:
    """For an inference asset's description: the model that answers and what the cost figures
    are based on."""
    if llm.managed_endpoints and not llm.endpoints:
        model = (f"Model: the resource's default_model, `{llm.default_model}`: the embedded "
                 f"endpoint's classical models ({', '.join(LOCAL_MODELS)}), not an LLM.")
    else:
        model = f"Model: the resource's default_model, `{llm.default_model}`."
    return f"{model}\n\n{_describe_prices(llm)}"


def _describe_prices(llm: BatchInferenceResource) -> str:
    if not llm.prices:
        return ("No prices are set, so the metadata shows tokens but no cost: set "
                "BATCHLLM_USD_PER_1M_PROMPT_TOKENS and BATCHLLM_USD_PER_1M_COMPLETION_TOKENS.")
    if all(p.input_per_mtok == p.output_per_mtok == 0 for p in llm.prices.values()):
        return ("Cost: the models run on the embedded endpoint on this machine and are priced at "
                "$0 per token, so every cost figure is $0.")
    return "Cost: " + "; ".join(
        f"`{model}` ${p.input_per_mtok:g} per 1M prompt tokens and ${p.output_per_mtok:g} per "
        "1M completion tokens" for model, p in llm.prices.items()) + "."


def build_resources(llm: BatchInferenceResource | None = None) -> dict[str, object]:
    """The location's resources; ``llm``: the one the assets were versioned by (see
    ``assets/pipeline.py``), else one read from the environment now."""
    warehouse = WarehouseResource(
        url=os.environ.get("BATCHLLM_WAREHOUSE_URL",
                           f"sqlite:///{DEFAULT_DATA_DIR / 'warehouse.db'}")
    )
    return {
        "llm": llm or build_llm_resource(),
        "warehouse": warehouse,
        "io_manager": WarehouseIOManager(warehouse=warehouse),
    }


__all__ = ["WarehouseIOManager", "WarehouseResource", "batch_api_enabled", "build_llm_resource",
           "build_resources", "describe_llm", "serves_embeddings"]
