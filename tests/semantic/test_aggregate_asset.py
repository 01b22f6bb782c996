"""llm.aggregate in an asset's body: context= records the asset key as the ledger scope, and a
second materialization sends nothing. (No ``from __future__ import annotations``: Dagster reads
the asset's parameter annotations as types.)"""

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from dagster_batchllm import BatchInferenceResource
from dagster_batchllm.simulator.aggregation import answer_text, rows_digest
from tests.semantic.aggregate_helpers import CONTEXT, INSTRUCTION, aggregating_endpoint, complaints

TEXTS = complaints(120)


@dg.asset
def complaints_by_kind(context: dg.AssetExecutionContext,
                       llm: BatchInferenceResource) -> pd.DataFrame:
    tickets = pd.DataFrame({"kind": ["a", "b"] * 60, "body": TEXTS})
    result = llm.aggregate(tickets, instruction=INSTRUCTION, column="body", by="kind",
                           max_tokens=32, context=context)
    context.add_output_metadata({"levels": result.figures.levels,
                                 "requests_sent": result.figures.requests_sent})
    return result.df


@pytest.fixture
def agg_sim():
    yield from aggregating_endpoint()


def test_an_asset_aggregates_through_the_ledger_under_its_key(agg_sim, make_llm_resource):
    llm = make_llm_resource(agg_sim, endpoint_kwargs={"max_context_tokens": CONTEXT})

    first = dg.materialize([complaints_by_kind], resources={"llm": llm})

    frame = first.output_for_node("complaints_by_kind")
    assert frame["answer"].tolist() == [answer_text(60, rows_digest(TEXTS[0::2])),
                                        answer_text(60, rows_digest(TEXTS[1::2]))]
    sent = agg_sim.stats(log=False)["requests"]
    with sa.create_engine(llm.store_url).connect() as conn:
        scopes = conn.execute(sa.text(
            f"SELECT DISTINCT scope FROM {llm.ledger_table}")).scalars().all()
    assert scopes == ["complaints_by_kind"]
    again = dg.materialize([complaints_by_kind], resources={"llm": llm})
    assert again.success and agg_sim.stats(log=False)["requests"] == sent
    [event] = again.get_asset_materialization_events()
    assert event.materialization.metadata["requests_sent"].value == 0
