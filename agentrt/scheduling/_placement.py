"""Placement: where each session's calls go, and what their replies teach about the
replicas (docs/routing.md).

A session's :class:`Placement` is the router side's record of it: its replica (``home``),
when its last reply came, what that replica could still hold of it. Its calls are routed
through it (:meth:`Placement.route`), and a finished call tells it its
:class:`CallOutcome` (:meth:`Placement.replied`, :meth:`Placement.learn`), which feeds
the replica's cache-retention estimate (``_retention.py``) and its working set
(``_workingset.py``).

Placement sees the replicas through :class:`Replicas`: each replica's small view
(:class:`ReplicaView`: its load, its working set, its retention estimate), the router,
whether working sets are kept and retention learned, load control's hook, the clock.
It knows no runtime, job, session object or transport: the runtime's state
(``agentrt._state``) owns the :class:`Replicas`, the session holds its
:class:`Placement`, and the call path drives both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from ._retention import RetentionEstimator
from ._routing import EndpointLoad, RouteKey, Router, SessionAffinity, kv_fill
from ._workingset import WorkingSet

__all__ = [
    "CallOutcome",
    "Placement",
    "ReplicaView",
    "Replicas",
    "RetentionEstimator",
    "WorkingSet",
]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What a call that got its reply tells placement (:meth:`Placement.learn`): where
    it was served, its tokens, and the times around it.

    The cached tokens against the session's previous context on the same replica say
    whether that replica kept it (the retention estimate, the working set's capacity);
    the call's context (prompt and completion) is what the replica holds of the session
    now, until it sends again ``next_in_s`` after ``ended_at``."""

    replica: int
    """The replica (endpoint index) that answered."""
    session_id: str
    """The session whose call it was."""
    prompt_tokens: int | None
    """``usage.prompt_tokens`` (None: the reply said none)."""
    completion_tokens: int | None
    """``usage.completion_tokens`` (None: the reply said none)."""
    cached_tokens: int | None
    """Of the prompt, the tokens the replica served from its prefix cache
    (``usage.prompt_tokens_details.cached_tokens``; None: the reply said none)."""
    moved: bool
    """The call went to another replica than the session's previous call."""
    held_s: float
    """Seconds load control held the call at its session's tool boundary (its context
    was meant to age out meanwhile)."""
    idle_s: float | None
    """Seconds the session was idle before the call (since its previous reply; None
    for its first call)."""
    next_in_s: float | None
    """Seconds after ``ended_at`` the session is expected to send again (its declared or
    learned tool wait; None: unknown)."""
    ended_at: float
    """When the reply ended the call (the runtime's clock)."""


class ReplicaView(Protocol):
    """One replica as placement sees it (the runtime's endpoint state is one)."""

    load: EndpointLoad
    """What the routers read of it (placement refreshes its retention and KV figures,
    and counts its sessions)."""
    working_set: WorkingSet
    """The KV working set this client placed there."""
    retention: RetentionEstimator
    """How long it keeps an idle session's prefix, from its replies."""


def refresh_retention(view: ReplicaView) -> None:
    """Its load's ``retention_s`` from the estimate, if replies moved it since."""
    retention = view.retention
    if retention.dirty:
        view.load.retention_s = retention.estimate()


def refresh_kv(view: ReplicaView, now: float) -> None:
    """Its load's KV capacity and working set from its working set, as of ``now``."""
    working, load = view.working_set, view.load
    load.kv_capacity = working.capacity_tokens
    load.kv_capacity_source = working.source
    load.kv_demand = working.demand(now)


class Replicas:
    """The replicas as placement sees them: their views (in endpoint order), the router,
    and what placement keeps of them. One per runtime (``_Core.replicas``)."""

    __slots__ = ("clock", "kv_aware", "learn_retention", "on_change", "router", "views")

    def __init__(self, views: Sequence[ReplicaView], router: Router) -> None:
        self.views = views
        self.router = router
        self.kv_aware = isinstance(router, SessionAffinity) and len(views) > 1
        """Whether sessions' working sets are kept per replica (placement by working
        set: the session router, over several endpoints; or load control)."""
        self.learn_retention = len(views) > 1
        """Whether replies feed the replicas' retention estimates (only routing uses
        them)."""
        self.on_change: Callable[[], None] | None = None
        """Called when a working set changed outside a call's routing (a reply, a
        failure, a session's end): load control's (``Gate.changed``), when on."""
        self.clock: Callable[[], float] = anyio.current_time
        """The clock of calls (set to the runtime's event loop's own when it opens)."""

    def load_control(self, changed: Callable[[], None]) -> None:
        """Load control is on: working sets are kept (whatever the router), and it hears
        of their changes through ``changed``."""
        self.kv_aware = True
        self.on_change = changed

    def refresh(self, now: float) -> None:
        """Every replica's load brought up to date (its retention estimate, and its KV
        figures where working sets are kept), as of ``now``."""
        kv = self.kv_aware
        for view in self.views:
            refresh_retention(view)
            if kv:
                refresh_kv(view, now)


