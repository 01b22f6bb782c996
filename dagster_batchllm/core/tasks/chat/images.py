"""Image cells as OpenAI ``image_url`` content parts, checked before anything is sent.

A cell of an ``images=`` column may hold the image's bytes, a local file path (``str`` or
``os.PathLike``), an ``http(s)://`` URL, a ``data:`` URI, or a list of those (the pages of a
document). Bytes and files become base64 ``data:`` URIs whose MIME type is sniffed from the
bytes (PNG, JPEG, WebP, GIF); remote URLs are passed through for the server to fetch, unless the
file policy refuses them (``allow_image_urls=False``).

What is checked, each failure a per-row :class:`~.errors.InvalidInputError` with the reason: a
path is read only as the file policy allows (:mod:`~dagster_batchllm.core.file_policy`: a
regular file under ``files_roots``, never a FIFO or a device, at most ``max_image_bytes``,
checked on the file's size before it is read); the image is one of the four formats, and is
whole (a PNG ends with its IEND chunk, a JPEG with its end-of-image marker, a GIF with its
trailer, a WebP is as long as its RIFF header says), and its width and height can be read
from its header. No message quotes the image's bytes: a cell may name any file, and its error
goes to the ledger and the asset's metadata.

Token cost, OpenAI's published rule for GPT-4o-class models: ``detail="low"`` costs 85 tokens;
``"high"`` (and ``"auto"``, which may pick high, so a reservation must assume it) scales the
image to fit 2048 x 2048, then its shortest side down to 768, and costs 85 + 170 per 512-pixel
tile. A remote image's size is unknown here, so it is charged the most any image can cost
(85 + 170 * 8 = 1,445 tokens at high detail).
"""

from __future__ import annotations

import base64
import math
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import FileRefusedError, InvalidInputError
from ...file_policy import FilePolicy, policy_in_force
from ..cells import kind_of_value

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024  # OpenAI's limit per image
IMAGE_DETAILS = ("auto", "low", "high")
LOW_DETAIL_TOKENS = 85
TILE_TOKENS = 170
_TILE = 512
_FIT = 2048
_SHORT_SIDE = 768
# The most tiles any image can have after the two scalings (768 x 2048: 2 x 4 tiles).
MAX_HIGH_DETAIL_TOKENS = LOW_DETAIL_TOKENS + TILE_TOKENS * 8

_PNG = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC (its length, 0, comes before)


@dataclass(frozen=True, slots=True)
class ImagePart:
    """One image as sent: the content part and the prompt tokens it costs at most."""

    part: dict[str, Any]
    tokens: int


def image_parts(value: Any, column: str, detail: str, max_bytes: int,
                policy: FilePolicy | None = None) -> list[ImagePart]:
    """A cell's image(s) as content parts; raises InvalidInputError with the reason. Paths and
    URLs follow ``policy``, by default the one in force (the rendering task's)."""
    if policy is None:
        policy = policy_in_force()
    if hasattr(value, "tolist") and not isinstance(value, bytes | bytearray):
        value = value.tolist()  # a numpy array of images (an Arrow list column)
    if isinstance(value, list | tuple):
        if not value:
            raise InvalidInputError(f"column '{column}' holds an empty list of images")
        return [_one(item, f"{column}[{i}]", detail, max_bytes, policy)
                for i, item in enumerate(value)]
    return [_one(value, column, detail, max_bytes, policy)]


def _one(value: Any, where: str, detail: str, max_bytes: int, policy: FilePolicy) -> ImagePart:
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(
            value).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        raise InvalidInputError(f"column '{where}' is null")
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes | bytearray):
        return _from_bytes(bytes(value), where, detail, max_bytes)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidInputError(
            f"column '{where}' holds {kind_of_value(value)}; an image cell holds bytes, a "
            "file path or an http(s) URL")
    if value.startswith(("http://", "https://")):
        if not policy.allow_urls:
            raise InvalidInputError(
                f"column '{where}': image URLs are not sent here (allow_image_urls=False); "
                "give the image's bytes or a path under files_roots")
        tokens = LOW_DETAIL_TOKENS if detail == "low" else MAX_HIGH_DETAIL_TOKENS
        return ImagePart(_part(value, detail), tokens)
    if value.startswith("data:"):
        return _from_bytes(_decode_data_uri(value, where, max_bytes), where, detail, max_bytes)
    try:
        raw = policy.read(value, max_bytes=max_bytes, limit_name="max_image_bytes")
    except FileRefusedError as exc:
        raise FileRefusedError(f"column '{where}': image {exc.message}") from None
    return _from_bytes(raw, where, detail, max_bytes)


