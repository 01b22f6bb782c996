"""Measurements in a fresh subprocess: a new interpreter holds nothing from the parent (its
imports, its tables), so its peak memory and CPU are the measurement's own.

A script hands its measuring function to ``serve_child`` in its ``__main__`` block, and its
parent runs it with ``run_child``::

    def measure(rows: int) -> dict: ...

    run_child("bench.images", rows=1000)  # python -m bench.images --child '{"rows": 1000}'

    if __name__ == "__main__" and not serve_child(measure):
        main()
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root: ``bench`` imports from it


def run_child(module: str, *, timeout_s: float = 3600, **kwargs) -> dict:
    """``module``'s measuring function called with ``kwargs`` (JSON values) in a fresh
    interpreter started from the repository root; the dict it returned."""
    proc = subprocess.run([sys.executable, "-m", module, "--child", json.dumps(kwargs)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} --child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def serve_child(measure: Callable[..., dict]) -> bool:
    """In a process ``run_child`` started: print ``measure(**kwargs)`` as JSON and say True;
    in any other, False (and do nothing)."""
    if sys.argv[1:2] != ["--child"]:
        return False
    print(json.dumps(measure(**json.loads(sys.argv[2]))))
    return True
