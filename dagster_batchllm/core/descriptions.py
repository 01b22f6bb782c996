"""Dataclass fields that carry their description, for the plain-data specs (settings, an
endpoint, a price): the Dagster config that mirrors a spec reads each field's default and
description from it, so they are written once."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

# The key of a field's description in its dataclass metadata.
DESCRIPTION = "description"


def described(description: str, default: Any = MISSING, **options: Any) -> Any:
    """A dataclass field with its description in ``metadata["description"]``, where the
    Dagster config that mirrors it reads it (so a default or description is written once)."""
    return field(default=default, metadata={DESCRIPTION: description}, **options)


__all__ = ["DESCRIPTION", "described"]