class Placement:
    """Where one session's calls go, kept by the router side: the replica its KV lives on
    (``home``, as the router last chose it), when its last reply came, and what that
    replica could still hold of it for the next turn (feeds the replica's retention
    estimate). A session holds one (``Session.placement``); its calls are routed through
    it (:meth:`route`) and report their replies to it (:meth:`replied`, :meth:`learn`)."""

    __slots__ = (
        "cacheable",
        "distance",
        "ended",
        "home",
        "last_reply_at",
        "session_id",
        "stable",
        "target",
        "unserved",
    )

    def __init__(self, session_id: str, stable: bool) -> None:
        self.session_id = session_id
        self.stable = stable
        """The caller gave the session's id (the conversation may go on in another
        process): its first turn here is placed by hashing it, as every process does."""
        self.home: int | None = None
        self.last_reply_at: float | None = None
        self.cacheable: tuple[int, int] | None = None
        """(endpoint, prompt + completion tokens) of the last successful call: what that
        replica could still hold for the next turn."""
        self.ended = False
        """The session ended (:meth:`unpin`): it counts in no replica's load."""
        self.unserved = False
        """``home`` was chosen for a first turn that has not been answered yet: nothing
        of the session is there (a retry of that turn is still a first turn)."""
        self.target: int | None = None
        """Where load control resumes the session, away from its home (its context was
        no longer resident there, and another replica had room): the next route goes
        there, a move for ``"load"``."""
        self.distance: int | None = None
        """Tokens other sessions touched at its home between its previous call and this
        one (the stack distance when this call was routed there), for the capacity
        estimate; None when the call did not resume at home."""

    def route(
        self,
        replicas: Replicas,
        avoid: Collection[int],
        prefix: tuple[int, ...],
        tokens: int,
    ) -> tuple[int, str | None]:
        """The endpoint for the session's call, and why the session moved there from the
        replica that served its previous turn (its KV cache there is lost), or None if
        it did not move: ``"unavailable"`` (its replica failed or is down), the router's
        own reason where it gives one (``SessionAffinity.move_reason``: ``"retention"``,
        ``"overload"``), else ``"routing"``. A session counts in its replica's load
        until it ends (a call still in flight may move an ended one: counted nowhere)."""
        views = replicas.views
        home = self.home
        index = 0
        sid = self.session_id
        self.distance = None
        target = None
        if len(views) > 1:
            idle = None
            context, resident = 0, None
            now = replicas.clock()
            # A home chosen for a first turn not answered yet (its attempt failed there)
            # holds nothing of the session: the call is still its first turn. A
            # caller-given id's is placed again by its rendezvous order, as every process
            # places it; any other is routed as from the replica it was placed on (kept
            # there unless the router moves it: a failing replica collects its failures
            # and is marked down), yet not counted as a move.
            held = None if self.unserved and self.stable else home
            if held is not None and self.last_reply_at is not None:
                idle = now - self.last_reply_at
                refresh_retention(views[held])
            loads = [v.load for v in views]
            if replicas.kv_aware:
                context, resident = self._kv_view(replicas, loads, held, idle, avoid, now)
            key = RouteKey(
                sid, held, held is None, prefix, tokens, idle, self.stable, context, resident
            )
            target, self.target = self.target, None
            if target is not None and target not in avoid and views[target].load.healthy:
                index = target
            else:
                target = None
                index = replicas.router.choose(loads, key, avoid)
            replicas.router.served(index, key)
            if replicas.kv_aware and not self.ended:
                if home is not None and home != index:
                    views[home].working_set.leave(sid)
                    self.distance = None
                views[index].working_set.start(sid, max(tokens, context))
        elif replicas.kv_aware and not self.ended:  # one replica, under load control
            working = views[0].working_set
            if home is not None:
                self.distance = working.stack_distance(sid)
            working.start(sid, max(tokens, working.context(sid)))
        if home == index:
            return index, None
        self.home = index
        if not self.ended:
            views[index].load.sessions += 1
            if home is not None:
                views[home].load.sessions -= 1
        if home is None or self.unserved:
            self.unserved = True
            return index, None  # nothing of the session was anywhere: not a move
        if home in avoid or not views[home].load.healthy:
            return index, "unavailable"
        if target is not None:
            return index, "load"
        reason: str | None = getattr(replicas.router, "move_reason", None)
        return index, reason or "routing"

    def reserve(self, replicas: Replicas, index: int) -> None:
        """Load control admitted the session's first turn on replica ``index`` (where
        there was room): it is placed there, as a home chosen for a first turn that has
        not been answered yet (the router keeps it there unless it is down)."""
        if self.home is not None or self.ended:
            return
        self.home = index
        self.unserved = True
        replicas.views[index].load.sessions += 1

    def _kv_view(
        self,
        replicas: Replicas,
        loads: list[EndpointLoad],
        home: int | None,
        idle: float | None,
        avoid: Collection[int],
        now: float,
    ) -> tuple[int, int | None]:
        """The session's context at ``home`` and how much of it is likely still cached
        there (``RouteKey.context``, ``.resident``); the replicas' working sets refreshed
        where the router may look: all of them for a first turn or a session that may
        leave, for any reason (home overfull, or the router may not keep it there:
        avoided, down, overloaded, its cache likely gone), else home's alone (the
        others' marked not computed)."""
        views = replicas.views
        if home is None:
            for v in views:
                refresh_kv(v, now)
            return 0, None
        sid = self.session_id
        here = views[home]
        working = here.working_set
        self.distance = working.stack_distance(sid)
        refresh_kv(here, now)
        fill = kv_fill(here.load)
        router = replicas.router
        leaving = (
            (fill is not None and fill > 1.0)
            # A router other than the session router's (kept under load control) may
            # send any call anywhere.
            or not isinstance(router, SessionAffinity)
            or not router.keeps(loads, home, idle, avoid)
        )
        for v in views:
            if v is not here:
                if leaving:
                    refresh_kv(v, now)
                else:  # it stays, or moves by load alone
                    v.load.kv_demand = None
        return working.context(sid), working.resident(sid)

    def replied(self, replicas: Replicas, now: float) -> bool:
        """A call of the session got its reply at ``now``: its next call's idle counts
        from here, and its replica holds something of it. Whether the reply has more to
        teach: then its :class:`CallOutcome` goes to :meth:`learn`."""
        self.last_reply_at = now
        self.unserved = False
        return self.home is not None and (replicas.learn_retention or replicas.kv_aware)

    def learn(self, replicas: Replicas, outcome: CallOutcome) -> None:
        """What a call that got its reply (:meth:`replied`) tells of its replica: the
        session's context there now, until it sends again (the working set); if it
        resumed the session on the replica that served its previous turn, whether that
        replica still had the prefix (the working set's capacity, the retention
        estimate)."""
        index = outcome.replica
        previous, self.cacheable = self.cacheable, None
        prompt, cached = outcome.prompt_tokens, outcome.cached_tokens
        context = None if prompt is None else prompt + (outcome.completion_tokens or 0)
        view = replicas.views[index]
        if replicas.kv_aware and not self.ended:
            working = view.working_set
            wake_in = outcome.next_in_s
            now = outcome.ended_at
            working.finish(self.session_id, context, None if wake_in is None else now + wake_in)
            distance = self.distance
            if (
                distance is not None
                and previous is not None
                and previous[0] == index
                and cached is not None
                and not outcome.moved
                and not outcome.held_s  # held: its context was meant to age out
            ):
                working.observe(distance, previous[1], cached, prompt)
            if replicas.on_change is not None:
                replicas.on_change()
        if context is None:
            return
        self.cacheable = (index, context)
        idle_s = outcome.idle_s
        if replicas.learn_retention and (
            previous is not None
            and previous[0] == index
            and idle_s is not None
            and cached is not None
            and not outcome.moved
        ):
            hit = RetentionEstimator.hit(previous[1], cached)
            if hit is not None:
                view.retention.observe(idle_s, hit)

    def failed(self, replicas: Replicas) -> None:
        """A call of the session ended without a reply: its context is idle again."""
        if replicas.kv_aware and self.home is not None and not self.ended:
            replicas.views[self.home].working_set.finish(self.session_id, None, None)
            if replicas.on_change is not None:
                replicas.on_change()

    def unpin(self, replicas: Replicas) -> None:
        """The session ended: it no longer counts in its replica's load, nor in its
        working set. Idempotent."""
        if self.ended:
            return
        self.ended = True
        if self.home is not None:
            view = replicas.views[self.home]
            view.load.sessions -= 1
            if replicas.kv_aware:
                view.working_set.leave(self.session_id)
                if replicas.on_change is not None:
                    replicas.on_change()
