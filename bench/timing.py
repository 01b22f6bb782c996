"""Wall time and client CPU of a measured call, and the per-row figures the tables print."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(run: Callable[[], dict | None]) -> dict:
    """``run()``'s figures with its ``wall_s`` and ``cpu_s`` (``time.process_time``: every
    thread of this process, a ledger writer's too)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    figures = run() or {}
    return {"wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0,
            **figures}


def per_row(figures: dict) -> tuple[float, float]:
    """Rows per second and client CPU milliseconds per row of ``timed`` figures with ``rows``."""
    return figures["rows"] / figures["wall_s"], 1000 * figures["cpu_s"] / figures["rows"]
