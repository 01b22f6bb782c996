"""The example's resources, configured from the environment.

With no environment set, inference runs on the embedded default endpoint (classical NLP models
behind the OpenAI protocol on 127.0.0.1), so the pipeline works on a fresh machine with no GPU
and no network. To use real LLM servers instead:

    export BATCHLLM_ENDPOINTS=http://10.0.0.5:8000/v1,http://10.0.0.6:8000/v1   # vLLM, TGI, ...
    export BATCHLLM_MODEL=meta-llama/Llama-3.1-70B-Instruct
    export BATCHLLM_API_KEY=...            # optional, read at run time, never logged
    export BATCHLLM_MAX_CONCURRENCY=64     # per endpoint
    export BATCHLLM_TOKENS_PER_MINUTE=2000000  # optional, per endpoint
"""

from __future__ import annotations

import os

import dagster as dg

from dagster_batchllm import BatchInferenceResource, Endpoint, ManagedEndpoint

from .warehouse import DEFAULT_DATA_DIR, WarehouseIOManager, WarehouseResource

EMBEDDED_MODEL = "local"


def build_llm_resource() -> BatchInferenceResource:
    urls = [u.strip() for u in os.environ.get("BATCHLLM_ENDPOINTS", "").split(",") if u.strip()]
    model = os.environ.get("BATCHLLM_MODEL") or (None if urls else EMBEDDED_MODEL)
    store_url = os.environ.get(
        "BATCHLLM_STORE_URL", f"sqlite:///{DEFAULT_DATA_DIR / 'batchllm_ledger.db'}"
    )
    if not urls:
        return BatchInferenceResource(
            managed_endpoints=[ManagedEndpoint(name="embedded", max_concurrency=16)],
            default_model=model, store_url=store_url, default_max_tokens=256,
        )
    if not model:
        raise dg.DagsterInvalidConfigError(
            "BATCHLLM_ENDPOINTS is set but BATCHLLM_MODEL is not: name the model the endpoints "
            "serve (as in their /v1/models).", [], None,
        )
    concurrency = int(os.environ.get("BATCHLLM_MAX_CONCURRENCY", "32"))
    tpm = os.environ.get("BATCHLLM_TOKENS_PER_MINUTE")
    api_key = dg.EnvVar("BATCHLLM_API_KEY") if os.environ.get("BATCHLLM_API_KEY") else None
    return BatchInferenceResource(
        endpoints=[
            Endpoint(name=f"endpoint-{i}", base_url=url, models=[model],
                     max_concurrency=concurrency, api_key=api_key,
                     tokens_per_minute=int(tpm) if tpm else None)
            for i, url in enumerate(urls)
        ],
        default_model=model,
        store_url=store_url,
    )


def build_resources() -> dict[str, object]:
    warehouse = WarehouseResource(
        url=os.environ.get("BATCHLLM_WAREHOUSE_URL",
                           f"sqlite:///{DEFAULT_DATA_DIR / 'warehouse.db'}")
    )
    return {
        "llm": build_llm_resource(),
        "warehouse": warehouse,
        "io_manager": WarehouseIOManager(warehouse=warehouse),
    }


__all__ = ["WarehouseIOManager", "WarehouseResource", "build_llm_resource", "build_resources"]
