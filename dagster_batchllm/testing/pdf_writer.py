"""Writing PDFs with pdfium (pypdfium2): text pages, and scans of them (pages that are only an
image, as a scanner makes), for examples, tests and benchmarks.

``write_text_pdf([["line 1", "line 2"], ["page two"]])`` lays each page's lines out top-down in
Helvetica on US Letter, so pdfium's text layer reads them back line by line.
``write_scanned_pdf(pdf_bytes)`` renders every page of a PDF to pixels and writes a new PDF
whose pages hold only those images: no text layer, as a paper document that was scanned.

pdfium writes real PDF objects (a content stream per page, the standard Type 1 font, a cross-
reference table); pypdfium2 offers no helper for new text, so text objects go through its raw
bindings (``FPDFPageObj_NewTextObj``, ``FPDFText_SetText``).
"""

from __future__ import annotations

import ctypes
import io
from collections.abc import Sequence

from ..documents.pdf import _PDFIUM_LOCK

LETTER = (612.0, 792.0)  # points
MARGIN = 72.0
FONT = b"Helvetica"  # one of the 14 standard fonts: no font file is embedded


def write_text_pdf(pages: Sequence[Sequence[str]], *, font_size: float = 11.0,
                   line_height: float | None = None) -> bytes:
    """A PDF with one page per item of ``pages``, each a list of lines (latin-1 text reads
    back exactly; Helvetica has no other glyphs)."""
    import pypdfium2
    import pypdfium2.raw as pdfium_c

    if not pages:
        raise ValueError("a PDF needs at least one page")
    step = line_height or font_size * 1.45
    with _PDFIUM_LOCK:
        document = pypdfium2.PdfDocument.new()
        try:
            for lines in pages:
                page = document.new_page(*LETTER)
                try:
                    y = LETTER[1] - MARGIN
                    for line in lines:
                        if line:
                            obj = pdfium_c.FPDFPageObj_NewTextObj(
                                document.raw, FONT, ctypes.c_float(font_size))
                            # FPDF_WIDESTRING: NUL-terminated UTF-16LE
                            text = ctypes.create_string_buffer(
                                (line + "\x00").encode("utf-16-le"))
                            pdfium_c.FPDFText_SetText(
                                obj, ctypes.cast(text, ctypes.POINTER(pdfium_c.FPDF_WCHAR)))
                            pdfium_c.FPDFPageObj_Transform(obj, 1, 0, 0, 1, MARGIN, y)
                            pdfium_c.FPDFPage_InsertObject(page.raw, obj)  # page owns it now
                        y -= step
                    pdfium_c.FPDFPage_GenerateContent(page.raw)
                finally:
                    page.close()
            return _saved(document)
        finally:
            document.close()


def write_scanned_pdf(content: bytes, *, scale: float = 1.0) -> bytes:
    """The pages of the PDF ``content`` as images only (rendered at ``scale``: 1.0 = 72 dpi)."""
    import pypdfium2

    with _PDFIUM_LOCK:
        source = pypdfium2.PdfDocument(content)
        scan = pypdfium2.PdfDocument.new()
        try:
            for index in range(len(source)):
                page = source[index]
                width, height = page.get_size()
                bitmap = page.render(scale=scale)
                new_page = scan.new_page(width, height)
                image = pypdfium2.PdfImage.new(scan)
                image.set_bitmap(bitmap)
                image.set_matrix(pypdfium2.PdfMatrix().scale(width, height))
                new_page.insert_obj(image)
                new_page.gen_content()
                for handle in (bitmap, new_page, page):
                    handle.close()
            return _saved(scan)
        finally:
            scan.close()
            source.close()


def _saved(document) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
