"""The online delivery: each request sent over HTTP now, to the least-loaded endpoint.

:class:`OnlineDelivery` is a lease from the endpoint pool, the transport's call, the lease back,
and the retry loop of :mod:`.retries` around them (the interface is :mod:`.base`'s).

Two bounds keep a call from crawling on endpoints that never give a usable answer: rows fail
as ``endpoint_unreachable`` once no endpoint of their model could be connected to for
``endpoint_unreachable_after_s``, and as ``endpoint_failing`` once every endpoint of it has
answered nothing usable for ``endpoint_failing_after_s`` (kept by the pool, see
:class:`.endpoint_state.FailingBound`). Every wait of the loop (backoff, a breaker's cool-down,
a slot) ends at them. A server's ``Retry-After`` longer than the failing bound defers the row
instead of holding it: a later call sends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import Any

from ..errors import (
    ContextLengthExceededError,
    DeferredError,
    EndpointError,
    EndpointUnreachableError,
    RowError,
    UnsupportedModelError,
)
from ..ledger.writer import LedgerWriter
from ..requests import Completion, RowRequest
from ..settings import InferenceSettings
from ..usage import hold_to_bound
from .base import Attempts, Delivery
from .endpoint_state import FailingBound
from .pool import EndpointPool
from .retries import RetryPolicy
from .transport import ReplyParser, Transport


class OnlineDelivery(Delivery):
    """Each request sent now over HTTP to the least-loaded endpoint, retried as the policy says."""

    def __init__(self, settings: InferenceSettings, pool: EndpointPool, transport: Transport, *,
                 route: str, route_models: Collection[str] | None = None, log: Any = None,
                 unreachable_after_s: float | None = None, parse: ReplyParser | None = None):
        """``route`` and ``parse``: where requests go and how replies are read (the task's);
        ``route_models``: the models the endpoints serve on that route (None: whichever they
        serve), so a model of another route fails as a row, saying where it belongs;
        ``unreachable_after_s``: how long every endpoint of a model may refuse connections
        (or fail DNS or TLS) before the rows still to send fail with ``endpoint_unreachable``:
        seconds, not the hours that retries and cool-downs of a URL with nothing behind it
        would otherwise take (``settings.endpoint_unreachable_after_s`` by default)."""
        self.settings = settings
        self.log = log or logging.getLogger("dagster_batchllm")
        self.unreachable_after_s = (settings.endpoint_unreachable_after_s
                                    if unreachable_after_s is None else unreachable_after_s)
        # endpoint name -> when it started failing to connect (cleared by any reply)
        self._unreachable_since: dict[str, float] = {}
        # Set at open(): the failing bound counts from the call's start at the earliest.
        self._failing: FailingBound | None = None
        self._baseline: dict[str, dict[str, Any]] = {}
        self.pool = pool
        self.transport = transport
        self.route = route
        self.parse = parse
        self.retry = RetryPolicy.from_settings(settings)
        self._writer: LedgerWriter | None = None  # the run's, from open()
        self._context_limits = _context_limits_by_model(settings)
        # The pool routes chat and embedding models alike; the task says which are this route's.
        self._route_models = route_models
        self.requests_in_flight = 0

    def capacity(self) -> int:
        return self.pool.capacity()

    def refusal(self, request: RowRequest) -> RowError | None:
        if not self.pool.serves(request.model):
            return UnsupportedModelError(f"no configured endpoint serves model '{request.model}'")
        if self._route_models is not None and request.model not in self._route_models:
            return UnsupportedModelError(
                f"'{request.model}' is not served on {self.route} (an Endpoint lists chat "
                "models in models=[...] and embedding models in embedding_models=[...])")
        limit = self._context_limits.get(request.model)
        if limit is not None and request.typical_prompt_tokens + request.max_tokens > limit:
            return ContextLengthExceededError(
                f"the prompt (~{request.typical_prompt_tokens} tokens) plus max_tokens "
                f"({request.max_tokens}) exceeds the {limit}-token context of '{request.model}'"
            )
        return None

    async def open(self, writer: LedgerWriter) -> None:
        self._writer = writer
        self._baseline = self.pool.snapshot()  # the pool outlives calls; figures are per call
        self._failing = FailingBound(self.settings.endpoint_failing_after_s, self.pool.now())
        await self.transport.open(self.settings.endpoints, self.route, self.parse)

    async def close(self) -> None:
        await self.transport.close()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """This call's figures per endpoint (the counters less those at ``open``)."""
        figures = self.pool.snapshot()
        for name, counters in figures.items():
            before = self._baseline.get(name, {})
            for counter in ("requests", "succeeded", "failed"):
                counters[counter] -= before.get(counter, 0)
        return figures

    # -- unreachable endpoints ---------------------------------------------------------------
    def _unreachable(self, exc: EndpointError, url: str) -> None:
        name = exc.endpoint or ""
        if name not in self._unreachable_since:
            self._unreachable_since[name] = time.monotonic()
            self.log.warning(
                f"batchllm: endpoint '{name}' at {url} cannot be reached ({exc.message}); "
                f"if no endpoint of the model can be reached for {self.unreachable_after_s:g} "
                "s, the rows still to send fail with endpoint_unreachable")

    def _unreachable_deadline(self, model: str) -> float:
        """When the rows of ``model`` fail as unreachable (monotonic seconds): the bound after
        the last of its endpoints began refusing; infinity while one of them has not."""
        since, serving = self._unreachable_since, self.settings.endpoints
        starts = [since.get(e.name) for e in serving if model in e.served_models]
        if not starts or any(start is None for start in starts):
            return float("inf")
        return max(starts) + self.unreachable_after_s

    def _check_reachable(self, model: str) -> None:
        """Raise ``EndpointUnreachableError`` once every endpoint of ``model`` has failed to
        connect for longer than the bound."""
        if not self._unreachable_since:
            return
        if time.monotonic() >= self._unreachable_deadline(model):
            serving = [e for e in self.settings.endpoints if model in e.served_models]
            where = ", ".join(f"'{e.name}' at {e.base_url}" for e in serving)
            raise EndpointUnreachableError(
                f"no endpoint serving '{model}' could be connected to for "
                f"{self.unreachable_after_s:g} s ({where}); nothing is listening there, the "
                "host name does not resolve or TLS fails: check base_url")

    async def send(self, request: RowRequest, attempts: Attempts) -> Completion:
        """Attempts until one succeeds or the policy gives up. Each is a lease on an endpoint,
        the HTTP call and the lease back, written out in this one loop: a coroutine per
        attempt would cost every request an allocation."""
        retry, pool, writer, failing = self.retry, self.pool, self._writer, self._failing
        while True:
            if self._unreachable_since:
                self._check_reachable(request.model)
            attempts.count += 1
            try:
                lease = await pool.acquire(request.model, request.reserve_tokens,
                                           request.prefix_key, failing)
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
                self.requests_in_flight += 1
                try:
                    completion = await self.transport.send(lease.endpoint.spec, request)
                except EndpointError as exc:
                    pool.release(lease, success=False, unhealthy=exc.counts_against_endpoint,
                                 actual_tokens=None, reason=exc.as_cell())
                    if exc.unreachable:
                        self._unreachable(exc, lease.endpoint.spec.base_url)
                    elif self._unreachable_since:  # it answered: reachable after all
                        self._unreachable_since.pop(lease.endpoint.spec.name, None)
                    raise
                except asyncio.CancelledError:  # the run stops: not the endpoint's fault
                    pool.release(lease, success=False, unhealthy=False, actual_tokens=None)
                    raise
                except BaseException as exc:  # a reply that is none (not JSON...), or a bug
                    pool.release(lease, success=False, unhealthy=True, actual_tokens=None,
                                 reason=_reason(exc))
                    raise
                finally:
                    self.requests_in_flight -= 1
            except RowError as exc:
                if not retry.should_retry(exc, attempts.count):
                    raise
                delay = retry.retry_delay(exc, attempts.count)
                if retry.waits_too_long(exc, delay):
                    raise DeferredError(
                        f"endpoint '{exc.endpoint}' asked to wait {delay:g} s before a retry "
                        f"(Retry-After), longer than endpoint_failing_after_s "
                        f"({retry.max_wait_s:g} s): not waited for, a later call sends it "
                        f"({exc.as_cell()})") from None
            else:
                hold_to_bound(completion, request)  # a server's figures: never past the bound
                used = (completion.prompt_tokens + completion.completion_tokens
                        if completion.usage_reported else request.reserve_tokens)
                attempts.spent += used
                pool.release(lease, success=True, unhealthy=False, actual_tokens=used)
                if self._unreachable_since:
                    self._unreachable_since.pop(lease.endpoint.spec.name, None)
                return completion
            if self._unreachable_since:
                # A backoff or a breaker's cool-down (up to minutes) must not outlast the
                # bound: the request wakes at it and fails as unreachable, as promised.
                delay = max(0.0, min(delay, self._unreachable_deadline(request.model)
                                     - time.monotonic()))
            if failing is not None:  # likewise the failing bound (infinite while one is well)
                delay = max(0.0, min(delay, pool.failing_deadline(request.model, failing)
                                     - pool.now()))
            await asyncio.sleep(delay)  # outside the handler: the error is not kept meanwhile


def _reason(exc: BaseException) -> str:
    """A failure in the words a row's error uses (``<error_type>: <message>``)."""
    if isinstance(exc, RowError):
        return exc.as_cell()
    return f"{type(exc).__name__}: {exc}"


def _context_limits_by_model(settings: InferenceSettings) -> dict[str, int]:
    """Per model, the longest context of the endpoints serving it, where all of them say."""
    limits: dict[str, int] = {}
    for model in settings.models | settings.embedding_models:
        windows = [e.max_context_tokens for e in settings.endpoints if model in e.served_models]
        if windows and all(w is not None for w in windows):
            limits[model] = max(windows)
    return limits
