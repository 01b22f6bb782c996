"""Fixtures for the batch API tests: the simulated batch server, driven by the real openai
client, and clients whose one endpoint takes batches."""

from __future__ import annotations

import pytest
from batch_helpers import MODEL, batch_settings

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.testing import SimulatedEndpoint


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def held():
    """Batches move only when the test says so (``advance_batches`` and friends)."""
    with SimulatedEndpoint(models=(MODEL,), batch_stage_s=None, api_key="sk-batch") as sim:
        yield sim


@pytest.fixture
def quick():
    """Batches run to their end at once."""
    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch") as sim:
        yield sim


@pytest.fixture
def make_client(store_url):
    clients = []

    def build(sim: SimulatedEndpoint, store_url: str = store_url, **overrides
              ) -> InferenceClient:
        client = InferenceClient(batch_settings(sim, store_url, **overrides))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()
