"""What the two simulated batch APIs (OpenAI's Files and Batches, :mod:`.batch_api`;
Anthropic's Message Batches, :mod:`.anthropic_batches`) route alike.

Every route of either goes through one wrapper: the call is counted, a killed server drops
it, a call without the key is refused, and its outcome comes from the ``batch_api`` script
(`SimulatedEndpoint.script_batch_api`): an error status answers that error and changes
nothing; "drop" does the call's work, then closes the connection unanswered (a create the
client never hears of). A handler raises the API's :class:`Reject` to answer an error, which
the API's own envelope renders.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import ClassVar

from aiohttp import web

from ..openai_server.protocol import Reject, error_response
from .batch_runner import BatchRunner
from .batch_store import BatchStore
from .state import SimState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BatchRoutes:
    """One simulated batch API: its :meth:`routes`, how it checks the key
    (:meth:`authorized`, :meth:`unauthorized`) and its refusal (``Rejection``)."""

    #: What a refusal is raised as: its ``body()`` is the API's error envelope.
    Rejection: ClassVar[type[Reject]] = Reject

    def __init__(self, state: SimState, runner: BatchRunner):
        self.state, self.runner = state, runner

    @property
    def store(self) -> BatchStore:
        return self.state.store

    def routes(self) -> Iterable[tuple[str, str, Handler]]:
        """(method, path, handler) of each route."""
        raise NotImplementedError

    def authorized(self, request: web.Request) -> bool:
        raise NotImplementedError

    def unauthorized(self) -> Reject:
        """The API's answer to a call without the key."""
        raise NotImplementedError

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for method, path, handler in self.routes():
            router.add_route(method, path, self._wrap(handler))

    def _wrap(self, handler: Handler) -> Handler:
        """Auth, the batch_api script, latency and stats around one route."""

        async def call(request: web.Request) -> web.StreamResponse:
            st, store = self.state, self.store
            store.api_requests += 1
            if st.killed:
                return _drop(request)
            if not self.authorized(request):
                return self._error(self.unauthorized())
            outcome = st.next_api_outcome()
            if st.config["batch_api_latency_s"]:
                await asyncio.sleep(st.config["batch_api_latency_s"])
            if isinstance(outcome, int):
                return self._error(self.Rejection(outcome, f"simulated {outcome} error"))
            try:
                response = await handler(request)
            except Reject as exc:
                return self._error(exc)
            store.count_api_status(response.status)
            return _drop(request) if outcome == "drop" else response

        return call

    def _error(self, reject: Reject) -> web.Response:
        self.store.count_api_status(reject.status)
        return error_response(reject.status, reject.body())


def _drop(request: web.Request) -> web.Response:
    if request.transport is not None:
        request.transport.close()
    return web.Response()
