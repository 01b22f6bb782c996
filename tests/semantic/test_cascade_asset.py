"""A cascade in a Dagster asset: its thresholds and measured figures in the metadata."""

import dagster as dg
import pytest

from dagster_batchllm import BatchInferenceResource, Cascade
from tests.semantic.cascade_helpers import ORACLE, PROXY, tickets


@pytest.mark.slow
def test_an_assets_cascade_figures_are_in_its_materialization(labelled_sim,
                                                               make_llm_resource):
    @dg.asset
    def refund_tickets(context: dg.AssetExecutionContext, llm: BatchInferenceResource):
        kept = llm.filter(tickets(800), predicate="The customer asks for a refund.",
                          columns=["body"], context=context,
                          cascade=Cascade(proxy=PROXY, oracle=ORACLE, sample=200))
        context.add_output_metadata({"rows_kept": len(kept.df), **kept.cascade.as_metadata()})
        return kept.df

    result = dg.materialize([refund_tickets], resources={"llm": make_llm_resource(labelled_sim)})
    [event] = result.asset_materializations_for_node("refund_tickets")
    metadata = {key: value.value for key, value in event.metadata.items()}
    assert metadata["cascade/proxy"] == PROXY and metadata["cascade/sample_size"] == 200
    assert metadata["cascade/false_at_or_below"] < metadata["cascade/true_at_or_above"]
    assert metadata["cascade/sample_precision"] >= 0.9
    assert metadata["cascade/sample_recall"] >= 0.9
    assert 0 < metadata["cascade/oracle_share"] < 1
    assert metadata["rows_kept"] > 0
