"""Image parts of chat messages: decoded, validated and fingerprinted, never fetched.

A user message's ``content`` may be a list of parts: ``{"type": "text", "text": ...}`` and
``{"type": "image_url", "image_url": {"url": ...}}``. A ``data:`` URI is decoded and checked
(base64, one of `IMAGE_MIME_TYPES`, bytes that start like one of those formats, at most
``max_image_bytes``); anything else is a 400, as OpenAI answers. An ``http(s)://`` URL is not
fetched (the server reaches no network): it is answered from the URL's SHA-256 and counted as
remote. The responder sees each image as a marker line, ``[image sha256:<12 hex>]`` (or
``[remote image sha256:<12 hex of the URL>]``), so a reply proves which image reached which
request. Each image costs `IMAGE_TOKENS` prompt tokens on top of the text parts' tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from .protocol import Reject

IMAGE_TOKENS = 85  # OpenAI's cost of one low-detail image
IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
_DATA_URI = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)", re.DOTALL)


class ImageReject(Reject):
    """A 400 for a bad image part (counted apart in the image stats)."""

    def __init__(self, message: str, code: str, param: str = "image_url"):
        super().__init__(400, message, code, param)


@dataclass(frozen=True)
class ImagePart:
    sha256: str  # of the decoded bytes, or of the URL for a remote image
    size: int  # decoded bytes; 0 for a remote image
    remote: bool

    @property
    def marker(self) -> str:
        kind = "remote image" if self.remote else "image"
        return f"[{kind} sha256:{self.sha256[:12]}]"


@dataclass
class MessageContent:
    """One message's content: what the responder reads, what costs tokens, and its images."""

    text: str  # text parts and image markers, one per line
    token_text: str  # the text parts only: what text tokens are counted from
    images: list[ImagePart] = field(default_factory=list)


def parse_content(content: Any, role: str, max_image_bytes: int | None) -> MessageContent:
    """A message's content as text plus its images; an ImageReject (400) for a bad image."""
    if isinstance(content, str):
        return MessageContent(content, content)
    if content is None:
        return MessageContent("", "")
    if not isinstance(content, list):
        return MessageContent(str(content), str(content))
    lines, texts, images = [], [], []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            if role != "user":
                raise ImageReject("Image URLs are only allowed for messages with role 'user', but "
                                  f"this message with role '{role}' contains an image URL.",
                                  "invalid_request_error", "messages")
            image = _image(part.get("image_url"), max_image_bytes)
            images.append(image)
            lines.append(image.marker)
        else:  # text parts; other part types count as their "text", as before
            text = str(part.get("text", "")) if isinstance(part, dict) else str(part)
            texts.append(text)
            lines.append(text)
    return MessageContent("\n".join(lines), "\n".join(texts), images)


def _image(spec: Any, max_image_bytes: int | None) -> ImagePart:
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str) or not url:
        raise ImageReject("image_url must be an object with a 'url' string", "invalid_image_url")
    if url.startswith(("http://", "https://")):
        return ImagePart(hashlib.sha256(url.encode()).hexdigest(), 0, remote=True)
    match = _DATA_URI.fullmatch(url)
    if not url.startswith("data:") or match is None:
        raise ImageReject("image_url must be a data: URI or an http(s) URL", "invalid_image_url")
    mime = match["mime"].strip().lower()
    if mime not in IMAGE_MIME_TYPES:
        raise ImageReject(f"Invalid MIME type {mime or '(none)'!r} for an image; supported: "
                          f"{', '.join(IMAGE_MIME_TYPES)}", "invalid_image_format")
    if "base64" not in (p.strip().lower() for p in match["params"].split(";")):
        raise ImageReject("image data URIs must be base64-encoded", "invalid_image_url")
    data = match["data"]
    if max_image_bytes is not None and len(data) * 3 // 4 > max_image_bytes + 2:
        raise _too_big(len(data) * 3 // 4, max_image_bytes)  # refused before decoding it
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageReject(f"image_url data is not valid base64: {exc}",
                          "invalid_image_url") from exc
    if max_image_bytes is not None and len(raw) > max_image_bytes:
        raise _too_big(len(raw), max_image_bytes)
    if not looks_like_image(raw):
        raise ImageReject("You uploaded an unsupported image. Please make sure your image is "
                          "valid.", "invalid_image_format")
    return ImagePart(hashlib.sha256(raw).hexdigest(), len(raw), remote=False)


def _too_big(size: int, limit: int) -> ImageReject:
    return ImageReject(f"image of {size} bytes is over the limit of {limit} bytes",
                       "image_too_large")


def looks_like_image(raw: bytes) -> bool:
    """Whether the bytes start like a PNG, JPEG, GIF or WebP file (what a real server decodes)."""
    return (raw.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a"))
            or (raw[:4] == b"RIFF" and raw[8:12] == b"WEBP"))
