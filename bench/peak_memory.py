"""Resident memory of this process, for the benchmarks that measure it in a subprocess
(``bench.child``).

``getrusage().ru_maxrss`` is the wrong peak there: Linux keeps it across ``exec``, so a child
started by a large parent (one that has just held a 100,000-row table) reports the parent's
size, not its own. ``VmHWM`` in ``/proc/self/status`` belongs to the process image: it starts
again at exec.
"""

from __future__ import annotations

import os


def peak_resident_bytes() -> int:
    """This process image's peak resident set size, in bytes (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")


def peak_resident_mib() -> float:
    return peak_resident_bytes() / (1024 * 1024)


def resident_bytes() -> int:
    """This process's resident set size now, in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
