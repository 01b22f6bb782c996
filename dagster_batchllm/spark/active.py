"""The :class:`~.session.SparkAI` that ``ai_query_col`` and ``infer_grouped`` use when they are
not passed one: the one ``register_ai_functions`` activated last.

Kept apart from :mod:`.session` so that the DataFrame API (:mod:`.columns`, :mod:`.grouped`),
which ``SparkAI``'s own methods call, finds it without importing the session module back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import InferenceConfigError

if TYPE_CHECKING:
    from .session import SparkAI

_active: SparkAI | None = None


def activate(ai: SparkAI) -> SparkAI:
    """Make ``ai`` the one calls without ``ai=`` use; returns it."""
    global _active
    _active = ai
    return ai


def active_ai() -> SparkAI:
    """The active SparkAI; a clear error when none was registered."""
    if _active is None:
        raise InferenceConfigError(
            "No inference settings are registered with Spark: call "
            "register_ai_functions(spark, llm) first, or pass ai=SparkAI(spark, llm)."
        )
    return _active
