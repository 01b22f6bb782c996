"""The example's invoices: deterministic PDFs with known fields, written with pdfium.

``example_invoices()`` lists the invoices (seeded, so every machine gets the same ones) with the
fields printed on them; ``write_invoices(folder)`` writes one PDF per invoice and returns the
paths. Long invoices run onto a second page. The last one is a scan: its page is only an image
of the printed invoice, with no text layer, so only a vision model can read it.

The layout is an ordinary invoice's: the customer and the amount due at the top, the line
items, then the vendor's remittance address at the foot.

    .venv/bin/python assets/data/generate_invoices.py data/invoices   # write them by hand
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from dagster_batchllm.testing.pdf_writer import write_scanned_pdf, write_text_pdf

SEED = 20261105
COUNT = 12  # invoices with a text layer; one scanned invoice follows them
LINES_PER_PAGE = 30

_FIRST = [("Ms.", "Jane"), ("Mr.", "Omar"), ("Dr.", "Priya"), ("Mr.", "Lucas"), ("Ms.", "Mei"),
          ("Mr.", "Daniel"), ("Dr.", "Amara"), ("Mr.", "Tomas"), ("Ms.", "Grace"),
          ("Dr.", "Kenji"), ("Ms.", "Sofia"), ("Mr.", "Ethan"), ("Ms.", "Nadia")]
_LAST = ["Porter", "Haddad", "Raman", "Moreau", "Chen", "Okafor", "Lindqvist", "Novak",
         "Whitfield", "Tanaka", "Alvarez", "Brooks", "Petrova"]
_ITEMS = [("Ergonomic office chair", 399.00), ("Standing desk converter", 436.50),
          ("Laser printer toner", 84.99), ("Copy paper, 10 reams", 52.40),
          ("Wireless keyboard", 59.00), ("27-inch monitor", 289.00), ("Desk lamp", 34.75),
          ("Whiteboard markers, 12 pack", 11.20), ("Filing cabinet", 179.00),
          ("USB-C docking station", 149.99), ("Noise-cancelling headset", 129.00),
          ("Label maker", 46.30)]
_DATE_STYLES = ("%B {day}, %Y", "%Y-%m-%d", "{day} %B %Y")


@dataclass(frozen=True)
class Invoice:
    """One invoice and the fields printed on it (the truth an extraction is checked against)."""

    document_id: str
    invoice_number: str
    invoice_date: str  # ISO
    amount_due: float
    customer_name: str  # without the title
    customer_email: str
    customer_phone: str
    scanned: bool
    lines: tuple[str, ...]  # what is printed, in order


def _printed_date(day: date, style: str) -> str:
    return day.strftime(style.replace("{day}", str(day.day)))


def example_invoices(count: int = COUNT, seed: int = SEED) -> list[Invoice]:
    """``count`` text invoices and one scanned one, the same for a given seed."""
    rng = random.Random(seed)
    invoices = []
    for i in range(count + 1):
        (title, first), last = _FIRST[i % len(_FIRST)], _LAST[(i * 5) % len(_LAST)]
        issued = date(2026, 10, 1) + timedelta(days=rng.randrange(60))
        number = f"INV-2026-{1001 + i:04d}"
        email = f"{first.lower()}.{last.lower()}@example.com"
        phone = f"({rng.randrange(201, 989)}) 555-{rng.randrange(100, 10000):04d}"
        # Long invoices (every fourth) carry enough items to run onto a second page.
        n_items = 26 if i % 4 == 3 else rng.randrange(2, 6)
        items = []
        for _ in range(n_items):
            name, price = _ITEMS[rng.randrange(len(_ITEMS))]
            items.append((name, rng.randrange(1, 5), price))
        total = round(sum(q * p for _, q, p in items), 2)
        due = _printed_date(issued + timedelta(30), "%B {day}, %Y")
        lines = (
            "INVOICE",
            f"Invoice number: {number}",
            f"Invoice date: {_printed_date(issued, _DATE_STYLES[i % 3])}",
            f"Bill to: {title} {first} {last}",
            f"{email}, {phone}",
            f"Amount due: ${total:,.2f}",
            f"Payment due within 30 days, by {due}",
            "",
            "Description | Qty | Unit price | Line total",
            *(f"{name} | {qty} | ${price:,.2f} | ${qty * price:,.2f}"
              for name, qty, price in items),
            "",
            f"Total: ${total:,.2f}",
            "Remit to: NORTHWIND OFFICE SUPPLIES, 12 HARBOR WAY, OAKLAND CA",
            "Thank you for your business.",
        )
        invoices.append(Invoice(f"invoice-{i + 1:02d}", number, issued.isoformat(), total,
                                f"{first} {last}", email, phone, i == count, lines))
    return invoices


def invoice_pdf(invoice: Invoice) -> bytes:
    """The invoice as a PDF: its lines, LINES_PER_PAGE to a page; a scan for a scanned one."""
    lines = list(invoice.lines)
    pages = [lines[i:i + LINES_PER_PAGE] for i in range(0, len(lines), LINES_PER_PAGE)]
    content = write_text_pdf(pages)
    return write_scanned_pdf(content, scale=1.5) if invoice.scanned else content


def write_invoices(folder: str | Path, invoices: list[Invoice] | None = None) -> list[Path]:
    """Write each invoice to ``<folder>/<document_id>.pdf``. pdfium stamps each file it saves
    with a new ID, so the bytes differ from one write to the next; the pages and their text do
    not, and neither do the requests made from them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for invoice in invoices or example_invoices():
        path = folder / f"{invoice.document_id}.pdf"
        path.write_bytes(invoice_pdf(invoice))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_invoices(sys.argv[1] if len(sys.argv) > 1 else "data/invoices"):
        print(written)
