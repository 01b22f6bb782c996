"""Documents as pages: a PDF's text layer and page images, without a model (no dagster here).

Example::

    from dagster_batchllm.documents import parse_document

    for page in parse_document("invoice.pdf"):
        print(page.number, page.width, page.height, page.text[:60], len(page.png))
"""

from .pdf import DEFAULT_SCALE, DocumentError, Page, encode_png, parse_document

__all__ = ["DEFAULT_SCALE", "DocumentError", "Page", "encode_png", "parse_document"]
