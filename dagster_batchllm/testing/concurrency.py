"""Threads and processes in tests: calls run at once on threads, a process killed at a chosen
point of its work."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

from ..simulator.clients import wait_until

K = TypeVar("K", bound=Hashable)


def run_on_threads(fn: Callable[[K], Any], args: Iterable[K], *,
                   timeout_s: float = 120.0) -> dict[K, Any]:
    """``fn(arg)`` for every ``arg`` at once, a thread each; ``{arg: result}`` once all have
    ended. The first error of any is raised here (after all have ended), as is an
    AssertionError for a thread still running after ``timeout_s``."""
    results: dict[K, Any] = {}
    errors: list[BaseException] = []

    def run(arg: K) -> None:
        try:
            results[arg] = fn(arg)
        except BaseException as exc:  # raised below, on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(arg,), daemon=True) for arg in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in threads), f"a call still runs after {timeout_s} s"
    if errors:
        raise errors[0]
    return results


def sigkill_when(proc: subprocess.Popen, condition: Callable[[], bool], timeout_s: float,
                 what: str) -> None:
    """Wait until ``condition()`` holds (an AssertionError naming ``what`` after ``timeout_s``,
    or with the process's output if it ends first), then SIGKILL ``proc``; it is reaped
    whatever happens."""
    try:
        wait_until(lambda: proc.poll() is not None or condition(), timeout_s, what)
        assert proc.poll() is None, f"the process ended before {what}: {_output(proc)}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _output(proc: subprocess.Popen) -> str:
    parts = [p.decode(errors="replace") if isinstance(p, bytes) else p
             for p in proc.communicate() if p]
    return "".join(parts)[-3000:]
