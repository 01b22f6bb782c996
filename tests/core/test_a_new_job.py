"""A fifth job is one call class and one task class: nothing else changes for it to run online,
through a provider's batch API and as a dry run (the asset is tested in tests/dagster).

The job (tests/reverse_job.py) reverses each row's text: the task sends the text as a chat
message to a model that reverses what it reads (a responder of the simulated endpoint).
The same file shows embeddings going through the batch API, one input per line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint
from tests.reverse_job import MODEL, ReverseCall, Reverser, TextCall


@pytest.fixture
def sim():
    with SimulatedEndpoint(responder=Reverser(), models=(MODEL,), api_key="sk-rev") as endpoint:
        yield endpoint


def _client(sim: SimulatedEndpoint, tmp_path, **endpoint) -> InferenceClient:
    return InferenceClient(InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=(MODEL,),
                                api_key=sim.settings.api_key, **endpoint),),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_poll_initial_s=0.02,
        batch_poll_max_s=0.2, ledger_flush_interval_s=0.05))


FRAME = pd.DataFrame({"text": ["abc", "hello world", None, "abc"]})


def test_a_new_job_runs_online_with_the_ledger_dedup_and_row_errors(sim, tmp_path):
    with _client(sim, tmp_path) as client:
        result = client.run_call(FRAME, ReverseCall())
        assert result.df["reversed"].tolist() == ["cba", "dlrow olleh", None, "cba"]
        assert result.error_types.tolist() == [None, None, "invalid_input", None]
        assert result.stats.requests == 2 and result.stats.deduplicated == 1
        again = client.run_call(FRAME, ReverseCall())  # answered by the ledger
        assert again.stats.requests == 0 and again.stats.cached == 3
        assert again.df["reversed"].tolist() == result.df["reversed"].tolist()


def test_a_new_job_has_its_dry_run(sim, tmp_path):
    with _client(sim, tmp_path) as client:
        plan = client.estimate(FRAME, ReverseCall())
        assert (plan.rows, plan.requests_to_send, plan.invalid_rows,
                plan.rows_deduplicated) == (4, 2, 1, 1)
        assert plan.max_completion_tokens == 128
        client.run_call(FRAME, ReverseCall())
        assert client.estimate(FRAME, ReverseCall()).requests_to_send == 0
    assert sim.stats(log=False)["requests"] == 2  # the dry runs sent nothing


def test_a_new_job_runs_through_the_batch_api(sim, tmp_path):
    with _client(sim, tmp_path, batch_api=True) as client:
        result = client.run_call(FRAME, ReverseCall(), mode="batch_api")
        assert result.df["reversed"].tolist() == ["cba", "dlrow olleh", None, "cba"]
        assert result.stats.mode == "batch_api"
        batches = sim.stats(log=False)["batches"]
        assert batches["batches_created"] == 1 and sim.stats(log=False)["requests"] == 0
        assert client.run_call(FRAME, ReverseCall(), mode="batch_api").stats.cached == 3


@dataclass(frozen=True)
class Unregistered(TextCall):
    """A job's call whose task nobody registered (ReverseCall's task is not its base's)."""


def test_a_call_of_no_registered_job_says_how_to_register_one(sim, tmp_path):
    with _client(sim, tmp_path) as client, pytest.raises(
            InferenceConfigError, match=r"@register_task\(Unregistered\)"):
        client.run_call(FRAME, Unregistered())
    assert sim.stats(log=False)["requests"] == 0


def test_embeddings_go_through_the_batch_api_one_input_per_line(tmp_path):
    with SimulatedEndpoint(embedding_models=("bge",), embedding_dimensions=8,
                           api_key="sk-emb") as sim:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, embedding_models=("bge",),
                                    api_key=sim.settings.api_key, batch_api=True),),
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_poll_initial_s=0.02,
            batch_poll_max_s=0.2, ledger_flush_interval_s=0.05)
        frame = pd.DataFrame({"text": ["refund", "store hours", "refund", ""]})
        with InferenceClient(settings) as client:
            online_dir = tmp_path / "online"
            online_dir.mkdir()
            batch = client.embed(frame, input_column="text", mode="batch_api")
            with InferenceClient(settings.replace(
                    store_url=f"sqlite:///{online_dir / 'ledger.db'}")) as online_client:
                online = online_client.embed(frame, input_column="text")
            assert batch.stats.mode == "batch_api"
            assert sim.stats(log=False)["batches"]["batches_created"] == 1
            for got, want in zip(batch.df["embedding"], online.df["embedding"], strict=True):
                assert (got is None) == (want is None)
                if got is not None:
                    assert got.dtype == np.float32 and np.allclose(got, want)
            assert batch.error_types.tolist() == online.error_types.tolist()
            again = client.embed(frame, input_column="text", mode="batch_api")
            assert again.stats.cached == batch.stats.succeeded
            assert sim.stats(log=False)["batches"]["batches_created"] == 1
