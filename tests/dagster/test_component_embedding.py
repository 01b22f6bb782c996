"""``BatchEmbeddingComponent``: an embeddings asset declared in ``defs.yaml`` is the one
``build_embedding_asset`` builds (the call's and the factory's attributes from their one home),
and it materializes vectors; with ``mode: batch_api`` they go through the batch API."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from dagster_batchllm import BatchEmbeddingComponent
from dagster_batchllm.testing import SimulatedEndpoint
from tests.dagster.defs_yaml import loaded_defs_yaml

pytestmark = pytest.mark.timeout(60)
EMBED = "sim-embed"
ATTRIBUTES = {
    "name": "note_vectors",
    "source": "notes",
    "input": "{title}: {body}",
    "model": EMBED,
    "dimensions": 8,
    "inputs_per_request": 2,
    "key_columns": ["note_id"],
    "partitions_def": {"type": "static", "partition_keys": ["a", "b"]},
    "asset_attributes": {"group_name": "search"},
}


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["a", "b"]))
def notes(context) -> pd.DataFrame:
    part = context.partition_key
    return pd.DataFrame({"note_id": [f"{part}{i}" for i in range(3)],
                         "title": ["refund", "hours", None],
                         "body": ["money back", "open at 9", "no title"]})


@pytest.fixture
def embed_sim():
    with SimulatedEndpoint(embedding_models=(EMBED,), embedding_dimensions=8,
                           api_key="sk-emb") as sim:
        yield sim


def _resource(sim: SimulatedEndpoint, tmp_path, **endpoint) -> dict:
    return {"endpoints": [{"name": "e", "base_url": sim.base_url, "embedding_models": [EMBED],
                           "api_key": sim.settings.api_key, **endpoint}],
            "store_url": f"sqlite:///{tmp_path / 'ledger.db'}", "batch_poll_initial_s": 0.02}


def test_the_embedding_component_loads_from_defs_yaml_and_materializes(embed_sim, tmp_path):
    attributes = {**ATTRIBUTES, "resource": _resource(embed_sim, tmp_path)}
    with loaded_defs_yaml("dagster_batchllm.BatchEmbeddingComponent", attributes,
                          "note_vectors") as (component, defs):
        assert isinstance(component, BatchEmbeddingComponent)
        assert component.model_name == EMBED and component.inputs_per_request == 2
        asset = defs.get_assets_def("note_vectors")
        llm = defs.resources["llm"]
    spec = next(iter(asset.specs))
    assert spec.group_name == "search" and spec.metadata["batchllm/task"] == "embed"
    assert "Embeddings with model `sim-embed`, 8 dimensions" in spec.description
    result = dg.materialize([notes, asset], partition_key="a", resources={"llm": llm})
    assert result.success
    table = result.output_for_node("note_vectors")
    ok = table["embedding"].notna()
    assert ok.tolist() == [True, True, False]  # the untitled note fails alone, with its reason
    assert all(v.dtype == np.float32 and v.shape == (8,) for v in table.loc[ok, "embedding"])
    assert table.loc[~ok, "embedding_error"].str.startswith("invalid_input").all()
    assert embed_sim.stats(log=False)["embeddings"]["requests"] == 1  # 2 inputs per request


def test_the_embedding_component_takes_the_batch_api(embed_sim, tmp_path):
    attributes = {**ATTRIBUTES, "mode": "batch_api",
                  "resource": _resource(embed_sim, tmp_path, batch_api=True)}
    with loaded_defs_yaml("dagster_batchllm.BatchEmbeddingComponent", attributes,
                          "note_vectors") as (_component, defs):
        asset = defs.get_assets_def("note_vectors")
        llm = defs.resources["llm"]
    assert next(iter(asset.specs)).metadata["batchllm/mode"] == "batch_api"
    result = dg.materialize([notes, asset], partition_key="b", resources={"llm": llm})
    assert result.success
    assert result.output_for_node("note_vectors")["embedding"].notna().sum() == 2
    stats = embed_sim.stats(log=False)
    assert stats["batches"]["batches_created"] == 1 and stats["embeddings"]["requests"] == 0


def test_a_wrong_embedding_attribute_names_the_fix():
    bad = {**ATTRIBUTES, "input_column": "body"}  # and input: exactly one of them
    with pytest.raises(Exception) as info, loaded_defs_yaml(
            "dagster_batchllm.BatchEmbeddingComponent", bad, "note_vectors"):
        pass
    chain, error = [], info.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__
    assert any("exactly one of input=" in text for text in chain), chain
