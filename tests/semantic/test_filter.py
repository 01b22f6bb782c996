"""llm.filter and llm.classify: kept rows, a reason for every NULL, the requests SQL sends."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from dagster_batchllm import Cascade, InferenceConfigError, Price
from dagster_batchllm.semantic.filter import NO_TEXT, row_texts
from tests.semantic.cascade_helpers import LABELS, ORACLE, PROXY, TRUTH, tickets

PREDICATE = "The customer asks for a refund."


def test_filter_keeps_the_rows_that_pass_and_says_why_each_null_is_null(labelled_sim,
                                                                         make_llm_resource):
    llm = make_llm_resource(labelled_sim)
    df = pd.DataFrame({"body": ["I want a refund now", "The chair arrived broken", None, "  ",
                                "Give me my money back", "When do you open?"]},
                      index=[10, 11, 12, 13, 14, 15])
    labelled_sim.script("ok", "ok", "ok", "bad_structured")  # one reply is not JSON
    result = llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE)
    table = result.table
    assert list(table.index) == list(df.index)  # every row is there, answered or not
    broken = table.index[table["passes_error"].fillna("").str.startswith(
        "invalid_structured_output")].tolist()
    assert len(broken) == 1
    expected = {i for i in (10, 14) if i not in broken}
    assert set(result.df.index) == expected
    assert list(result.df.columns) == ["body"]
    reasons = result.null_reasons
    assert reasons[12] == NO_TEXT and reasons[13] == NO_TEXT
    assert set(reasons.index) == {12, 13, *broken}
    assert labelled_sim.stats()["requests"] == 4  # NULL and blank rows are not sent
    labelled_sim.reset_stats()
    again = llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE)
    assert labelled_sim.stats()["requests"] == 1  # only the unreadable reply is asked again
    assert set(again.df.index) == {10, 14}


def test_classify_labels_every_row(labelled_sim, make_llm_resource):
    llm = make_llm_resource(labelled_sim)
    df = pd.DataFrame({"body": ["refund please", "it is broken", "are you open?"]})
    result = llm.classify(df, labels=LABELS, column="body", model=ORACLE)
    assert result.df["label"].tolist() == [TRUTH(t) for t in df["body"]]
    assert result.df["label_error"].isna().all() and result.cascade is None


def test_several_columns_are_one_text_of_labelled_lines():
    df = pd.DataFrame({"subject": ["Lamp", None], "body": ["broken", None]})
    assert row_texts(df, ["subject", "body"], "ai_filter") == ["subject: Lamp\nbody: broken",
                                                               None]


def test_mistakes_raise_before_anything_is_sent(labelled_sim, make_llm_resource):
    llm = make_llm_resource(labelled_sim)
    df = pd.DataFrame({"body": ["a refund"]})
    with pytest.raises(InferenceConfigError, match=r"column\(s\) \['text'\] are not in"):
        llm.filter(df, predicate=PREDICATE, columns=["text"], model=ORACLE)
    with pytest.raises(InferenceConfigError, match="non-empty list"):
        llm.filter(df, predicate=PREDICATE, columns="body", model=ORACLE)
    with pytest.raises(InferenceConfigError, match="'predicate' must be a non-empty STRING"):
        llm.filter(df, predicate=" ", columns=["body"], model=ORACLE)
    with pytest.raises(InferenceConfigError, match="model 'gpt-9' is not served"):
        llm.filter(df, predicate=PREDICATE, columns=["body"], model="gpt-9")
    with pytest.raises(InferenceConfigError, match="at least 2 labels"):
        llm.classify(df, labels=["refund"], column="body", model=ORACLE)
    assert labelled_sim.stats()["requests"] == 0


def test_through_a_batch_api_a_filter_waits_for_its_batch_at_the_batch_price(
        labelled_sim, make_llm_resource, tmp_path):
    price = Price(input_per_mtok=2.0, output_per_mtok=2.0)
    llm = make_llm_resource(labelled_sim, endpoint_kwargs={
        "batch_api": True, "prices": {ORACLE: price}},
        batch_poll_initial_s=0.02, batch_poll_max_s=0.05)
    bodies = ["I want a refund now", "The chair arrived broken", None,
              "Give me my money back", "When do you open?"]
    df = pd.DataFrame({"body": bodies}, index=[5, 6, 7, 8, 9])
    batches = len(labelled_sim.batches())

    kept = llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE,
                      mode="batch_api", deadline=dt.timedelta(hours=1))

    assert set(kept.df.index) == {5, 8}  # the truth: the two refunds
    assert kept.null_reasons.to_dict() == {7: NO_TEXT}
    assert labelled_sim.stats()["requests"] == 0  # nothing online
    assert len(labelled_sim.batches()) == batches + 1  # the four texts in one batch
    assert kept.stats.mode == "batch_api" and kept.stats.succeeded == 4
    assert kept.stats.deadline["status"] == "met"
    assert (kept.stats.deadline["rows_by_batch"], kept.stats.deadline["rows_online"]) == (4, 0)
    online_llm = make_llm_resource(labelled_sim, endpoint_kwargs={"prices": {ORACLE: price}},
                                   store_url=f"sqlite:///{tmp_path / 'online.db'}")
    online = online_llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE)
    assert kept.stats.cost_usd == pytest.approx(online.stats.cost_usd / 2)
    labelled_sim.reset_stats()
    again = llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE,
                       mode="batch_api")
    assert set(again.df.index) == {5, 8} and len(labelled_sim.batches()) == batches + 1


def test_a_batch_filter_is_refused_before_sending_where_it_cannot_be_kept(labelled_sim,
                                                                          make_llm_resource):
    llm = make_llm_resource(labelled_sim, endpoint_kwargs={"batch_api": True})
    df = pd.DataFrame({"body": ["a refund"]})
    batches = len(labelled_sim.batches())
    with pytest.raises(InferenceConfigError, match="wait must be True"):
        llm.classify(df, labels=LABELS, column="body", model=ORACLE, mode="batch_api",
                     wait=False)
    with pytest.raises(InferenceConfigError, match="deadline= is for mode='batch_api'"):
        llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE,
                   deadline=dt.timedelta(hours=1))
    with pytest.raises(InferenceConfigError, match="deadline must be a datetime"):
        llm.filter(df, predicate=PREDICATE, columns=["body"], mode="batch_api",
                   cascade=Cascade(proxy=PROXY, oracle=ORACLE, sample=10), deadline="9am")
    with pytest.raises(InferenceConfigError,
                       match=r"ai_filter: mode must be one of \['online', 'batch_api'\]"):
        llm.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE, mode="offline")
    assert labelled_sim.stats()["requests"] == 0 and not any(
        b["status"] == "validating" for b in labelled_sim.batches())
    assert len(labelled_sim.batches()) == batches


@pytest.mark.slow
def test_a_cascade_through_a_batch_api_sends_the_oracles_rows_as_batches(
        labelled_sim, make_llm_resource, tmp_path):
    prices = {ORACLE: Price(input_per_mtok=2.0, output_per_mtok=6.0),
              PROXY: Price(input_per_mtok=0.1, output_per_mtok=0.3)}
    cascade = Cascade(proxy=PROXY, oracle=ORACLE, sample=150)
    df = tickets(600)
    online = make_llm_resource(labelled_sim, endpoint_kwargs={"prices": prices},
                               store_url=f"sqlite:///{tmp_path / 'online.db'}").filter(
        df, predicate=PREDICATE, columns=["body"], cascade=cascade)
    llm = make_llm_resource(labelled_sim, endpoint_kwargs={"batch_api": True, "prices": prices},
                            batch_poll_initial_s=0.02, batch_poll_max_s=0.05)
    labelled_sim.reset_stats()
    batches = len(labelled_sim.batches())

    kept = llm.filter(df, predicate=PREDICATE, columns=["body"], cascade=cascade,
                      mode="batch_api")

    report = kept.cascade
    assert 150 < report.oracle_rows < 600
    # the proxy answered every row online; the oracle's sample, then its uncertain rows,
    # went as two batches
    assert labelled_sim.stats()["requests"] == 600
    assert len(labelled_sim.batches()) == batches + 2
    assert kept.table["passes"].tolist() == online.table["passes"].tolist()
    assert report.thresholds == online.cascade.thresholds
    assert report.proxy_cost_usd == pytest.approx(online.cascade.proxy_cost_usd)
    assert report.oracle_cost_usd == pytest.approx(online.cascade.oracle_cost_usd / 2)


def test_the_client_filters_and_classifies_as_the_resource_does(labelled_sim, make_client):
    """The client has the resource's verbs (the resource passes them through): the same rows
    kept, the same labels, and answers shared through the ledger."""
    client = make_client(labelled_sim)
    df = pd.DataFrame({"body": ["I want a refund now", "When do you open?", "refund please"]})
    kept = client.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE)
    assert set(kept.df.index) == {0, 2}
    labelled = client.classify(df, labels=LABELS, column="body", model=ORACLE)
    assert labelled.df["label"].tolist() == [TRUTH(t) for t in df["body"]]
    sent = labelled_sim.stats()["requests"]
    client.filter(df, predicate=PREDICATE, columns=["body"], model=ORACLE)
    assert labelled_sim.stats()["requests"] == sent  # a rerun is answered by the ledger


def test_the_client_and_the_resource_offer_the_same_verbs():
    from dagster_batchllm import BatchInferenceResource, InferenceClient

    def verbs(cls: type) -> set[str]:
        return {name for name, value in vars(cls).items()
                if callable(value) and not name.startswith("_")}

    # What only a resource is for: Dagster's lifecycle, and what asset definitions read of it.
    dagster_lifecycle = {"setup_for_execution", "teardown_after_execution", "model_post_init",
                         "to_settings", "asset_kinds", "as_sent", "code_version_of"}
    assert verbs(InferenceClient) == verbs(BatchInferenceResource) - dagster_lifecycle
    assert {"infer", "ainfer", "embed", "predict", "aggregate", "filter", "classify",
            "run_call", "estimate", "plan"} <= verbs(InferenceClient)
