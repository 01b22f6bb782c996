"""The sync doors: a coroutine (a run, an operator over many runs) run to completion from code
that is not async, and stopped cleanly when the caller is.

Every sync method of the client, the SQL runtime, Spark's workers and the semantic operators
come through :func:`run_sync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

Result = TypeVar("Result")

# How long a stopping run may take to write its answers before the stop goes through anyway.
_STOP_WAIT_S = 4.0


def run_sync(coro: Coroutine[Any, Any, Result]) -> Result:
    """Run a coroutine to completion from sync code, also inside a running loop (notebooks).

    A stop reaches the coroutine as a cancellation, so it writes what was answered and lets go
    of what it holds before the caller sees the stop: Ctrl-C (KeyboardInterrupt, Dagster's run
    termination too) and, where nobody else handles it, SIGTERM (the process then still ends
    as SIGTERM says, once the coroutine has stopped). Inside a running loop the coroutine runs
    on a thread of its own, which a KeyboardInterrupt in the caller's thread cancels.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_a_loop = False
    else:
        in_a_loop = True
    # Decided outside the except block above: an error of the coroutine raised in it would
    # carry "RuntimeError: no running event loop" as its context in every traceback.
    if in_a_loop:
        return _run_on_thread(coro)
    with asyncio.Runner() as runner:
        task = runner.get_loop().create_task(coro)
        with _sigterm_cancels(task):
            return runner.run(_await(task))


def _run_on_thread(coro: Coroutine[Any, Any, Result]) -> Result:
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def target() -> None:
        try:
            with asyncio.Runner() as runner:
                outcome["loop"] = runner.get_loop()
                outcome["task"] = runner.get_loop().create_task(coro)
                started.set()
                outcome["value"] = runner.run(_await(outcome["task"]))
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=target, name="batchllm-infer", daemon=True)
    thread.start()
    try:
        thread.join()
    except BaseException:
        # The caller's thread was interrupted: stop the run (it writes what was answered),
        # wait for it a bounded time, then let the interrupt through.
        started.wait(_STOP_WAIT_S)
        if "task" in outcome:
            outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        thread.join(_STOP_WAIT_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _await(task: asyncio.Task) -> Any:
    return await task


@contextlib.contextmanager
def _sigterm_cancels(task: asyncio.Task):
    """While ``task`` runs in the main thread, SIGTERM cancels it (where SIGTERM would
    otherwise kill the process on the spot, losing what was answered); once it has stopped,
    the process ends by SIGTERM after all. Where someone else handles SIGTERM (Dagster turns
    it into a KeyboardInterrupt), their handler stays."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    received: list[int] = []
    loop = task.get_loop()

    def on_sigterm(signum: int, _frame: Any) -> None:
        received.append(signum)
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)  # wake the loop if it is waiting in select

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if received:
            os.kill(os.getpid(), signal.SIGTERM)


