"""The embedded default and documents: a PDF's text layer is answered classically, an image is
refused (per row, 422, sent once) with a message saying a vision model endpoint is needed."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from dagster_batchllm.documents import parse_document
from dagster_batchllm.managed.classical import ClassicalResponder, start_local_endpoint
from dagster_batchllm.sql import register_ai_functions
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import scanned_pdf, text_pdf

COMPLAINT = ("Customer: I am really angry, the blender arrived cracked and I want a refund. "
             "Agent: I am sorry, I have processed the refund of $49.99 today.")


@pytest.fixture(scope="module")
def embedded():
    endpoint = start_local_endpoint(process=False)
    yield endpoint
    endpoint.stop()


def test_an_image_row_is_refused_and_the_same_text_alone_answered(make_client, embedded):
    embedded.reset_stats()
    scan = parse_document(scanned_pdf(), scale=0.25)[0].png
    df = pd.DataFrame({"text": [COMPLAINT], "page": [[scan]]})
    client = make_client(embedded)

    refused = client.infer(df, prompt="Summarize: {text}", images="page", model="local",
                           output_column="summary")
    answered = client.infer(df[["text"]], prompt="Summarize: {text}", model="local",
                            output_column="summary")

    error = refused.df["summary_error"].iloc[0]
    assert refused.df["summary"].iloc[0] is None
    assert "cannot read images" in error and "vision model endpoint is needed" in error
    # The refusal whole, and classed as what no retry fixes (the retry sensor skips it)
    assert error.startswith("unsupported_task: ") and "endpoint (Endpoint(base_url=...))" in error
    assert refused.error_types.tolist() == ["unsupported_task"]
    assert answered.df["summary_error"].isna().all()
    assert "refund" in answered.df["summary"].iloc[0].lower()
    assert embedded.stats(log=False)["by_status"] == {"422": 1, "200": 1}  # 422 sent once


def test_a_remote_image_is_refused_too():
    with pytest.raises(Exception, match="vision model endpoint"):
        ClassicalResponder().respond("local-summarizer", [
            {"role": "user", "content": "Summarize:\n[remote image sha256:0123456789ab]"}], {})


def test_a_pdf_text_layer_is_summarized_and_classified_without_a_vision_model(
        make_client, embedded, tmp_path):
    (tmp_path / "letter.pdf").write_bytes(text_pdf([COMPLAINT[:80], COMPLAINT[80:]]))
    con = duckdb.connect()
    register_ai_functions(con, make_client(embedded), default_model="local")
    try:
        sentiment, label = con.execute(
            "WITH doc AS (SELECT replace(ai_parse_document(content).text, chr(12), ' ') AS t "
            "FROM read_blob(?)) "
            "SELECT ai_analyze_sentiment(t), ai_classify(t, ['refund', 'shipping question']) "
            "FROM doc", [str(tmp_path / "letter.pdf")]).fetchone()
    finally:
        con.close()
    assert sentiment == "negative" and label == "refund"


def test_png_images_are_refused_by_every_chat_model(make_client, embedded):
    df = pd.DataFrame({"text": ["Classify: hello"], "img": [png_bytes(2, 2)]})
    client = make_client(embedded)
    for model in ("local", "local-summarizer", "local-classifier"):
        result = client.infer(df, prompt="{text}", images="img", model=model,
                              output_column="out")
        assert "vision model endpoint" in result.df["out_error"].iloc[0], model
