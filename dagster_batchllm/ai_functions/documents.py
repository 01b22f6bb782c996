"""``ai_parse_document(content)``: a PDF's text layer as a SQL value, without a model.

Like Databricks' ``ai_parse_document``, it takes the document's bytes (a BLOB / BINARY column,
as ``read_blob`` gives) or, here, a path to the file (a STRING). It returns
``PARSED_DOCUMENT``::

    STRUCT<page_count: INT, pages: ARRAY<STRUCT<page: INT, text: STRING, width: INT,
           height: INT>>, text: STRING, error: STRING>

``text`` is the pages' text joined by form feeds (``\\f``); ``width``/``height`` are the page
size in pixels at 72 dpi. A document that cannot be read (encrypted, corrupt, not a PDF, a
missing file) fails alone: its ``error`` says why and the other fields are NULL, as
Databricks reports ``error_status`` instead of failing the query. A path is read only as the
settings' file policy allows (:mod:`dagster_batchllm.core.file_policy`: a regular file under
``files_roots``, by default the working directory when the row is read); any other path is
that row's ``error``, the file never opened. A NULL input gives NULL. A
scanned page has no text layer (its ``text`` is ``""``): a vision model has to read its image
(``infer(..., images=...)`` with the pages rendered by
:func:`dagster_batchllm.documents.parse_document`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..core import FilePolicy
from ..documents import DocumentError, parse_document
from .types import STRING, SQLType, struct

if TYPE_CHECKING:
    from ..core import InferenceSettings

NAME = "ai_parse_document"
SUMMARY = "A PDF's pages and text layer (no model): STRUCT<page_count, pages, text, error>."
INT = SQLType("INT")
PAGE = struct(page=INT, text=STRING, width=INT, height=INT)
PARSED_DOCUMENT = struct(page_count=INT, pages=SQLType("ARRAY", (PAGE,)), text=STRING,
                         error=STRING)
PAGE_SEPARATOR = "\f"


def parse_document_value(content: Any, settings: InferenceSettings | None = None
                         ) -> dict[str, Any] | None:
    """One row's ``PARSED_DOCUMENT`` as a dict (None for a NULL input); a path is read as
    ``settings``' file policy allows (None: the default policy)."""
    if content is None:
        return None
    if isinstance(content, str) and not content.strip():
        return _failed("the path is empty")
    try:
        pages = parse_document(os.fsdecode(content) if isinstance(content, str) else content,
                               render=False, policy=FilePolicy.of(settings))
    except DocumentError as exc:
        return _failed(str(exc))
    return {"page_count": len(pages),
            "pages": [{"page": p.number, "text": p.text, "width": p.width, "height": p.height}
                      for p in pages],
            "text": PAGE_SEPARATOR.join(p.text for p in pages),
            "error": None}


def _failed(reason: str) -> dict[str, Any]:
    return {"page_count": None, "pages": None, "text": None, "error": reason}
