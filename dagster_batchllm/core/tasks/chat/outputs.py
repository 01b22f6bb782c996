"""Reading a chat reply into the row's value: text as it is, or JSON checked against a schema.

A call with ``response_format`` asks for structured output; its replies must be valid JSON and,
when a schema is given, match it, or the row fails with ``invalid_structured_output`` (a reply
that fails is kept in the ledger for inspection). The schema's validator is built once per run:
building one costs more than checking a reply with it. A reply that was cut off at
``max_tokens`` is the usual reason for broken JSON, so its error says so.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import StructuredOutputError


class ReplyParser:
    """The values of one call's replies (one instance per run)."""

    def __init__(self, *, structured: bool, schema: dict[str, Any] | None):
        self.structured = structured
        self._validator: Any = None
        if structured and schema is not None:
            import jsonschema

            self._validator = jsonschema.Draft202012Validator(schema)

    def parse(self, content: str) -> Any:
        """The value of a reply's content; ``StructuredOutputError`` when it is not usable."""
        if not self.structured:
            return content
        try:
            value = json.loads(content)
        except ValueError:
            raise StructuredOutputError(
                f"the reply is not valid JSON: {content[:120]!r}"
            ) from None
        if self._validator is not None:
            import jsonschema

            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "(root)"
                raise StructuredOutputError(
                    f"the reply does not match the schema at {where}: {error.message[:200]}"
                )
        return value


def cut_off_hint(error: StructuredOutputError, *, finish_reason: str | None,
                 max_tokens: int) -> StructuredOutputError:
    """``error``, told that the reply stopped at ``max_tokens`` when it did."""
    if finish_reason != "length":
        return error
    return StructuredOutputError(
        f"{error.message} (the reply was cut off at max_tokens={max_tokens}; raise max_tokens)")
