"""The embeddings asset: partitions and single-run backfills, per-partition figures (rows,
tokens, dimensions), checks, the retry sensor, and the example location's two assets."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from dagster_batchllm import (
    build_embedding_asset,
    build_retry_partitions_sensor,
)
from dagster_batchllm.testing import SimulatedEndpoint

PARTS = dg.StaticPartitionsDefinition(["a", "b"])
EMBED = "sim-embed"
pytestmark = pytest.mark.timeout(120)


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run())
def notes(context) -> pd.DataFrame:
    rows = [(part, f"{part}-{i}", None if i == 3 else f"note {i} of partition {part}")
            for part in context.partition_keys for i in range(6)]
    return pd.DataFrame(rows, columns=["day", "note_id", "text"])


note_embeddings = build_embedding_asset(
    name="note_embeddings", source=notes, input_column="text", model=EMBED,
    partitions_def=PARTS, partition_column="day", key_columns=["note_id"],
    warn_failed_rate=0.5, error_failed_rate=0.9, inputs_per_request=4,
)


class FramesByDay(dg.IOManager):
    """Tables in memory, one per asset, whose rows carry their partition in ``day``: a
    single-run backfill stores and loads several partitions at once."""

    def __init__(self):
        self.tables: dict[str, pd.DataFrame] = {}

    def handle_output(self, context, obj):
        name = context.asset_key.to_user_string()
        kept = self.tables.get(name)
        if kept is not None:
            obj = pd.concat([kept[~kept.day.isin(context.asset_partition_keys)], obj])
        self.tables[name] = obj

    def load_input(self, context):
        table = self.tables[context.asset_key.to_user_string()]
        return table[table.day.isin(context.asset_partition_keys)].reset_index(drop=True)


@pytest.fixture
def resources(llm):
    return {"llm": llm, "io_manager": FramesByDay()}


@pytest.fixture(scope="module")
def embed_sim():
    with SimulatedEndpoint(models=("sim-model",), embedding_models=(EMBED,),
                           embedding_dimensions=32) as endpoint:
        yield endpoint


@pytest.fixture
def llm(embed_sim, make_llm_resource):
    embed_sim.reset_stats()
    return make_llm_resource(embed_sim, endpoint_kwargs={"embedding_models": [EMBED]},
                             max_attempts=1)


def _materialization(result: dg.ExecuteInProcessResult, partition: str) -> dict:
    [event] = [e for e in result.asset_materializations_for_node("note_embeddings")
               if e.partition == partition]
    return {k: v.value for k, v in event.metadata.items()}


@pytest.mark.slow
def test_a_single_run_backfill_gives_each_partition_its_figures_and_checks(resources, embed_sim,
                                                                           instance):
    result = dg.materialize([notes, note_embeddings], instance=instance, resources=resources,
                            tags={"dagster/asset_partition_range_start": "a",
                                  "dagster/asset_partition_range_end": "b"})
    assert result.success
    table = result.output_for_node("note_embeddings")
    ok = table["embedding"].notna()
    assert ok.sum() == 10 and table.loc[~ok, "embedding_error"].str.startswith(
        "invalid_input").all()
    assert all(v.dtype == np.float32 and v.shape == (32,) for v in table.loc[ok, "embedding"])
    for part in ("a", "b"):
        figures = _materialization(result, part)
        assert figures["dagster/row_count"] == 6 and figures["batchllm/rows_succeeded"] == 5
        assert figures["batchllm/rows_failed"] == 1 and figures["batchllm/dimensions"] == 32
        assert figures["batchllm/run/requests"] == 2  # 5 inputs, 4 per request
        assert figures["batchllm/run/prompt_tokens"] > 0
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 6 and all(c.passed for c in checks
                                    if c.check_name != "failed_row_rate")
    assert embed_sim.stats()["embeddings"]["inputs"] == 10

    embed_sim.reset_stats()
    again = dg.materialize([notes, note_embeddings], instance=instance, resources=resources,
                           partition_key="a")
    assert again.success and embed_sim.stats()["embeddings"]["requests"] == 0
    assert _materialization(again, "a")["batchllm/rows_cached"] == 5


@pytest.mark.slow
def test_the_retry_sensor_reruns_the_partition_whose_requests_failed(llm, resources, embed_sim,
                                                                      instance):
    def run(partition: str, **kwargs) -> None:
        assert dg.materialize([notes, note_embeddings], instance=instance,
                              resources=resources, partition_key=partition, **kwargs).success

    run("a")
    embed_sim.script(500)  # the first request of b (4 of its inputs) fails; no retries here
    run("b")
    sensor = build_retry_partitions_sensor(note_embeddings, resource=llm, base_delay_s=0)
    requested = sensor(dg.build_sensor_context(instance=instance))
    assert [r.partition_key for r in requested.run_requests] == ["b"]
    embed_sim.reset_stats()
    [request] = requested.run_requests
    run("b", selection=request.asset_selection, tags=request.tags)
    assert embed_sim.stats()["embeddings"]["inputs"] == 4  # only the failed ones
    assert llm.ledger.status_counts("b", "note_embeddings")["ok"] == 5


def test_definition_mistakes_raise_saying_what_to_fix():
    assert "Embeddings with model `sim-embed`" in next(iter(note_embeddings.specs)).description
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="unknown argument"):
        build_embedding_asset(name="x", source=notes, input_column="text", prompt="{text}")
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="exactly one of input="):
        build_embedding_asset(name="x", source=notes)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="partition_column"):
        build_embedding_asset(name="x", source=notes, input_column="text",
                              partition_column="day")


@pytest.mark.slow
def test_the_example_finds_similar_earlier_calls_of_high_risk_ones(tmp_path, instance,
                                                                   monkeypatch):
    monkeypatch.setenv("BATCHLLM_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'warehouse.db'}")
    monkeypatch.setenv("BATCHLLM_STORE_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    from assets.embeddings import similar_high_risk_calls, transcript_embeddings
    from assets.pipeline import pipeline_assets
    from resources import build_resources

    resources = build_resources()
    try:
        result = dg.materialize([*pipeline_assets, transcript_embeddings,
                                 similar_high_risk_calls],
                                instance=instance, resources=resources,
                                partition_key="2026-11-05")
        assert result.success
        embedded = result.output_for_node("transcript_embeddings")
        similar = result.output_for_node("similar_high_risk_calls")
        stored = resources["warehouse"].read_partition("transcript_embeddings", "2026-11-05")
    finally:
        resources["llm"].close()
    vectors = embedded["embedding"].dropna()
    assert len(vectors) >= 0.95 * len(embedded) and vectors.iloc[0].shape == (384,)
    # The warehouse keeps each vector as a float32 BLOB of 384 * 4 bytes.
    assert {len(b) for b in stored["embedding"].dropna()} == {384 * 4}
    assert len(similar) > 0 and set(similar["similarity_rank"]) <= {1, 2, 3}
    assert (similar["similar_call_timestamp"] < similar["call_timestamp"]).all()
    assert similar["similarity"].between(-1, 1).all()
    assert similar.groupby("call_id")["similarity"].apply(
        lambda s: s.is_monotonic_decreasing).all()


def test_a_components_yaml_declares_embedding_models(embed_sim, tmp_path):
    from tests.dagster.defs_yaml import loaded_defs_yaml

    attributes = {
        "name": "answers", "source": "notes", "prompt": "Answer: {text}", "output_column": "a",
        "resource": {"endpoints": [{"name": "sim", "base_url": embed_sim.base_url,
                                    "models": ["sim-model"], "embedding_models": [EMBED]}],
                     "store_url": f"sqlite:///{tmp_path / 'ledger.db'}"},
    }
    with loaded_defs_yaml("dagster_batchllm.BatchInferenceComponent", attributes,
                          "answers") as (_, defs):
        llm = dict(defs.resources)["llm"]
    try:
        assert llm.to_settings().embedding_models == frozenset({EMBED})
        result = llm.embed(pd.DataFrame({"text": ["from yaml"]}), input_column="text")
    finally:
        llm.close()
    assert result.df["embedding"][0].shape == (32,)
