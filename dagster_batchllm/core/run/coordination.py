"""Everything one run does with the other runs that share its endpoints and its ledger.

:class:`~.coordination.RunCoordinator` is the database side (who is live, what each claims);
this is the run's side of it, so the engine makes a few calls and knows nothing of heartbeats:

* ``join``: register, and when others are sending, wait a heartbeat so they shrink first;
* ``heartbeat_loop``: renew, and hand the pool this run's part of each endpoint as ONE
  :class:`~.pool.Allocation` (shares, rate limits and in-flight capacities together);
* ``claim`` / ``release``: keep two runs from paying for one request; requests another run has
  claimed are *parked* and ``send_parked`` waits for their answers (or sends them after all);
* ``leave``: end the registration and give the pool its endpoints whole again.

A failing coordination database never fails the run: heartbeats keep the last shares, a failed
claim sends the requests anyway (the worst outcome is paying twice), claims end when it leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ..delivery.pool import Allocation, EndpointPool
from ..ledger.table import Ledger
from ..settings import InferenceSettings
from .coordinator import RunCoordinator

_WARN_EVERY_S = 10.0  # while heartbeats fail, one warning per this many seconds
Item = TypeVar("Item")  # what the run waits for per parked request (the engine's KeyState)


class RunCoordination(Generic[Item]):
    def __init__(self, coordinator: RunCoordinator, pool: EndpointPool, *, interval_s: float,
                 log: Any):
        self.coordinator = coordinator
        self.pool = pool
        self.interval_s = interval_s
        self.log = log
        # request key -> item, for requests another live run is sending: waited for
        self.parked: dict[str, Item] = {}

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
        self = cls(coordinator, pool, interval_s=settings.coordination_interval_s, log=log)
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
                                       pool.in_flight())
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

    async def claim(self, keys: list[str]) -> set[str]:
        """Claim requests for this run; return those another live run is sending."""
        try:
            return await asyncio.to_thread(self.coordinator.claim, keys)
        except Exception as exc:  # without claims the worst outcome is paying twice
            self.log.warning(f"batchllm: claiming requests failed, sending them anyway: "
                             f"{type(exc).__name__}: {exc}")
            return set()

    def release_in(self, conn: Any, keys: list[str]) -> None:
        """End the claims on requests whose outcomes ``conn``'s transaction writes (the
        ledger writer's): other runs may use them once it commits. A failure fails that
        write, which is retried with its records."""
        self.coordinator.release(keys, conn)

    def park(self, key: str, item: Item) -> None:
        """Wait for ``key``, which another live run is sending, instead of sending it."""
        self.parked[key] = item

    async def send_parked(self, answer_from_ledger: Callable[[dict[str, Item]], Awaitable[None]],
                          send: Callable[[Item], Awaitable[None]]) -> None:
        """Wait for the requests other runs were sending: ``answer_from_ledger`` answers (and
        removes from the dict it is given) those whose outcome they have written; ``send``
        sends those whose run failed, deferred or dropped them after all."""
        while self.parked:
            await asyncio.sleep(self.interval_s)
            held = await self.claim(list(self.parked))  # claim first: an answer is written
            await answer_from_ledger(self.parked)  # before its claim ends, so this sees it
            for key in [k for k in self.parked if k not in held]:
                await send(self.parked.pop(key))

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
