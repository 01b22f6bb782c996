"""parse_document on real PDFs (written by hand: a text layer, a scanned page, encrypted,
corrupt), and its page images sent through infer(images=...) to the simulated endpoint."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from dagster_batchllm.core.tasks.chat.images import image_size
from dagster_batchllm.documents import DocumentError, Page, encode_png, parse_document
from tests.documents.samples import encrypted_pdf, scanned_pdf, text_pdf

PAGES = ["Invoice 1042 from ACME GmbH", "Total due: 199.00 EUR", "Thank you (and goodbye)"]


def test_a_multi_page_pdf_gives_each_pages_text_and_image(tmp_path):
    path = tmp_path / "invoice.pdf"
    path.write_bytes(text_pdf(PAGES))

    from_bytes = parse_document(path.read_bytes(), scale=0.5)
    from_path = parse_document(path, scale=0.5)

    assert [p.text for p in from_bytes] == PAGES and from_path == from_bytes
    for number, page in enumerate(from_bytes, start=1):
        assert page.number == number and (page.width, page.height) == (306, 396)
        assert image_size(page.png, "image/png") == (306, 396)
    assert len({p.png for p in from_bytes}) == 3  # each page renders its own text


def test_text_only_parsing_skips_rendering_but_keeps_the_size():
    [page] = parse_document(text_pdf(["one"]), render=False, scale=2)
    assert page == Page(1, "one", 1224, 1584, b"")


def test_a_scanned_page_has_an_image_and_no_text():
    [page] = parse_document(scanned_pdf())
    assert page.text == "" and image_size(page.png, "image/png") == (612, 792)


@pytest.mark.parametrize("content, reason", [
    (encrypted_pdf(), "encrypted and needs a password"),
    (text_pdf(PAGES)[:150], "corrupt or unreadable"),
    (b"%PDF-1.7\n" + b"\x00" * 64, "corrupt or unreadable"),
    (b"GIF89a not a pdf", "not a PDF"),
    (12, "bytes or a file path"),
])
def test_unreadable_documents_raise_with_the_reason(content, reason):
    with pytest.raises(DocumentError, match=reason):
        parse_document(content)


def test_a_missing_file_is_a_document_error(tmp_path):
    with pytest.raises(DocumentError, match="does not exist"):
        parse_document(tmp_path / "nope.pdf")


def test_encode_png_round_trips_the_size():
    import numpy as np

    png = encode_png(np.zeros((5, 7, 3), dtype=np.uint8))
    assert image_size(png, "image/png") == (7, 5)


def test_rendered_pages_reach_their_rows_through_infer(sim, make_client):
    docs = [text_pdf(["first document"]), text_pdf(["second", "document"]), scanned_pdf()]
    pages = [[p.png for p in parse_document(doc, scale=0.25)] for doc in docs]
    df = pd.DataFrame({"doc": ["a", "b", "c"], "pages": pages})

    result = make_client(sim).infer(df, prompt="Extract the fields of {doc}", images="pages",
                                    model="sim-model", output_column="fields")

    assert result.df["fields_error"].isna().all()
    for reply, images in zip(result.df["fields"], pages, strict=True):
        markers = " ".join(f"[image sha256:{hashlib.sha256(png).hexdigest()[:12]}]"
                           for png in images)
        assert reply.endswith(markers)
    assert sim.stats(log=False)["images"]["images"] == 4
