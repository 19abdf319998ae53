"""The httpx-family transport: tag -> route -> send (with retries) -> observe.

This is agentrt's one integration point with HTTP. Every call made through a client that
agentrt built (``rt.openai()``, ``rt.http_client()``, ``session.chat``) passes through
:class:`AgentTransport.handle_async_request`, which

1. finds the call's session (contextvars: its job's default one outside any session)
   or opens an implicit one-call job (outside any job),
2. makes the call (``_call``): its :class:`CallMetadata` (turn, attained service, idle
   times), an endpoint from the router, the dialect's headers and body fields,
3. sends it through the wrapped transport, retrying per :class:`Retry` (``_retry``),
4. observes the reply (usage, cached tokens, time to first token) into the job's report
   (``_wire``; a stream's as it is read, ``_stream``).

The stages below it: ``_httplib`` (the HTTP library, the request and reply copies),
``_wire`` (the JSON), ``_retry``, ``_stream``, ``_call``; above it, ``_sync`` carries
synchronous clients' requests into the runtime's loop.
"""

from __future__ import annotations

from threading import get_ident
from typing import TYPE_CHECKING

import httpx

from .._context import Job, call_session
from .._errors import CLOSED_MESSAGE, WRONG_LOOP_MESSAGE, ClientClosedError, WrongLoopError
from .._httplib import HttpLib
from ._attempts import Sender
from ._call import TransportCall

if TYPE_CHECKING:
    from .._state import _Core

__all__ = ["AgentTransport", "SharedTransport"]


class AgentTransport:
    """Wraps a real transport; tags, routes, retries and observes every call.

    Instantiate it through ``HttpLib.derive(AgentTransport)`` (this class on the
    library's ``AsyncBaseTransport``)."""

    _lib: HttpLib
    _bases = ("AsyncBaseTransport",)

    def __init__(self, core: _Core, inner: httpx.AsyncBaseTransport) -> None:
        self._core = core
        self._inner = inner
        self._sender = Sender(core, inner, self._lib)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        if core.closed or get_ident() != core.loop_thread:  # before anything is counted or sent
            if core.closed:
                raise ClientClosedError(CLOSED_MESSAGE)
            raise WrongLoopError(WRONG_LOOP_MESSAGE)
        route = core.match(request.url)
        if route is None:
            # Not addressed to agentrt or one of its endpoints: pass through untouched.
            return await self._inner.handle_async_request(request)
        session = call_session(core)
        implicit: Job | None = None
        if session is None:
            implicit = Job._implicit(core)
            session = implicit._new_session(None, None, None)
        try:
            session._check_usable()
            call = TransportCall(self._sender, request, route[0], route[1], session, implicit)
            deadline = call.ticket.deadline_at
            if deadline is None:
                return await call.run()
            return await call.run_bounded(deadline)
        except BaseException:
            if implicit is not None:
                session._unpin()
                implicit._end_implicit()
            raise


class SharedTransport:
    """A client's view of the runtime's transport; closing the client leaves it open."""

    _lib: HttpLib
    _bases = ("AsyncBaseTransport",)

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport
        # The wrapped transport's method itself: no coroutine of its own on every call.
        self.handle_async_request = transport.handle_async_request  # type: ignore[method-assign]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)  # pragma: no cover

    async def aclose(self) -> None:
        return None
