"""The embedded default serves ``local-embedder`` on ``/v1/embeddings``: ``embed()`` over the
example transcripts puts calls of the same kind nearer each other than calls of other kinds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dagster_batchllm import BatchInferenceResource, ManagedEndpoint
from dagster_batchllm.managed.classical import ClassicalResponder
from dagster_batchllm.managed.classical.embedder import DEFAULT_DIMENSIONS, embed
from dagster_batchllm.testing import SimulatedEndpoint, openai_client

# Measured on the example data through the endpoint (printed below): nearest-neighbour topic
# agreement 0.92 (chance 0.34); floors leave room, as in test_local_embedder.py.
MIN_TOPIC_NN = 0.85
MIN_MARGIN = 0.02


@pytest.fixture(scope="module")
def calls(generator):
    return generator.load()


@pytest.fixture(scope="module")
def embedded(calls, tmp_path_factory):
    store = tmp_path_factory.mktemp("ledger") / "ledger.db"
    llm = BatchInferenceResource(managed_endpoints=[ManagedEndpoint()],
                                 store_url=f"sqlite:///{store}")
    try:
        yield llm, llm.embed(calls, input_column="transcript_raw_text")
    finally:
        llm.close()


def test_the_embedded_default_lists_its_embedder(embedded):
    llm, _ = embedded
    assert llm.to_settings().embedding_models == frozenset({"local-embedder"})
    assert "local-embedder" not in llm.to_settings().models  # not a chat model


def test_same_kind_calls_are_nearer_each_other(embedded, calls):
    _, result = embedded
    ok = result.df["embedding_error"].isna().to_numpy()
    # The dataset's null and blank transcripts fail as rows, before anything is sent.
    assert set(result.error_types[~ok]) == {"invalid_input"} and (~ok).sum() == 14
    vectors = np.stack(result.df["embedding"][ok].to_list())
    assert vectors.shape == (ok.sum(), DEFAULT_DIMENSIONS) and vectors.dtype == np.float32
    # The endpoint's vectors are the embedder's own, through base64 and the ledger unchanged.
    texts = calls.transcript_raw_text[ok].tolist()
    np.testing.assert_array_equal(vectors[:20], embed(texts[:20]))

    kinds = calls.expected_action_required.to_numpy()[ok]
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    agreement = float((kinds[sims.argmax(axis=1)] == kinds).mean())
    np.fill_diagonal(sims, np.nan)
    margins = {}
    for kind in sorted(set(kinds)):
        member = kinds == kind
        intra = np.nanmean(sims[np.ix_(member, member)])
        inter = np.nanmean(sims[np.ix_(member, ~member)])
        margins[kind] = (round(float(intra), 3), round(float(inter), 3))
    print(f"\nnearest-neighbour kind agreement {agreement:.3f}; intra vs inter: {margins}")
    assert agreement >= MIN_TOPIC_NN
    assert set(margins) == {"Refund Request", "Complaint", "General Inquiry"}
    for kind, (intra, inter) in margins.items():
        assert intra > inter + MIN_MARGIN, kind


def test_a_rerun_is_served_from_the_ledger(embedded, calls):
    llm, first = embedded
    again = llm.embed(calls, input_column="transcript_raw_text")
    assert again.stats.requests == 0 and again.stats.cached == first.stats.succeeded


def test_a_simulated_endpoint_with_an_embedding_responder_serves_it():
    with SimulatedEndpoint(models=None, responder=ClassicalResponder()) as sim:
        assert sim.embedding_models == ["local-embedder"]
        client = openai_client(sim)
        reply = client.embeddings.create(model="local-embedder",
                                         input=["refund my order", "store hours"], dimensions=64)
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
        np.testing.assert_array_equal(got, embed(["refund my order", "store hours"], 64))
        assert reply.usage.prompt_tokens > 0
        sim.script("bad_structured")  # the server's faults still apply to the responder's
        short = client.embeddings.create(model="local-embedder", input=["x y"])
        assert len(short.data[0].embedding) == DEFAULT_DIMENSIONS // 2
        with pytest.raises(Exception, match="does not support embeddings"):
            client.embeddings.create(model="local-summarizer", input=["x"])


def test_the_embedders_refusal_is_a_400(tmp_path):
    llm = BatchInferenceResource(managed_endpoints=[ManagedEndpoint()], store_url=None)
    try:
        frame = pd.DataFrame({"text": ["a refund please"]})
        result = llm.embed(frame, input_column="text", dimensions=100_000)
    finally:
        llm.close()
    assert result.error_types.tolist() == ["bad_request"]
    assert "dimensions must be an integer from 1 to 384" in result.df["embedding_error"][0]
