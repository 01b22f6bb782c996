"""``Cascade``: which small model answers first, which large one decides, and the targets.

One frozen, typed options object for every place a cascade goes: ``llm.filter(...,
cascade=Cascade(...))``, ``llm.classify``, and SQL (``cascade => named_struct('proxy', ...)``
in Spark, ``cascade := {'proxy': ...}`` in DuckDB, JSON text in SQLite: :meth:`Cascade.parse`
reads each). Mistakes raise :class:`InferenceConfigError` before anything is sent.

Example::

    >>> Cascade(proxy="llama-8b", oracle="llama-70b").sample
    500
    >>> Cascade.parse('{"proxy": "llama-8b", "oracle": "llama-70b", "sample": 200}').sample
    200
    >>> Cascade.parse({"proxy": "llama-8b", "oracle": "llama-70b", "delta": 0.01}).delta
    0.01
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from ..core import InferenceConfigError

_EXAMPLE = ("Cascade(proxy='llama-8b', oracle='llama-70b', target_precision=0.9, "
            "target_recall=0.9, sample=500, delta=0.05)")


@dataclasses.dataclass(frozen=True)
class Cascade:
    """Every row to ``proxy`` with its confidence; a seeded random ``sample`` of rows (at most a
    third of the call's distinct rows) also to ``oracle``; thresholds learned on the sample;
    rows between the thresholds to the oracle. ``seed`` picks the sample (the same rows on every
    rerun).

    The guarantee: with probability at least ``1 - delta`` over the sample, the call's
    precision and recall against the oracle's answers meet ``target_precision`` and
    ``target_recall`` (``ai_classify``: its accuracy meets the larger of the two). A smaller
    ``delta`` is surer and sends more rows to the oracle."""

    proxy: str
    oracle: str
    target_precision: float = 0.9
    target_recall: float = 0.9
    sample: int = 500
    seed: int = 0
    delta: float = 0.05

    def __post_init__(self) -> None:
        for name in ("proxy", "oracle"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InferenceConfigError(
                    f"Cascade: '{name}' must name a served model, got {value!r}; e.g. "
                    f"{_EXAMPLE}.")
        if self.proxy == self.oracle:
            raise InferenceConfigError(
                f"Cascade: proxy and oracle are both '{self.proxy}'; a cascade saves only when "
                "a cheaper model answers first. Without a cascade, pass model= instead.")
        for name in ("target_precision", "target_recall"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0.0 < float(value) <= 1.0):
                raise InferenceConfigError(
                    f"Cascade: '{name}' must be a number in (0, 1], got {value!r}.")
            object.__setattr__(self, name, float(value))
        if isinstance(self.delta, bool) or not isinstance(self.delta, int | float) or not (
                0.0 < float(self.delta) < 1.0):
            raise InferenceConfigError(
                f"Cascade: 'delta' (the chance the targets are missed) must be a number in "
                f"(0, 1), such as 0.05, got {self.delta!r}.")
        object.__setattr__(self, "delta", float(self.delta))
        for name, least in (("sample", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InferenceConfigError(
                    f"Cascade: '{name}' must be a whole number >= {least}, got {value!r}.")
            object.__setattr__(self, name, value)

    def check_models(self, served: frozenset[str] | set[str], where: str) -> None:
        """Raise unless the endpoints serve both models."""
        for name in ("proxy", "oracle"):
            if getattr(self, name) not in served:
                raise InferenceConfigError(
                    f"{where}: the cascade's {name} '{getattr(self, name)}' is not served; "
                    f"served models: {sorted(served)}.")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def parse(cls, value: Any, where: str = "cascade") -> Cascade | None:
        """A Cascade from what SQL passes: a struct or map (a dict, a Spark Row), JSON text,
        a Cascade, or NULL (None: no cascade)."""
        if value is None or isinstance(value, Cascade):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InferenceConfigError(
                    f"{where}: the cascade must be a STRUCT or JSON object such as "
                    '{"proxy": "llama-8b", "oracle": "llama-70b"}, got the STRING '
                    f"{value[:60]!r}.") from None
        if hasattr(value, "asDict"):  # a Spark Row
            value = value.asDict()
        if not isinstance(value, Mapping):
            raise InferenceConfigError(
                f"{where}: the cascade must be a STRUCT or JSON object with the fields "
                f"{[f.name for f in dataclasses.fields(cls)]}, got {type(value).__name__}.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(map(str, value)) - names)
        if unknown:
            raise InferenceConfigError(
                f"{where}: unknown cascade field(s) {unknown}; the fields are {sorted(names)}.")
        missing = sorted({"proxy", "oracle"} - {k for k, v in value.items() if v is not None})
        if missing:
            raise InferenceConfigError(f"{where}: the cascade needs {missing}; e.g. {_EXAMPLE}.")
        try:
            return cls(**{str(k): _plain(v) for k, v in value.items() if v is not None})
        except InferenceConfigError as exc:
            raise InferenceConfigError(f"{where}: {exc}") from None


def _plain(value: Any) -> Any:
    """SQL numbers arrive as Decimal (DuckDB and Spark literals such as 0.9), numpy scalars
    from a Spark batch."""
    if hasattr(value, "item") and not isinstance(value, str | int | float):
        value = value.item()
    if type(value).__name__ == "Decimal":
        number = float(value)
        return int(number) if number.is_integer() and "." not in str(value) else number
    return value
