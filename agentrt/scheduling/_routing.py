"""Routing: which endpoint (replica) a call goes to.

A router is a small object with one method, ``choose``. Routers see the endpoints' load
(calls in flight) and the session, never the HTTP request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._context import Session

__all__ = ["EndpointLoad", "RoundRobin", "Router", "SessionAffinity", "make_router"]


@dataclass(slots=True)
class EndpointLoad:
    """Live load of one endpoint, as agentrt sees it from the client."""

    weight: float = 1.0
    in_flight: int = 0
    sessions: int = 0
    """Sessions currently pinned to this endpoint."""


class Router(Protocol):
    """Chooses an endpoint index for a call."""

    name: str

    def choose(
        self, loads: Sequence[EndpointLoad], session: Session | None, avoid: Collection[int]
    ) -> int: ...


def _least_loaded(loads: Sequence[EndpointLoad], avoid: Collection[int]) -> int:
    candidates = [i for i in range(len(loads)) if i not in avoid] or list(range(len(loads)))
    return min(candidates, key=lambda i: ((loads[i].in_flight + 1) / loads[i].weight, i))


class RoundRobin:
    """Each call to the next endpoint in turn, ignoring sessions (what plain clients and
    most load balancers do)."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(
        self, loads: Sequence[EndpointLoad], session: Session | None, avoid: Collection[int]
    ) -> int:
        n = len(loads)
        for _ in range(n):
            i = self._next % n
            self._next += 1
            if i not in avoid:
                return i
        return self._next % n


class SessionAffinity:
    """SMetric-style session routing: a session's first turn goes to the least-loaded
    endpoint; its later turns go where its KV cache is, unless that endpoint carries more
    than ``overload`` times the mean load (then the session moves to the least loaded)."""

    name = "session"

    def __init__(self, overload: float = 2.0) -> None:
        if overload < 1.0:
            raise ValueError("overload factor must be >= 1.0")
        self.overload = overload

    def choose(
        self, loads: Sequence[EndpointLoad], session: Session | None, avoid: Collection[int]
    ) -> int:
        home = session.endpoint_index if session is not None else None
        if home is not None and home < len(loads) and home not in avoid:
            mean = sum(load.in_flight / load.weight for load in loads) / len(loads)
            mine = loads[home].in_flight / loads[home].weight
            if mine <= max(self.overload * mean, 1.0):
                return home
        return _least_loaded(loads, avoid)


def make_router(routing: str | Router) -> Router:
    if not isinstance(routing, str):
        return routing
    if routing == "session":
        return SessionAffinity()
    if routing == "round-robin":
        return RoundRobin()
    raise ValueError(f"unknown routing {routing!r}; choose 'session' or 'round-robin'")
