"""PDF invoices -> parsed pages -> structured fields -> a table (group ``documents``).

* ``invoice_pdfs``: the example's invoices written as PDF files with pdfium
  (``assets/data/generate_invoices.py``): twelve with a text layer, some of two pages, and
  one scan (an image only).
* ``invoice_pages``: every page parsed without a model (``dagster_batchllm.documents``): its
  text layer; a page with none (the scan) is rendered to PNG beside the PDF.
* ``invoice_documents``: one row per invoice with the chat messages to send: the pages' text,
  and the images of pages that have no text layer (image parts: a vision model reads them).
* ``invoices``: the fields of each invoice (number, date, amount due, customer name, e-mail,
  phone) through a JSON schema (``response_format``), one column per field.

On the embedded default the fields come from the text layer (the classical models fill a schema
by pattern: the first invoice number, date, amount of money, named person, e-mail and phone in
the text), and the scanned invoice is a per-row error saying that a vision model endpoint is
needed; with ``BATCHLLM_ENDPOINTS`` at a vision model it is read from its image too.
"""

import json
from pathlib import Path

import dagster as dg
import pandas as pd
from pydantic import Field

from dagster_batchllm import build_inference_asset
from dagster_batchllm.core.file_policy import FilePolicy
from dagster_batchllm.core.tasks.chat.images import DEFAULT_MAX_IMAGE_BYTES, image_parts
from dagster_batchllm.documents import DocumentError, parse_document
from resources.warehouse import DEFAULT_DATA_DIR

from .data.generate_invoices import write_invoices
from .pipeline import LLM

GROUP = "documents"
RENDER_SCALE = 1.5  # 108 dpi: small print stays legible to a vision model
INSTRUCTIONS = ("You read invoices. Extract the invoice number, the invoice date (ISO "
                "8601), the amount due as a number, and the customer's name, e-mail and phone "
                "as printed. Use null for a field the invoice does not show. Answer in JSON.")

_NULLABLE_STRING = {"type": ["string", "null"]}
INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": _NULLABLE_STRING,
        "invoice_date": {"type": ["string", "null"], "format": "date"},
        "amount_due": {"type": ["number", "null"]},
        "customer_name": _NULLABLE_STRING,
        "customer_email": _NULLABLE_STRING,
        "customer_phone": _NULLABLE_STRING,
    },
    "required": ["invoice_number", "invoice_date", "amount_due", "customer_name",
                 "customer_email", "customer_phone"],
    "additionalProperties": False,
}


class InvoiceFolder(dg.Config):
    folder: str = Field(default=str(DEFAULT_DATA_DIR / "invoices"),
                        description="Where the example's invoice PDFs are written.")


@dg.asset(group_name=GROUP, kinds={"pdf", "sqlite"})
def invoice_pdfs(context: dg.AssetExecutionContext, config: InvoiceFolder) -> pd.DataFrame:
    """The example's invoices as PDF files (written at every run: the same pages each time)."""
    paths = write_invoices(config.folder)
    table = pd.DataFrame({"document_id": [p.stem for p in paths],
                          "path": [str(p) for p in paths],
                          "size_bytes": [p.stat().st_size for p in paths]})
    context.add_output_metadata({"dagster/row_count": len(table), "folder": config.folder})
    return table


@dg.asset(group_name=GROUP, kinds={"pandas", "sqlite"})
def invoice_pages(context: dg.AssetExecutionContext, invoice_pdfs: pd.DataFrame
                  ) -> pd.DataFrame:
    """One row per page: its text layer, and for a page without one (a scan) its image as PNG
    beside the PDF. A document that cannot be read is one row with its ``parse_error``."""
    rows = []
    for document_id, path in zip(invoice_pdfs["document_id"], invoice_pdfs["path"],
                                 strict=True):
        try:
            # Render only what has no text layer: a text page needs no image.
            pages = parse_document(path, render=False)
            scans = {p.number for p in pages if not p.text.strip()}
            rendered = parse_document(path, scale=RENDER_SCALE) if scans else []
        except DocumentError as exc:
            rows.append({"document_id": document_id, "path": path, "page_number": None,
                         "text": None, "image_path": None, "parse_error": str(exc)})
            continue
        for page in pages:
            image_path = None
            if page.number in scans:
                image = Path(path).with_name(f"{document_id}-page{page.number}.png")
                image.write_bytes(rendered[page.number - 1].png)
                image_path = str(image)
            rows.append({"document_id": document_id, "path": path, "page_number": page.number,
                         "text": page.text, "image_path": image_path, "parse_error": None})
    table = pd.DataFrame(rows)
    context.add_output_metadata({
        "dagster/row_count": len(table),
        "pages_without_text_layer": int(table["image_path"].notna().sum()),
        "documents_unreadable": int(table["parse_error"].notna().sum()),
    })
    return table


@dg.asset(group_name=GROUP, kinds={"pandas", "sqlite"})
def invoice_documents(context: dg.AssetExecutionContext, invoice_pages: pd.DataFrame
                      ) -> pd.DataFrame:
    """One row per invoice: page count, the text of its pages and the messages to send."""
    rows = []
    for document_id, pages in invoice_pages.groupby("document_id", sort=True):
        pages = pages.sort_values("page_number")
        error = pages["parse_error"].dropna()
        texts = [t for t in pages["text"].dropna() if t.strip()]
        images = [p for p in pages["image_path"].dropna()]
        rows.append({
            "document_id": document_id,
            "path": pages["path"].iloc[0],
            "page_count": 0 if len(error) else len(pages),
            "text": "\n\n".join(texts),
            "scanned_pages": len(images),
            # An unreadable document has nothing to send: its messages are null, which the
            # inference asset reports as that row's error with the parse error beside it.
            "messages": None if len(error) else json.dumps(_messages(texts, images)),
            "parse_error": error.iloc[0] if len(error) else None,
        })
    table = pd.DataFrame(rows)
    context.add_output_metadata({"dagster/row_count": len(table)})
    return table


def _messages(texts: list[str], images: list[str]) -> list[dict]:
    text = "Invoice:\n\n" + "\n\n".join(texts) if texts else "Invoice (scanned pages):"
    if not images:
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}]
    # invoice_pages wrote these page images itself, wherever its folder is: read them as the
    # code's own paths (any folder, regular files only), not as cells of someone else's table.
    parts = [p.part for path in images
             for p in image_parts(path, "image_path", "auto", DEFAULT_MAX_IMAGE_BYTES,
                                  policy=FilePolicy.any_path())]
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


invoices = build_inference_asset(
    name="invoices",
    source=invoice_documents,
    messages_column="messages",
    response_format={"type": "json_schema", "json_schema": {
        "name": "invoice", "strict": True, "schema": INVOICE_SCHEMA}},
    output_column="fields",
    temperature=0.0,
    max_tokens=256,
    key_columns=["document_id"],
    group_name=GROUP,
    # One of the thirteen invoices is a scan on purpose: on the embedded default (no vision
    # model) it fails as its own row, 7.7% of the table; more than that is worth a warning.
    warn_failed_rate=0.10,
    error_failed_rate=0.50,
    description="The fields of each invoice, one column per field of a JSON schema.",
    resource=LLM,
)

document_assets = [invoice_pdfs, invoice_pages, invoice_documents, invoices]
