"""PDF pages with pypdfium2: each page's text layer and, on request, the page rendered to PNG.

A scanned page has no text layer: its ``text`` is ``""`` and only its image says what is on it
(send the images to a vision model: ``infer(..., images="pages")``). An encrypted PDF that the
empty password does not open, a file that is not a PDF, or a corrupt one raises
:class:`DocumentError` with pdfium's reason; the SQL function and ``infer`` turn it into that
row's error. A path is read through a file policy (:mod:`dagster_batchllm.core.file_policy`): a
regular file, never a FIFO or a device; a path from a table cell (``ai_parse_document``) only
under ``files_roots``. No error quotes the file's bytes.

The PNG encoder is here (zlib over the raw RGB rows) so that no imaging library is needed.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from ..core import FilePolicy, FileRefusedError

DEFAULT_SCALE = 1.0  # 72 dpi: a US Letter page renders to 612 x 792 pixels
PDF_SIGNATURE = b"%PDF-"
# pdfium is not thread-safe: one document at a time in this process (pypdfium2's advice).
_PDFIUM_LOCK = threading.Lock()


class DocumentError(ValueError):
    """A document that cannot be read, with the reason."""


@dataclass(frozen=True)
class Page:
    """One page: its number (from 1), text layer, size in pixels and PNG (``b""`` if not
    rendered)."""

    number: int
    text: str
    width: int
    height: int
    png: bytes = b""


def parse_document(content_or_path: bytes | str | os.PathLike, *, render: bool = True,
                   scale: float = DEFAULT_SCALE, password: str | None = None,
                   policy: FilePolicy | None = None) -> list[Page]:
    """The pages of a PDF given as its bytes or a file path.

    ``render=False`` skips the page images (the text layer only, much faster); ``width`` and
    ``height`` are then the page size in pixels at ``scale`` all the same. ``policy`` says
    which paths may be read: by default any regular file (the caller names the path; a path
    from a table should pass ``FilePolicy.of(settings)``, as ``ai_parse_document`` does).
    """
    import pypdfium2

    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    source = _read(content_or_path, policy if policy is not None else FilePolicy.any_path())
    with _PDFIUM_LOCK:
        try:
            document = pypdfium2.PdfDocument(source, password=password)
        except pypdfium2.PdfiumError as exc:
            raise DocumentError(_reason(exc)) from None
        try:
            return [_page(document, i, render, scale) for i in range(len(document))]
        except pypdfium2.PdfiumError as exc:
            raise DocumentError(f"a page cannot be read ({exc})") from None
        finally:
            document.close()


def _read(content_or_path: Any, policy: FilePolicy) -> bytes:
    if isinstance(content_or_path, memoryview | bytearray):
        content_or_path = bytes(content_or_path)
    if isinstance(content_or_path, bytes):
        content = content_or_path
    elif isinstance(content_or_path, str | os.PathLike):
        try:
            content = policy.read(content_or_path)
        except FileRefusedError as exc:
            raise DocumentError(exc.message) from None
    else:
        raise DocumentError(
            f"a document is its bytes or a file path, got a {type(content_or_path).__name__}")
    if not content.lstrip()[:5] == PDF_SIGNATURE:
        # Its first bytes are not shown: a path cell may name anyone's file.
        raise DocumentError("not a PDF (it does not start with %PDF-); only PDF is supported")
    return content


def _reason(exc: Exception) -> str:
    message = str(exc)
    if "password" in message.lower():
        return f"the PDF is encrypted and needs a password ({message})"
    return f"the PDF is corrupt or unreadable ({message})"


def _page(document: Any, index: int, render: bool, scale: float) -> Page:
    page = document[index]
    try:
        text_page = page.get_textpage()
        try:
            text = text_page.get_text_range()
        finally:
            text_page.close()
        page_width, page_height = page.get_size()
        width, height = round(page_width * scale), round(page_height * scale)
        png = b""
        if render:
            bitmap = page.render(scale=scale, rev_byteorder=True)  # RGB byte order
            try:
                pixels = bitmap.to_numpy()
                height, width = pixels.shape[:2]
                png = encode_png(pixels[:, :, :3])
            finally:
                bitmap.close()
        return Page(index + 1, text.replace("\r\n", "\n"), width, height, png)
    finally:
        page.close()


def encode_png(rgb: Any) -> bytes:
    """An ``(height, width, 3)`` uint8 array as PNG bytes (no filter, zlib level 6)."""
    import numpy as np

    pixels = np.ascontiguousarray(rgb, dtype=np.uint8)
    height, width = pixels.shape[:2]
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)  # filter byte 0 on every row
    rows[:, 1:] = pixels.reshape(height, width * 3)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))
