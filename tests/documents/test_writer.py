"""PDFs written with pdfium read back: text pages line by line, scans with no text layer."""

from __future__ import annotations

import pytest

from dagster_batchllm.documents import parse_document
from dagster_batchllm.testing.pdf_writer import write_scanned_pdf, write_text_pdf


def test_text_pages_read_back_line_by_line():
    content = write_text_pdf([["INVOICE", "Amount due: $1,234.50"], ["Café crème, page 2"]])

    pages = parse_document(content, render=False)

    assert [p.text for p in pages] == ["INVOICE\nAmount due: $1,234.50", "Café crème, page 2"]
    assert [(p.width, p.height) for p in pages] == [(612, 792), (612, 792)]


def test_a_scan_has_the_pages_as_images_and_no_text_layer():
    scan = write_scanned_pdf(write_text_pdf([["Invoice INV-7"], ["Total: $9.00"]]), scale=0.5)

    pages = parse_document(scan, scale=0.5)

    assert [p.text for p in pages] == ["", ""]
    assert all(p.png.startswith(b"\x89PNG") for p in pages)
    # The page is not blank: the text shows as dark pixels of the image.
    import pypdfium2

    document = pypdfium2.PdfDocument(scan)
    try:
        pixels = document[0].render(scale=1).to_numpy()
    finally:
        document.close()
    assert pixels.max() == 255 and (pixels < 200).any(axis=2).sum() > 100


def test_no_pages_is_refused():
    with pytest.raises(ValueError, match="at least one page"):
        write_text_pdf([])
