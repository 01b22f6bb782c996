"""Table cells as prompt text and as chat messages: what a cell may hold, and why not."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInputError


def cell_text(value: Any, column: str, as_text: bool = False) -> str:
    """A cell as prompt text. Only text is text unless the call says ``cells_as_text``: a
    number or a byte string where a prompt expected text is usually the wrong column."""
    if type(value) is str and value and not value.isspace():  # the usual cell, first (per row)
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise InvalidInputError(f"column '{column}' is null")
    if isinstance(value, str):
        text = value
    elif _is_missing(value) or _is_na(value):
        raise InvalidInputError(f"column '{column}' is null")
    elif not _has_text_form(value):
        raise InvalidInputError(f"column '{column}' holds {kind_of_value(value)}, not text")
    elif not as_text:
        raise InvalidInputError(
            f"column '{column}' holds {kind_of_value(value)}, not text; convert the column "
            f"(df['{column}'].astype(str)) or pass cells_as_text=True")
    elif isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"column '{column}' holds bytes that are not UTF-8") from None
    else:
        text = str(value)
    if not text.strip():
        raise InvalidInputError(f"column '{column}' is empty")
    return text


def _has_text_form(value: Any) -> bool:
    """Numbers, booleans, timestamps and bytes, which ``cells_as_text`` may render."""
    return (isinstance(value, bytes | bytearray | bool | int | float)
            or type(value).__module__ == "numpy" or hasattr(value, "isoformat"))


def kind_of_value(value: Any) -> str:
    """What a cell holds, in words for a message: "bytes", "an int", "a float", ..."""
    if isinstance(value, bytes | bytearray):
        return "bytes"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _is_na(value: Any) -> bool:
    try:
        import pandas as pd

        return pd.isna(value) is True
    except (TypeError, ValueError):
        return False


def _is_missing(value: Any) -> bool:
    try:
        return bool(value != value)  # NaN and NaT are not equal to themselves
    except (TypeError, ValueError):
        return False


def messages_from_cell(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidInputError("the messages cell is a string but not JSON") from None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInputError("the messages cell must be a non-empty list of {role, content}")
    messages = []
    for item in value:
        if not isinstance(item, Mapping) or "role" not in item or "content" not in item:
            raise InvalidInputError("each message needs 'role' and 'content'")
        content = item["content"]
        if content is None or (isinstance(content, str) and not content.strip()):
            raise InvalidInputError(f"a '{item['role']}' message has empty content")
        messages.append({"role": str(item["role"]), "content": content})
    return messages
