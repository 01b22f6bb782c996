"""Small, real PDFs written by hand, for the tests (no PDF library needed).

``text_pdf(["page one", "page two"])`` has a text layer (Helvetica, one line per page);
``scanned_pdf()`` has one page that is only an image (what a scanner makes: no text layer);
``encrypted_pdf()`` declares the standard security handler with a user password, so it does
not open without one.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence


def _pdf(objects: Sequence[bytes], trailer_extra: bytes = b"") -> bytes:
    """A PDF of ``objects`` (object 1 is the catalog) with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += (b"trailer\n<< /Size %d /Root 1 0 R " % (len(objects) + 1) + trailer_extra
            + b">>\nstartxref\n%d\n%%%%EOF\n" % xref)
    return bytes(out)


def _stream(data: bytes, extra: bytes = b"") -> bytes:
    return b"<< /Length %d " % len(data) + extra + b">>\nstream\n" + data + b"\nendstream"


def _escape(text: str) -> bytes:
    raw = text.encode("latin-1")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def text_pdf(pages: Sequence[str], trailer_extra: bytes = b"") -> bytes:
    """A US Letter PDF with one line of text per page (latin-1 text)."""
    count = len(pages)
    font = 3 + 2 * count
    kids = b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % count]
    for i, text in enumerate(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>"
                       % (font, 4 + 2 * i))
        objects.append(_stream(b"BT /F1 18 Tf 72 700 Td (" + _escape(text) + b") Tj ET"))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return _pdf(objects, trailer_extra)


def scanned_pdf(width: int = 64, height: int = 64) -> bytes:
    """One page that is a grey gradient image and nothing else: no text layer."""
    pixels = bytes((x * 255 // max(width - 1, 1)) for _ in range(height) for x in range(width))
    image = _stream(zlib.compress(pixels), b"/Type /XObject /Subtype /Image /Width %d "
                    b"/Height %d /ColorSpace /DeviceGray /BitsPerComponent 8 "
                    b"/Filter /FlateDecode " % (width, height))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
               b"/Resources << /XObject << /Im1 5 0 R >> >> /Contents 4 0 R >>",
               _stream(b"q 468 0 0 648 72 72 cm /Im1 Do Q"), image]
    return _pdf(objects)


def encrypted_pdf() -> bytes:
    """A PDF whose standard security handler does not accept the empty user password."""
    encrypt = (b"/Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /P -44 "
               b"/O <" + b"11" * 32 + b"> /U <" + b"22" * 32 + b"> >> "
               b"/ID [<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>] ")
    return text_pdf(["secret"], trailer_extra=encrypt)
