"""How request items reach a model: the :class:`Delivery` interface and the online one.

The engine hands a delivery one request at a time and gets back the reply or the request's
final error; what happens in between (which endpoint, how many attempts, how long to wait) is
the delivery's business, so a new way of sending is a new implementation, not branches through
the run. :class:`OnlineDelivery` sends each request over HTTP now: a lease from the endpoint
pool, the transport's call, the lease back, and the retry loop of :mod:`.retries` around them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from .errors import ContextLengthExceededError, EndpointError, RowError, UnsupportedModelError
from .ledger_writer import LedgerWriter
from .pool import EndpointPool
from .prompts import RowRequest
from .retries import RetryPolicy
from .settings import InferenceSettings
from .transport import Completion, Transport


class Attempts:
    """What one request's attempts did: how many, how many were sent, the last endpoint, the
    tokens billed. The engine keeps it, so it knows them also when the request fails."""

    __slots__ = ("count", "sent", "endpoint", "spent")

    def __init__(self) -> None:
        self.count = 0
        self.sent = 0
        self.endpoint: str | None = None
        self.spent = 0


class Delivery(Protocol):
    def capacity(self) -> int:
        """Requests it can usefully have outstanding at once (sizes the run's workers)."""
        ...

    def refusal(self, request: RowRequest) -> RowError | None:
        """Why ``request`` cannot be delivered at all, before it waits for anything; or None."""
        ...

    async def open(self) -> None: ...

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        """The reply to ``request``, or its final ``RowError``; ``attempts`` counts as it goes."""
        ...

    async def close(self) -> None: ...

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Figures per endpoint, for the run's stats."""
        ...


class OnlineDelivery:
    """Each request sent now over HTTP to the least-loaded endpoint, retried as the policy says."""

    def __init__(self, settings: InferenceSettings, pool: EndpointPool, transport: Transport, *,
                 route: str, writer: LedgerWriter):
        """``writer``: sending waits while it holds a room's worth of unwritten answers."""
        self.settings = settings
        self.pool = pool
        self.transport = transport
        self.route = route
        self.retry = RetryPolicy.from_settings(settings)
        self._writer = writer
        self._context_limits = _context_limits_by_model(settings)

    def capacity(self) -> int:
        return self.pool.capacity()

    def refusal(self, request: RowRequest) -> RowError | None:
        if not self.pool.serves(request.model):
            return UnsupportedModelError(f"no configured endpoint serves model '{request.model}'")
        limit = self._context_limits.get(request.model)
        if limit is not None and request.typical_prompt_tokens + request.max_tokens > limit:
            return ContextLengthExceededError(
                f"the prompt (~{request.typical_prompt_tokens} tokens) plus max_tokens "
                f"({request.max_tokens}) exceeds the {limit}-token context of '{request.model}'"
            )
        return None

    async def open(self) -> None:
        await self.transport.open(self.settings.endpoints, self.route)

    async def close(self) -> None:
        await self.transport.close()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.pool.snapshot()

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        """Attempts until one succeeds or the policy gives up. Each is a lease on an endpoint,
        the HTTP call and the lease back, written out in this one loop: a coroutine per
        attempt would cost every request an allocation."""
        retry, pool, writer = self.retry, self.pool, self._writer
        while True:
            attempts.count += 1
            try:
                lease = await pool.acquire(request.model, request.reserve_tokens)
                if writer.full:
                    # Checked again with the slot in hand: while this worker waited for it, the
                    # requests that freed slots added answers to write.
                    try:
                        await writer.wait_for_room()
                    except BaseException:
                        pool.give_back_unused(lease)
                        raise
                attempts.endpoint = lease.endpoint.spec.name
                attempts.sent += 1
                try:
                    completion = await self.transport.send(lease.endpoint.spec, request)
                except EndpointError as exc:
                    pool.release(lease, success=False, unhealthy=exc.counts_against_endpoint,
                                 actual_tokens=None)
                    raise
                except BaseException:
                    pool.release(lease, success=False, unhealthy=True, actual_tokens=None)
                    raise
            except RowError as exc:
                if not retry.should_retry(exc, attempts.count):
                    raise
                delay = retry.retry_delay(exc, attempts.count)
            else:
                used = (completion.prompt_tokens + completion.completion_tokens
                        if completion.usage_reported else request.reserve_tokens)
                attempts.spent += used
                pool.release(lease, success=True, unhealthy=False, actual_tokens=used)
                return completion
            await asyncio.sleep(delay)  # outside the handler: the error is not kept meanwhile


def _context_limits_by_model(settings: InferenceSettings) -> dict[str, int]:
    """Per model, the longest context of the endpoints serving it, where all of them say."""
    limits: dict[str, int] = {}
    for model in settings.models:
        windows = [e.max_context_tokens for e in settings.endpoints if model in e.models]
        if windows and all(w is not None for w in windows):
            limits[model] = max(windows)
    return limits
