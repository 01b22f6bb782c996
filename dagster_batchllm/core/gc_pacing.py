"""Fewer cyclic garbage collections while runs are going: a run's own objects are not garbage.

A run makes several small container objects per row (its request, its state, its record),
most of which live until the row settles, and the rows' outputs stay for the whole run. At
Python's default thresholds (700, 10, 10) the collector then walks those live objects again
and again: about a tenth of the client CPU per row (measured on 30,000 embeddings, and a fifth
on in-process MLflow scoring). None of them makes reference cycles, so collecting less often
frees nothing later than it would have been freed.

While at least one run is active in the process the thresholds are raised to at least
:data:`RUN_THRESHOLDS`; when the last run ends they are put back as they were (a caller that
changed them meanwhile keeps its own values). Reference counting, which frees almost
everything, is not affected.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

RUN_THRESHOLDS = (100_000, 50, 100)

_lock = threading.Lock()
_active = 0
_saved: tuple[int, int, int] | None = None
_raised: tuple[int, int, int] | None = None


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's thresholds for the length of the block (nestable, and shared by
    the runs of all threads: the first to enter raises them, the last to leave restores)."""
    global _active, _saved, _raised
    with _lock:
        if _active == 0:
            _saved = gc.get_threshold()
            _raised = tuple(max(now, run) for now, run in zip(_saved, RUN_THRESHOLDS, strict=True))
            gc.set_threshold(*_raised)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                if gc.get_threshold() == _raised:  # not changed by anyone else meanwhile
                    gc.set_threshold(*_saved)
                _saved = _raised = None
