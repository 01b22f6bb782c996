"""Everything one run does with the other runs that share its endpoints and its ledger.

:class:`~.coordination.RunCoordinator` is the database side (who is live, what each claims);
this is the run's side of it, so the engine makes a few calls and knows nothing of heartbeats:

* ``join``: register, and when others are sending, wait a heartbeat so they shrink first;
* ``heartbeat_loop``: renew, and hand the pool this run's part of each endpoint as ONE
  :class:`~.pool.Allocation` (shares, rate limits and in-flight capacities together);
* ``claim`` / ``release``: keep two runs from paying for one request; requests another run has
  claimed are *parked* and ``send_parked`` waits for their answers (or sends them after all);
* ``leave``: end the registration and give the pool its endpoints whole again.

A busy or failing coordination database never makes a run pay twice: heartbeats keep the last
shares, and a claim that fails (a deadlock, a lock timeout, the database away) is retried, with
sending paused meanwhile, never skipped; a claim that keeps failing for ``ledger_outage_s`` (the
bound of a ledger outage) fails the run, as a ledger that cannot be written does. Claims end
when the run leaves.

Claims are taken a slice at a time, just before the slice is sent (``claim_slice``), not a
chunk of thousands of rows at once: runs over the same rows then claim different slices and
all send, instead of one sending everything while the others wait for its answers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ..delivery.pool import Allocation, EndpointPool
from ..errors import ClaimsUnavailableError, LedgerUnwritable
from ..ledger.stores import redact_url
from ..ledger.table import Ledger
from ..ledger.writer import database_away
from ..settings import InferenceSettings
from .coordinator import RunCoordinator

_WARN_EVERY_S = 10.0  # while heartbeats or claims fail, one warning per this many seconds
# A claim that failed is retried after a short, growing, jittered pause: a deadlock's loser
# goes again at once (the winner has committed by then), an outage is not hammered.
_CLAIM_RETRY_FIRST_S = 0.02
_CLAIM_RETRY_MAX_S = 2.0
# Failures that waiting does not fix (a bad statement, a permission) stop the run after this
# many in a row, as the ledger writer's do.
_MAX_OTHER_CLAIM_FAILURES = 5
# Requests claimed at a time: about what the run sends at once, so runs over the same rows
# take different slices (see the module's docstring).
_MIN_CLAIM_SLICE = 64
Item = TypeVar("Item")  # what the run waits for per parked request (the engine's KeyState)


class RunCoordination(Generic[Item]):
    def __init__(self, coordinator: RunCoordinator, pool: EndpointPool, *, interval_s: float,
                 log: Any, outage_s: float = 120.0, where: str = "the ledger database"):
        """``outage_s``: how long claims may keep failing (sending paused) before the run
        fails; ``where``: the database, as errors name it (password redacted)."""
        self.coordinator = coordinator
        self.pool = pool
        self.interval_s = interval_s
        self.log = log
        self.outage_s = outage_s
        self.where = where
        # request key -> item, for requests another live run is sending: waited for
        self.parked: dict[str, Item] = {}
        # Awaited after a claim took over requests of a run that is gone and before the
        # caller looks them up: folds that run's journal into the ledger (the engine sets it).
        self.before_takeover: Callable[[], Awaitable[Any]] | None = None
        # False while the run only waits for parked requests: its share of each endpoint
        # goes to the runs that send them (see RunCoordinator.heartbeat).
        self.sending = True
        # Why the ledger writer gave up on the database, if it has (the engine sets it): the
        # claims share that database, so the claim loop stops then instead of waiting out an
        # outage clock of its own that started later.
        self.writer_gave_up: Callable[[], Exception | None] = lambda: None

    @classmethod
    async def join(cls, settings: InferenceSettings, ledger: Ledger, pool: EndpointPool, *,
                   description: str, log: Any) -> RunCoordination | None:
        """Join the runs sharing ``ledger``'s database; None when this run coordinates with
        none (``coordinate_runs`` off, or an in-memory ledger no other process sees)."""
        if not settings.coordinate_runs or ledger.in_memory:
            return None
        endpoints = settings.endpoints
        limited = [e for e in endpoints if e.requests_per_minute or e.tokens_per_minute]
        coordinator = await asyncio.to_thread(
            RunCoordinator, ledger.engine, ledger.table, [e.name for e in endpoints],
            stale_after_s=max(10.0, 20 * settings.coordination_interval_s),
            description=description,
            rate_limits={e.name: tuple(
                per_minute * e.rate_limit_window_s / 60.0 if per_minute else None
                for per_minute in (e.requests_per_minute, e.tokens_per_minute)) for e in limited},
            window_s=max((e.rate_limit_window_s for e in limited), default=0.0),
            group=pool.group,
            max_concurrency={e.name: e.max_concurrency for e in endpoints},
        )
        self = cls(coordinator, pool, interval_s=settings.coordination_interval_s, log=log,
                   outage_s=settings.ledger_outage_s, where=redact_url(ledger.url))
        runs = await self.heartbeat()
        if any(n > 1 for n in runs.values()):
            # Let the runs already sending see us and shrink before we start, then count again:
            # runs that joined while we waited shrink our share too (else it is stale until our
            # first heartbeat, and the runs together exceed the endpoint's limits).
            await asyncio.sleep(self.interval_s * 1.5)
            await self.heartbeat()
        return self

    async def heartbeat(self) -> dict[str, int]:
        """Renew this run's registration and apply its allocation; live runs per endpoint."""
        coordinator, pool = self.coordinator, self.pool
        runs = await asyncio.to_thread(coordinator.heartbeat, pool.window_usage(),
                                       pool.in_flight(), sending=self.sending)
        pool.allocate(Allocation(runs=runs, rate_limits=coordinator.limits,
                                 capacities=coordinator.capacities))
        return runs

    async def heartbeat_loop(self) -> None:
        failing = 0  # heartbeats failed in a row: an outage warns once, not 4 times a second
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.heartbeat()
                failing = 0
            except Exception as exc:  # a busy database delays a heartbeat; shares stay as they are
                if failing % max(1, round(_WARN_EVERY_S / self.interval_s)) == 0:
                    self.log.warning(f"batchllm: run coordination heartbeat failed"
                                     f"{f' ({failing + 1} in a row)' if failing else ''}: "
                                     f"{type(exc).__name__}: {str(exc)[:300]}")
                failing += 1

    def claim_slice(self, capacity: int) -> int:
        """How many requests the run claims at a time, for a delivery of ``capacity``."""
        return max(_MIN_CLAIM_SLICE, capacity)

    async def claim(self, keys: list[str], *, clock: Callable[[], float] = time.monotonic
                    ) -> set[str]:
        """Claim requests for this run; return those another live run is sending.

        Retried until it succeeds (nothing is sent meanwhile: the caller sends only what it
        claimed); past ``outage_s`` of failures, or after a few failures that waiting does not
        fix, raises :class:`ClaimsUnavailableError`."""
        failing_since: float | None = None
        warned_at = float("-inf")
        others = 0
        pause = _CLAIM_RETRY_FIRST_S
        while True:
            taken_over = self.coordinator.taken_over
            try:
                held = await asyncio.to_thread(self.coordinator.claim, keys)
            except Exception as exc:
                now = clock()
                if failing_since is None:
                    failing_since = now
                down_s = now - failing_since
                others = 0 if database_away(exc) else others + 1
                reason = f"{type(exc).__name__}: {str(exc)[:300]}"
                given_up = self.writer_gave_up()
                if isinstance(given_up, LedgerUnwritable):
                    raise given_up from exc
                if given_up is not None:
                    raise ClaimsUnavailableError(
                        f"not sent: the ledger cannot be written ({given_up})") from exc
                if others >= _MAX_OTHER_CLAIM_FAILURES or down_s >= self.outage_s:
                    raise ClaimsUnavailableError(
                        f"the ledger database {self.where} could not be written for "
                        f"{down_s:.0f} s (claiming {len(keys)} requests; last error: "
                        f"{reason}); nothing more was sent, so no request is paid twice; the "
                        "answers received are kept in the journal and written by the next "
                        "run, which sends the rest") from exc
                if down_s >= 1.0 and now - warned_at >= _WARN_EVERY_S:
                    # A deadlock's retry succeeds at once; only a streak is worth a line.
                    warned_at = now
                    self.log.warning(
                        f"batchllm: claiming {len(keys)} requests in {self.where} keeps "
                        f"failing; sending pauses and the claim is retried for up to "
                        f"{self.outage_s:g} s: {reason}")
                await asyncio.sleep(pause * (0.5 + random.random()))
                pause = min(_CLAIM_RETRY_MAX_S, pause * 2)
                continue
            if self.coordinator.taken_over != taken_over and self.before_takeover is not None:
                await self.before_takeover()
            return held

    def release_in(self, conn: Any, keys: list[str]) -> None:
        """End the claims on requests whose outcomes ``conn``'s transaction writes (the
        ledger writer's): other runs may use them once it commits. A failure fails that
        write, which is retried with its records."""
        self.coordinator.release(keys, conn)

    def park(self, key: str, item: Item) -> None:
        """Wait for ``key``, which another live run is sending, instead of sending it."""
        self.parked[key] = item

    async def send_parked(self, answer_from_ledger: Callable[[dict[str, Item]], Awaitable[None]],
                          send: Callable[[Item], Awaitable[None]],
                          idle: Callable[[], bool] = lambda: False) -> None:
        """Wait for the requests other runs were sending: ``answer_from_ledger`` answers (and
        removes from the dict it is given) those whose outcome they have written; ``send``
        sends those whose run failed, deferred or dropped them after all. While ``idle()``
        (the run has nothing of its own queued or in flight) it gives up its share of the
        endpoints to the runs still sending."""
        try:
            while self.parked:
                self.sending = not idle()
                await asyncio.sleep(self.interval_s)
                held = await self.claim(list(self.parked))  # claim first: an answer is written
                await answer_from_ledger(self.parked)  # before its claim ends, so this sees it
                for key in [k for k in self.parked if k not in held]:
                    self.sending = True
                    await send(self.parked.pop(key))
        finally:
            self.sending = True

    async def leave(self) -> None:
        """End this run; its request claims end now, its rate-limit claims once what it sent
        has left the servers' windows. The pool gets its endpoints whole again."""
        try:
            await asyncio.to_thread(self.coordinator.leave, self.pool.window_usage())
        except Exception as exc:  # the registration goes stale, its claims are taken over then
            self.log.warning(f"batchllm: leaving the run coordination failed (its claims end "
                             f"when they go stale): {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            self.pool.allocate(Allocation())
