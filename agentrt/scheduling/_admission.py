"""Admission: the per-endpoint gate every call passes before it is sent.

An :class:`Admission` holds an endpoint's in-flight count and outstanding tokens, a
:class:`~agentrt.scheduling.Limit` and an optional token budget. A call that fits is
admitted at once, without awaiting anything; the others wait in the
:class:`~agentrt.scheduling.Policy`, which decides who goes next when room frees up.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from ._limiter import FixedLimit, Limit
from ._queue import Policy, Ticket

__all__ = ["Admission", "AdmissionStatistics"]


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    """A snapshot of one endpoint's admission state."""

    limit: int | None
    """The in-flight limit now (None: unlimited)."""
    in_flight: int
    """Calls admitted and not yet released."""
    waiting: int
    """Calls waiting for admission."""
    outstanding_tokens: int
    """Estimated tokens of the calls in flight."""
    admitted: int
    """Calls admitted so far (a call granted room but cancelled before it resumed is not
    counted)."""
    queued_total: int
    """Calls that had to wait so far."""


class Admission:
    """The admission gate of one endpoint (anyio: asyncio and trio).

    ``limit`` bounds the calls in flight (None: unlimited). ``token_budget`` bounds the sum
    of the in-flight calls' ``ticket.tokens``; a call larger than the budget is still
    admitted when nothing else is in flight, so it runs alone rather than never.

    Waiting calls leave in the policy's order, strictly: when the next one does not fit
    the token budget, it waits for tokens to free up and the calls behind it wait too
    (no backfilling, as in vLLM's FCFS scheduler), so a large call is not starved by
    smaller ones.
    """

    __slots__ = (
        "_admitted",
        "_budget",
        "_events",
        "_in_flight",
        "_limit",
        "_next",
        "_policy",
        "_queued_total",
        "_tokens",
    )

    def __init__(
        self, policy: Policy, limit: Limit | None = None, token_budget: int | None = None
    ) -> None:
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"token_budget must be a positive int or None, got {token_budget}")
        if isinstance(limit, FixedLimit) and limit.limit is None:
            limit = None
        self._policy = policy
        self._limit = limit
        self._budget = token_budget
        self._in_flight = 0
        self._tokens = 0
        self._admitted = 0
        self._queued_total = 0
        self._events: dict[Ticket, anyio.Event] = {}
        """The waiting tickets (not yet granted room)."""
        self._next: Ticket | None = None
        """Popped from the policy, waiting for the token budget (head of line)."""

    @property
    def policy(self) -> Policy:
        """The ordering policy of the waiting calls."""
        return self._policy

    @property
    def limit(self) -> Limit | None:
        """The in-flight limit (None: unlimited)."""
        return self._limit

    @property
    def admitted(self) -> int:
        """Calls admitted so far."""
        return self._admitted

    def _fits(self, ticket: Ticket) -> bool:
        """Room for ``ticket`` under the token budget."""
        budget = self._budget
        return budget is None or self._in_flight == 0 or self._tokens + ticket.tokens <= budget

    def _below_limit(self) -> bool:
        lim = self._limit
        if lim is None:
            return True
        n = lim.limit
        return n is None or self._in_flight < max(n, 1)

    def _grant(self, ticket: Ticket) -> None:
        ticket._held = True
        self._in_flight += 1
        self._tokens += ticket.tokens

    def try_admit(self, ticket: Ticket) -> bool:
        """Admit ``ticket`` now if it fits and nobody waits (True); else leave it (False:
        :meth:`admit` queues it). The transport's fast path: no coroutine, no await."""
        if ticket._held:
            raise RuntimeError(f"ticket {ticket.call_id!r} is already admitted")
        if (self._limit is None and self._budget is None) or (
            not self._events and self._below_limit() and self._fits(ticket)
        ):
            ticket._held = True
            self._in_flight += 1
            self._tokens += ticket.tokens
            self._admitted += 1
            return True
        return False

    async def admit(self, ticket: Ticket) -> None:
        """Return once ``ticket`` may be sent; the caller must then :meth:`release` it.

        When the call fits and nobody waits this returns without awaiting anything (no
        checkpoint: it is on every call's path). Otherwise the ticket waits in the policy;
        cancellation while waiting takes it out of the queue, and room granted to a ticket
        cancelled before it resumed goes to the next one.
        """
        if self.try_admit(ticket):
            return
        self._policy.push(ticket, anyio.current_time())
        event = self._events[ticket] = anyio.Event()
        self._queued_total += 1
        self._dispatch()  # in case the limit grew without a release
        try:
            await event.wait()
        except BaseException:
            if self._events.pop(ticket, None) is not None:  # still waiting: leave the queue
                if self._next is ticket:
                    self._next = None
                else:
                    self._policy.remove(ticket)
            else:  # granted room meanwhile: hand it on
                self._ungrant(ticket)
            self._dispatch()
            raise
        self._admitted += 1

    def _ungrant(self, ticket: Ticket) -> None:
        ticket._held = False
        self._in_flight -= 1
        self._tokens -= ticket.tokens

    def release(self, ticket: Ticket, latency_s: float | None, tokens: int, ok: bool) -> None:
        """``ticket``'s call finished (``ok``) or failed: free its room and tokens, feed the
        limit (when ``latency_s`` is known) and admit whoever fits next."""
        if not ticket._held:
            raise RuntimeError(f"ticket {ticket.call_id!r} is not admitted")
        in_flight = self._in_flight
        ticket._held = False  # _ungrant, inlined: on every call's path
        self._in_flight = in_flight - 1
        self._tokens -= ticket.tokens
        if latency_s is not None and self._limit is not None:
            self._limit.on_sample(latency_s, tokens, in_flight, ok)
        if self._events:
            self._dispatch()

    def _dispatch(self) -> None:
        """Grant room to waiting tickets, in policy order, while it lasts."""
        now: float | None = None
        while self._events and self._below_limit():
            t = self._next
            if t is None:
                if now is None:
                    now = anyio.current_time()
                t = self._policy.pop(now)
                if t is None:  # pragma: no cover - the policy lost a ticket
                    raise RuntimeError("admission queue out of sync with its policy")
            if not self._fits(t):
                self._next = t
                return
            self._next = None
            event = self._events.pop(t)
            self._grant(t)
            event.set()

    def engine_signals(self, running: int | None, waiting: int | None) -> None:
        """The engine's polled load (requests running and waiting there; None: not
        reported). A limit that learns from it (``on_signals``, as
        :class:`~agentrt.scheduling.EngineQueueLimit`) is fed it with this gate's
        waiting calls and calls in flight, and waiting calls are admitted if the limit
        grew."""
        observe = getattr(self._limit, "on_signals", None)
        if observe is None:
            return
        observe(running, waiting, len(self._events), self._in_flight)
        if self._events:
            self._dispatch()

    def statistics(self) -> AdmissionStatistics:
        """A snapshot of the current state."""
        lim = self._limit
        return AdmissionStatistics(
            limit=None if lim is None else lim.limit,
            in_flight=self._in_flight,
            waiting=len(self._events),
            outstanding_tokens=self._tokens,
            admitted=self._admitted,
            queued_total=self._queued_total,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"Admission(policy={self._policy.name!r}, limit={s.limit}, "
            f"in_flight={s.in_flight}, waiting={s.waiting})"
        )
