"""A call's attempts: route -> admit -> send once -> check the reply, retried per
:class:`Retry` (one plain loop, :meth:`Attempts.run`). :class:`Sender` is what every call
of a transport sends through. The call itself (its setup, its outcome, its end) is
``_call.TransportCall``, which holds its :class:`Attempts`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import httpx

from .._httplib import ConnTrace, HttpLib
from .._log import transport_log
from .._notice import accept_header
from ._events import attempt_failed, log_attempt, moved, priority_refused, sending
from ._outgoing import Outgoing, metadata
from ._retry import (
    RETRY_STATUS,
    RetryableError,
    RetryableStatus,
    Retrying,
    preempted,
    refuses_priority,
    retry_after,
)
from ._stream import ObservedStream

if TYPE_CHECKING:
    from .._context import Session
    from .._state import _Core, _EndpointState
    from .._turns import TurnStart
    from ..scheduling._queue import Ticket
    from ..telemetry._report import _CallState

__all__ = ["Attempts", "Sender"]

_DEBUG = logging.DEBUG

_MAX_STALE = 256
"""Resends of one attempt after kept-alive connections the server had closed. Each such
connection leaves the pool, so the resends end once the pool's idle connections are
spent (at most its keep-alive limit, 256 in the runtime's own client); this only bounds
them. A bound of 8 was too low: a pool of 20 parallel sub-agents' idle connections, all
closed by the server, ran past it and turned a stale connection into a failed attempt
(the trio soak test, one run in six)."""


class Sender:
    """What the calls of one transport send through: the runtime's core, the wrapped
    transport, its library (and the observed stream on it), the placeholder key."""

    __slots__ = ("core", "inner", "lib", "observed", "placeholder")

    def __init__(self, core: _Core, inner: httpx.AsyncBaseTransport, lib: HttpLib) -> None:
        self.core = core
        self.inner = inner
        self.lib = lib
        self.observed = lib.derive(ObservedStream)
        self.placeholder = f"Bearer {core.placeholder_key}".encode()


class Attempts:
    """A call's attempts: what each one is sent with (the call's request, metadata,
    record and ticket, handed over by the call), and what the attempts keep between
    them (the endpoint in flight, the endpoints that could not be reached, the time
    spent backing off)."""

    __slots__ = (
        "backoff_s",
        "clock",
        "core",
        "ep",
        "failed",
        "max_out",
        "out",
        "prefix",
        "sender",
        "sent_at",
        "session",
        "state",
        "suffix",
        "ticket",
        "turn",
    )

    def __init__(
        self,
        sender: Sender,
        out: Outgoing,
        session: Session,
        state: _CallState,
        ticket: Ticket,
        turn: TurnStart,
        max_out: int | None,
        prefix: tuple[int, ...],
        now: float,
    ) -> None:
        self.sender = sender
        self.core = core = sender.core
        self.clock: Callable[[], float] = core.clock
        self.out = out
        """What each attempt sends: the caller's request, re-encoded per endpoint."""
        self.suffix = out.suffix
        self.session = session
        self.state = state
        self.ticket = ticket
        self.turn = turn
        self.max_out = max_out
        """The output tokens the request allows (``max_tokens`` and its kin), if it says."""
        self.prefix = prefix
        """The prompt's prefix fingerprints, for a router that places by prefix."""
        self.ep: _EndpointState | None = None
        """The endpoint of the attempt in flight, counted in its load until released."""
        self.failed: set[int] = set()
        """Endpoints that could not be connected to: the retries go elsewhere."""
        self.sent_at = now
        """When the attempt in flight was sent (its latency's start)."""
        self.backoff_s = 0.0
        """Seconds slept between attempts: not service the program received."""

    async def _attempt(self) -> httpx.Response:
        """One attempt: route, admit, send once, check the reply."""
        fresh = self.core.fresh_view
        if fresh is not None:
            placement = self.session.placement
            if placement.home is None or placement.unserved:  # a first turn
                await fresh()  # not placed on a stale view of the engines
        index = self._route()
        ep = self.core.endpoints[index]
        admission = ep.admission
        ticket = self.ticket
        ticket.enqueued_at = -1.0
        if not admission.try_admit(ticket):
            await admission.admit(ticket)
        out = self._admitted(ep)
        response = await self._send(index, ep, out)
        status = response.status_code
        try:
            self.state.http_status = status
            if transport_log.isEnabledFor(_DEBUG):  # one dict lookup when off
                self._log_attempt(ep, f"HTTP {status}")
            if status in RETRY_STATUS:
                await response.aread()
                raise RetryableStatus(response, retry_after(response.headers), ep.endpoint.url)
        except BaseException as exc:
            self.release(ok=status not in RETRY_STATUS)
            if status >= 500 and not preempted(response):
                self.core.record_health(ep, False)
            if self.core.hooks and not isinstance(exc, RetryableStatus):
                self._failed(ep, f"HTTP {status}")  # a retryable one is told by the loop
            await response.aclose()
            raise
        self._accepted(ep, response)
        return response

    def _route(self) -> int:
        """The attempt's endpoint (the router's choice; a move told), its priority (the
        endpoint's policy's queue level, where it takes one)."""
        core, state, ticket = self.core, self.state, self.ticket
        session = self.session
        placement = session.placement
        home = placement.home
        index, reason = placement.route(core, self.failed, self.prefix, ticket.tokens)
        ep = core.endpoints[index]
        if reason is not None:
            state.moved = True
            previous = state.endpoint or (
                core.endpoints[home].endpoint.url if home is not None else None
            )
            moved(core, ticket, state, previous, ep.endpoint.url, reason)
        policy = ep.admission.policy
        priority = policy.classify(ticket, state.started)
        if core.send_priority:
            if type(priority) is not int:
                raise TypeError(
                    f"scheduling policy {type(policy).__name__}.classify returned "
                    f"{priority!r}; it must return an int (the queue level, lower first)"
                )
            # Only to an endpoint that takes priorities (send_priority, or 'auto' and it
            # advertised a priority scheduler).
            state.priority = priority if ep.options.send_priority else None
        return index

    def _admitted(self, ep: _EndpointState) -> httpx.Request:
        """The attempt let through ``ep``'s admission gate: counted in its load, its
        request built (the room given back if building it fails)."""
        state, ticket = self.state, self.ticket
        try:
            queued = ticket.enqueued_at >= 0.0
            if queued or state.attempts:  # it waited in the queue, or this is a retry
                self.sent_at = now = self.clock()
                if queued:
                    state.queue_s += now - ticket.enqueued_at
            state.attempts += 1
            state.endpoint = ep.endpoint.url
            out = self._build(ep, queued)
        except BaseException:
            ep.admission.release(ticket, latency_s=None, tokens=0, ok=True)
            raise
        load = ep.load
        load.in_flight += 1
        load.outstanding_tokens += ticket.tokens
        self.ep = ep
        return out

    async def _send(self, index: int, ep: _EndpointState, out: httpx.Request) -> httpx.Response:
        """Send the attempt's request once; again at once on another connection where a
        kept-alive one had been closed, and once without the priority where ``ep``
        refused it. A transport error ends the attempt (:class:`RetryableError`)."""
        sender = self.sender
        lib = sender.lib
        resent = False
        stale = 0
        trace = ConnTrace.install(out)
        while True:
            try:
                response = await sender.inner.handle_async_request(out)
            except lib.transport_errors as exc:
                if trace.reused and stale < _MAX_STALE and isinstance(exc, lib.stale_errors):
                    # A kept-alive connection the server had closed (its keep-alive
                    # expired as this request went out): no reply came, the endpoint is
                    # not at fault. Resent at once, in the same attempt, on another
                    # connection (httpcore dropped that one from its pool).
                    stale += 1
                    if transport_log.isEnabledFor(_DEBUG):
                        self._log_attempt(
                            ep,
                            f"{type(exc).__name__}: {exc} on a kept-alive connection the "
                            "server had closed; resent on another connection",
                        )
                    trace = ConnTrace.install(out)
                    continue
                self._unreached(index, ep, exc)
                raise RetryableError(exc, index, ep.endpoint.url) from exc
            except BaseException:
                self.release(ok=True)
                raise
            if (
                response.status_code != 400
                or resent
                or self.state.priority is None
                or not await self._priority_refused(ep, response)
            ):
                return response
            # Resent at once without the priority, in the same attempt (it holds its
            # room and its retries): once per call, so a second 400 goes to the caller.
            resent = True
            try:
                self.sent_at = self.clock()
                out = self._build(ep, False)
            except BaseException:
                self.release(ok=True)
                raise
            trace = ConnTrace.install(out)

    def _unreached(self, index: int, ep: _EndpointState, exc: Exception) -> None:
        """The attempt's request got no reply (``exc``): released, told, and counted
        against ``ep``'s health. Only a connection that could not be made marks the
        endpoint down at once and sends the retry elsewhere; a read timeout or a
        connection closed without a reply is one failure toward the threshold, and the
        retry stays where the session is. Our own pool's timeout is no failure of the
        endpoint's."""
        self.release(ok=False)
        core, lib = self.core, self.sender.lib
        connect = isinstance(exc, lib.connect_errors)
        if not isinstance(exc, lib.mod.PoolTimeout):
            core.record_health(ep, False, connect=connect)
        if connect:
            self.failed.add(index)
        if transport_log.isEnabledFor(_DEBUG):
            self._log_attempt(ep, f"{type(exc).__name__}: {exc}")

    def _accepted(self, ep: _EndpointState, response: httpx.Response) -> None:
        """A reply that ends the attempts: ``ep``'s health, the features it accepts, the
        headers the dialect echoes on the session's next calls."""
        status = response.status_code
        if status < 500:
            ep.health.record_success(self.sent_at)
        if status < 300:  # the features it accepts (tool-start notices)
            accept = accept_header(response.headers)
            if accept != ep.accept:
                ep.accept_header(accept)
        for name in ep.dialect.echo_headers:
            value = response.headers.get(name)
            if value is not None and len(value) <= 1024 and "\r" not in value:
                self.session.echo[name] = value

    def _build(self, ep: _EndpointState, queued: bool) -> httpx.Request:
        """The request of the attempt to ``ep``, for the call's metadata (its priority
        where ``ep`` takes one) in ``ep``'s dialect, with the hooks' headers."""
        meta = metadata(self.session, self.state, self.ticket, self.turn, self.max_out, self.clock)
        enc = ep.dialect.encode(meta, ep.options)
        if self.core.hooks:
            wire = self.out.callers_session_id(enc, meta.session_id)
            self._sending(ep, queued, enc.headers, wire)
        return self.out.to(ep, enc)

    async def _priority_refused(self, ep: _EndpointState, response: httpx.Response) -> bool:
        """Whether a 400 to a call that carried a priority refuses the priority itself
        (vLLM not started with ``--scheduling-policy priority``). If so, the reply is
        closed and ``ep`` gets no more priorities; the call's priority is cleared (its
        report shows none was sent). Any other 400 stays as it is, read, for the caller."""
        try:
            body = await response.aread()
        except BaseException:
            self.release(ok=True)
            await response.aclose()
            raise
        if not refuses_priority(body):
            return False
        await response.aclose()
        state = self.state
        state.http_status = 400
        if transport_log.isEnabledFor(_DEBUG):
            self._log_attempt(ep, "HTTP 400 (priority scheduling is not enabled)")
        if self.core.hooks:
            self._failed(ep, "HTTP 400", will_retry=True)
        state.priority = None
        if ep.refuse_priority():
            priority_refused(ep.endpoint.url)
        return True

    def _log_attempt(self, ep: _EndpointState, outcome: str) -> None:
        elapsed = self.clock() - self.sent_at
        log_attempt(
            self.core, self.ticket, self.state, ep.endpoint.url, self.suffix, outcome, elapsed
        )

    def _sending(
        self, ep: _EndpointState, queued: bool, headers: dict[str, str], wire: str | None
    ) -> None:
        sending(
            self.core, self.ticket, self.state, ep.endpoint.url, queued, self.sent_at, headers, wire
        )

    def _failed(self, ep: _EndpointState, error: str, *, will_retry: bool = False) -> None:
        attempt_failed(self.core, self.ticket, self.state, ep.endpoint.url, error, will_retry)

    async def _sleep(self, seconds: float) -> None:
        """A backoff between attempts, counted apart from the call's service."""
        start = self.clock()
        try:
            await anyio.sleep(seconds)
        finally:
            self.backoff_s += self.clock() - start

    async def run(self) -> httpx.Response:
        """The call's attempts, one after another with a backoff between them, until one
        is not retried; the last one's failure if every one failed. The retry's tenacity
        strategies are read only once an attempt has failed."""
        if self.core.gate is not None:
            await self._hold()
        retrying: Retrying | None = None
        n = 1
        while True:
            try:
                return await self._attempt()
            except (RetryableStatus, RetryableError) as exc:
                if retrying is None:
                    retrying = Retrying(self.core.retry, self.state.started)
                delay = retrying.failed(exc, n, self.clock())
                if self.core.hooks:
                    self._failed_attempt(exc, delay is not None)
                if delay is None:
                    raise
            await self._sleep(delay)
            n += 1

    def _failed_attempt(self, exc: RetryableStatus | RetryableError, will_retry: bool) -> None:
        error = exc.error
        text = f"HTTP {exc.status}" if error is None else f"{type(error).__name__}: {error}"
        attempt_failed(
            self.core, self.ticket, self.state, exc.endpoint, text, will_retry=will_retry
        )

    async def _hold(self) -> None:
        """Load control (``scheduling/_loadcontrol.py``): the call waits at its session's
        tool boundary, before it is routed, while its replica has no room for its
        context; the time held is the call's ``held_s``. A sub-agent's first turn is
        not held (its job was admitted, and its parent waits for it)."""
        gate = self.core.gate
        assert gate is not None
        session = self.session
        placement = session.placement
        home = None if placement.unserved else placement.home
        if home is None and session.parent_id is not None:
            return
        grant = await gate.admit(session.id, home, self.ticket.tokens)
        if grant.held_s > 0.0:
            self.state.held_s = grant.held_s
            self.sent_at = self.clock()
        if grant.replica >= 0:
            if home is None:
                placement.reserve(self.core, grant.replica)
            elif grant.replica != home:
                placement.target = grant.replica

    def release(self, *, ok: bool, now: float | None = None) -> None:
        """The attempt in flight is over (at ``now``, else read from the clock): its
        endpoint no longer carries it, its room in the admission gate goes to the next
        call, and its latency feeds the limit."""
        ep = self.ep
        if ep is None:
            return
        self.ep = None
        ticket = self.ticket
        load = ep.load
        load.in_flight -= 1
        load.outstanding_tokens -= ticket.tokens
        latency = (self.clock() if now is None else now) - self.sent_at
        ep.admission.release(ticket, latency, self.state.completion_tokens or 0, ok)
