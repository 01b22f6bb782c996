"""The Spark binding that ``ai_query_col``, ``infer_grouped`` and ``embed_col`` use when they
are not passed one: the one ``register_ai_functions`` activated last.

The DataFrame API (:mod:`.columns`, :mod:`.grouped`, :mod:`.embeddings`) sits below
:class:`~dagster_batchllm.spark.session.SparkAI`, whose own methods call it: so it knows the
binding only as the :class:`SparkBinding` protocol here, what it reads of one, and never imports
the session module.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..core import InferenceConfigError, InferenceSettings


class SparkBinding(Protocol):
    """What the DataFrame API reads of a :class:`~dagster_batchllm.spark.session.SparkAI`."""

    settings: InferenceSettings
    worker_settings: InferenceSettings
    token_budget: int | None
    partition_key: str
    run_id: str
    scope: str

    def check_model(self, name: str, where: str = "ai_query") -> str: ...

    def job(self, *, fail_on_error: bool, **kwargs: Any) -> Any: ...


_active: SparkBinding | None = None


def activate(ai: SparkBinding) -> SparkBinding:
    """Make ``ai`` the one calls without ``ai=`` use; returns it."""
    global _active
    _active = ai
    return ai


def active_ai() -> SparkBinding:
    """The active binding; a clear error when none was registered."""
    if _active is None:
        raise InferenceConfigError(
            "No inference settings are registered with Spark: call "
            "register_ai_functions(spark, llm) first, or pass ai=SparkAI(spark, llm)."
        )
    return _active
