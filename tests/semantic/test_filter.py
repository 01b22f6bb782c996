"""llm.filter and llm.classify: kept rows, a reason for every NULL, the requests SQL sends."""

from __future__ import annotations

import pandas as pd
import pytest

from dagster_batchllm import InferenceConfigError
from dagster_batchllm.semantic.filter import NO_TEXT, row_texts
from tests.semantic.cascade_helpers import LABELS, ORACLE, TRUTH

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
