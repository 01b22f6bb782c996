"""Helpers of the batch API tests: inputs, settings whose one endpoint takes batches."""

from __future__ import annotations

import pandas as pd

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.batch_api.book import BatchBook
from dagster_batchllm.core.pricing import Price
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
PROMPT = "Summarize: {text}"
PRICE = Price(input_per_mtok=2.0, output_per_mtok=2.0)  # batch: half


def frame(n: int, prefix: str = "call") -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{prefix} number {i}" for i in range(n)]})


def batch_settings(sim: SimulatedEndpoint, store_url: str, **overrides) -> InferenceSettings:
    endpoint = {"max_requests_per_batch": 50_000, **overrides.pop("endpoint", {})}
    return InferenceSettings(
        endpoints=(EndpointSpec(name="openai", base_url=sim.base_url, models=(MODEL,),
                                api_key=sim.settings.api_key, batch_api=True, **endpoint),),
        store_url=store_url, batch_poll_initial_s=0.02, batch_poll_max_s=0.2,
        ledger_flush_interval_s=0.05, progress_interval_s=60.0, **overrides)


def book_of(client: InferenceClient) -> BatchBook:
    return BatchBook(client.ledger)


def batch_stats(sim: SimulatedEndpoint) -> dict:
    return sim.stats(log=False)["batches"]


def calibrated(make_client, sim: SimulatedEndpoint, **overrides) -> InferenceClient:
    """A client (its endpoint priced PRICE) whose ledger holds 30 rows answered online in
    another scope, as a past partition's: a deadline's online rate is measured, not the
    bound for endpoints never measured."""
    client = make_client(sim, endpoint={"prices": {MODEL: PRICE}}, **overrides)
    warm = client.infer(frame(30, "past"), prompt=PROMPT, model=MODEL, output_column="s",
                        scope="past_partitions")
    assert warm.stats.succeeded == 30
    sim.reset_stats()
    return client
