"""Images for tests: a valid PNG without an image library, and a data URI of any bytes (what a
chat message's image part carries; see `dagster_batchllm.openai_server.images`)."""

from __future__ import annotations

import base64
import struct
import zlib


def png_bytes(width: int = 1, height: int = 1, rgb: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A valid solid-colour PNG, for tests that need real image bytes without an image library."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))

    row = b"\x00" + bytes(rgb) * width  # filter byte 0, then RGB pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def data_uri(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"