def _decode_data_uri(uri: str, where: str, max_bytes: int) -> bytes:
    header, comma, data = uri.partition(",")
    if not comma or ";base64" not in header.lower():
        raise InvalidInputError(f"column '{where}': a data: URI must be base64-encoded")
    if len(data) * 3 // 4 > max_bytes + 2:
        raise _too_big(where, len(data) * 3 // 4, max_bytes)
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        raise InvalidInputError(f"column '{where}': the data: URI is not valid base64") from None


def _from_bytes(raw: bytes, where: str, detail: str, max_bytes: int) -> ImagePart:
    if len(raw) > max_bytes:
        raise _too_big(where, len(raw), max_bytes)
    if not raw:
        raise InvalidInputError(f"column '{where}': the image is empty (0 bytes)")
    mime = sniff_mime(raw)
    if mime is None:
        raise InvalidInputError(  # its first bytes are not shown: they may be anyone's secret
            f"column '{where}': unsupported image format (its first bytes are no PNG, JPEG, "
            "WebP or GIF signature); supported: PNG, JPEG, WebP, GIF")
    width, height = image_size(raw, mime, where)
    tokens = image_tokens(width, height, detail)
    uri = f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
    return ImagePart(_part(uri, detail), tokens)


def _too_big(where: str, size: int, limit: int) -> InvalidInputError:
    return InvalidInputError(f"column '{where}': image of {size} bytes is over the limit of "
                             f"{limit} bytes (max_image_bytes)")


def _part(url: str, detail: str) -> dict[str, Any]:
    # "auto" is OpenAI's default: left out, so a request without detail keeps its key.
    image_url = {"url": url} if detail == "auto" else {"url": url, "detail": detail}
    return {"type": "image_url", "image_url": image_url}


def sniff_mime(raw: bytes) -> str | None:
    """The MIME type the bytes' signature names, or None for anything else."""
    if raw.startswith(_PNG):
        return "image/png"
    if raw.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if raw.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(raw: bytes, mime: str, where: str = "image") -> tuple[int, int]:
    """(width, height) from the header, after checking the file is whole."""
    try:
        size = _READERS[mime](raw)
    except (struct.error, IndexError, ValueError) as exc:
        raise InvalidInputError(
            f"column '{where}': the {mime} image is corrupt or truncated ({exc})") from None
    if size is None or size[0] <= 0 or size[1] <= 0:
        raise InvalidInputError(
            f"column '{where}': the {mime} image is corrupt or truncated (no valid size in its "
            "header)")
    return size


def _png_size(raw: bytes) -> tuple[int, int] | None:
    if raw[12:16] != b"IHDR" or not raw.rstrip(b"\x00").endswith(_PNG_END):
        raise ValueError("no IHDR chunk first or no IEND chunk last")
    return struct.unpack(">II", raw[16:24])


def _gif_size(raw: bytes) -> tuple[int, int] | None:
    if not raw.rstrip(b"\x00").endswith(b";"):
        raise ValueError("no GIF trailer")
    return struct.unpack("<HH", raw[6:10])


def _webp_size(raw: bytes) -> tuple[int, int] | None:
    (riff_size,) = struct.unpack("<I", raw[4:8])
    if len(raw) < riff_size + 8:
        raise ValueError("shorter than its RIFF header declares")
    kind = raw[12:16]
    if kind == b"VP8X":
        width = int.from_bytes(raw[24:27], "little") + 1
        return width, int.from_bytes(raw[27:30], "little") + 1
    if kind == b"VP8L":
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 ":
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise ValueError("an unknown WebP chunk")


# JPEG start-of-frame markers (baseline, progressive, ...; not DHT C4, JPG C8 or DAC CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    if raw.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        raise ValueError("no end-of-image marker")
    i = 2
    while i + 4 <= len(raw):
        if raw[i] != 0xFF:
            raise ValueError("a segment without its marker")
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        (length,) = struct.unpack(">H", raw[i + 2:i + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", raw[i + 5:i + 9])
            return width, height
        i += 2 + length
    return None


_READERS = {"image/png": _png_size, "image/gif": _gif_size, "image/webp": _webp_size,
            "image/jpeg": _jpeg_size}


def image_tokens(width: int, height: int, detail: str) -> int:
    """OpenAI's prompt-token cost of one image (see the module docstring)."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    scale = min(1.0, _FIT / max(width, height))
    width, height = width * scale, height * scale
    scale = min(1.0, _SHORT_SIDE / min(width, height))
    width, height = width * scale, height * scale
    tiles = math.ceil(round(width, 6) / _TILE) * math.ceil(round(height, 6) / _TILE)
    return LOW_DETAIL_TOKENS + TILE_TOKENS * tiles


def image_columns(images: str | Sequence[str] | None) -> tuple[str, ...]:
    """The call's ``images`` field as a tuple of column names (empty for none). A name may be
    written as the prompt writes a column, ``"{page}"``: it is the same column."""
    if images is None:
        return ()
    names = (images,) if isinstance(images, str) else tuple(images)
    if not all(isinstance(name, str) and name for name in names):
        raise InvalidInputError("images must be a column name or a list of column names")
    columns = []
    for name in names:
        braced = _BRACED_COLUMN.fullmatch(name)
        if braced:
            name = braced.group(1)
        elif "{" in name or "}" in name:
            raise InvalidInputError(
                f"images={name!r}: images= names columns (images='page' or images='{{page}}'), "
                "each cell an image or a list of images; it is not a template")
        columns.append(name)
    return tuple(dict.fromkeys(columns))


_BRACED_COLUMN = re.compile(r"\{\s*([^{}]+?)\s*\}")
