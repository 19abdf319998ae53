"""Load control: past the knee, whole sessions wait at their tool boundaries instead of
every session paging.

When the working sets of the processes that run exceed memory, an operating system does
not let them all page: it suspends whole processes until the rest fit, and resumes them
later (Denning's working-set model, "load control"). A cluster of LLM replicas thrashes
the same way: past the knee every turn evicts someone else's context, and the engines
re-prefill what they had cached. agentrt knows what an OS knows of its processes: each
session's working set (the context it sends), when it wakes (the tool wait declared or
learned) and when it ends, and it sends every resume. :class:`Gate` uses them:

* **Admission at the tool boundary.** A session's next call (never a call in progress,
  nor a stream) goes on while its context fits in its replica's KV beside the *live*
  working set there: the sessions running or due to wake within the horizon
  (``KvShadow.demand``; a session waking later weighs in proportion). Otherwise the
  session is *held*: it counts in no demand (its KV ages out, or is released where the
  engine takes a directive) until there is room again.
* **First turns** of new sessions are admitted only where there is room: on the replica
  with the most, which placement then keeps them on.
* **Resume order**: a held session whose context is still resident there first (it is
  cheap to resume), then the longest held. A session held past half of ``max_hold_s``
  reserves its replica (nobody else is admitted there before it: large sessions do not
  starve behind small ones), and one held ``max_hold_s`` goes on whatever the room (a
  forced admission). No session waits past the bound.
* **Where**: a session resumes on its own replica, unless that replica is down.

A replica whose capacity is not known (no engine figure, no setting, no eviction seen
yet) is not gated. In a fleet each process gates its own sessions on its own view: the
capacity a process learns from the evictions its replies reveal is its share of the
replica (``KvShadow.observe``), so K processes that each admit up to their share do not
overcommit the replica together; no coordinator is needed.

Pure bookkeeping over narrow inputs (the replicas' working sets, their health, a clock):
no HTTP, no runtime state (docs/scheduling.md, "Load control").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import anyio

from ._workingset import KvShadow

__all__ = ["ANY", "Gate", "Grant", "LoadControl", "LoadStatistics"]

ANY: Final = -1
"""A grant that names no replica: no capacity is known, the router chooses."""

_FULL: Final = -2


@dataclass(frozen=True, slots=True)
class LoadControl:
    """Load control's settings (``Runtime(load_control=...)``; ``True`` is these
    defaults, ``False`` turns it off).

    * **max_hold_s** - the longest a session waits at a tool boundary: held this long,
      it goes on whatever the room. Past half of it, it reserves its replica.
    * **watermark** - the share of a replica's KV capacity that live working sets may
      fill (the rest is headroom for decode and chunked prefill).
    * **tick_s** - how often held sessions look for room besides when calls end.
    """

    max_hold_s: float = 300.0
    watermark: float = 0.95
    tick_s: float = 1.0

    def __post_init__(self) -> None:
        if not (
            isinstance(self.max_hold_s, int | float)
            and math.isfinite(self.max_hold_s)
            and self.max_hold_s > 0
        ):
            raise ValueError(
                f"LoadControl max_hold_s must be a finite number > 0, got {self.max_hold_s!r}"
            )
        if not (isinstance(self.watermark, int | float) and 0 < self.watermark <= 1.5):
            raise ValueError(
                f"LoadControl watermark must be in (0, 1.5] (a share of the KV capacity), "
                f"got {self.watermark!r}"
            )
        if not (isinstance(self.tick_s, int | float) and math.isfinite(self.tick_s)):
            raise ValueError(f"LoadControl tick_s must be a finite number, got {self.tick_s!r}")
        if not self.tick_s > 0:
            raise ValueError(f"LoadControl tick_s must be > 0, got {self.tick_s!r}")


@dataclass(slots=True)
class LoadStatistics:
    """What load control did so far (``rt.load_statistics()``)."""

    held_now: int = 0
    """Sessions waiting at a tool boundary now."""
    holds: int = 0
    """Boundaries at which a session was held (each counted once)."""
    forced: int = 0
    """Holds that ended at ``max_hold_s`` without room (forced admissions)."""
    held_s: float = 0.0
    """Seconds held, summed over every hold that ended."""
    longest_s: float = 0.0
    """The longest single hold."""


class Grant(NamedTuple):
    """What :meth:`Gate.admit` granted."""

    replica: int
    """The replica (:data:`ANY`: the router chooses)."""
    held_s: float
    """Seconds the session was held (0.0: it went on at once)."""
    forced: bool
    """The bound forced it on without room."""


@dataclass(slots=True, eq=False)
class _Waiter:
    session_id: str
    home: int | None
    tokens: int
    since: float
    event: anyio.Event = field(default_factory=anyio.Event)
    index: int = _FULL
    forced: bool = False


class Gate:
    """Load control over the replicas' working sets (see the module docstring).

    ``shadows[i]`` is replica ``i``'s working set (:class:`KvShadow`), ``healthy(i)``
    whether it answers, ``clock`` the event loop's time."""

    __slots__ = ("_clock", "_healthy", "_last", "_shadows", "_waiters", "settings", "stats")

    def __init__(
        self,
        shadows: Sequence[KvShadow],
        healthy: Callable[[int], bool],
        settings: LoadControl,
        clock: Callable[[], float],
    ) -> None:
        self._shadows = shadows
        self._healthy = healthy
        self.settings = settings
        self._clock = clock
        self._waiters: list[_Waiter] = []
        self._last = -math.inf
        self.stats = LoadStatistics()

    # ------------------------------------------------------------ the room

    def _fits(self, i: int, session_id: str, tokens: int, now: float) -> bool:
        """Whether ``tokens`` of the session fit in replica ``i`` beside its live working
        set (always, where the capacity is unknown or nothing else lives there)."""
        shadow = self._shadows[i]
        capacity = shadow.capacity_tokens
        if capacity is None:
            return True
        others = shadow.demand(now, session_id)
        return others <= 0.0 or others + tokens <= capacity * self.settings.watermark

    def _place(
        self, session_id: str, home: int | None, tokens: int, now: float, reserved: set[int]
    ) -> int:
        """Where the session may go now: its home if it fits there; a new (or homeless)
        session the healthy replica with the most room where it fits, :data:`ANY` where
        some capacity is unknown; else ``_FULL``."""
        shadows = self._shadows
        n = len(shadows)
        if home is not None and self._healthy(home):
            if home in reserved:
                return _FULL
            return home if self._fits(home, session_id, tokens, now) else _FULL
        healthy = [i for i in range(n) if self._healthy(i)] or list(range(n))
        best, most = _FULL, -math.inf
        for i in healthy:
            capacity = shadows[i].capacity_tokens
            if capacity is None:
                return ANY
            if i in reserved:
                continue
            others = shadows[i].demand(now, session_id)
            room = capacity * self.settings.watermark - others
            if (others <= 0.0 or room >= tokens) and room > most:
                best, most = i, room
        return best

    def _tokens(self, session_id: str, home: int | None, tokens: int) -> int:
        if home is None:
            return tokens
        return max(tokens, self._shadows[home].context(session_id))

    def _resident(self, w: _Waiter) -> bool:
        if w.home is None:
            return False
        shadow = self._shadows[w.home]
        resident = shadow.resident(w.session_id)
        return resident is not None and 2 * resident >= shadow.context(w.session_id) > 0

    # ------------------------------------------------------------ admission

    async def admit(self, session_id: str, home: int | None, tokens: int) -> Grant:
        """Wait until the session's next call may go: ``home`` its replica (None: a new
        session), ``tokens`` the call's estimated tokens. Returns the replica granted
        (:data:`ANY`: the router chooses), the seconds held (0.0 when it went on at
        once) and whether the bound forced the grant. The session counts in its
        replica's demand from the grant on."""
        now = self._clock()
        tokens = self._tokens(session_id, home, tokens)
        # A running session's resume goes on where it fits; a new session queues behind
        # the held ones (they came first).
        if home is not None or not self._waiters:
            index = self._place(session_id, home, tokens, now, self._reserved(now))
            if index != _FULL:
                self._grant_now(session_id, index, tokens)
                return Grant(index, 0.0, False)
        w = _Waiter(session_id, home, tokens, now)
        if home is not None:
            self._shadows[home].hold(session_id)
        self._waiters.append(w)
        stats = self.stats
        stats.holds += 1
        stats.held_now += 1
        tick, bound = self.settings.tick_s, self.settings.max_hold_s
        try:
            self._dispatch(now)  # its leaving may make room for a resident one
            while w.index == _FULL:
                left = w.since + bound - self._clock()
                with anyio.move_on_after(max(min(tick, left), 0.0)):
                    await w.event.wait()
                now = self._clock()
                # One look a tick for all the held sessions (each wakes each tick).
                if w.index == _FULL and (now - self._last >= tick / 2 or now - w.since >= bound):
                    self._dispatch(now)
        finally:
            stats.held_now -= 1
            if w.index == _FULL:  # cancelled while held
                self._waiters.remove(w)
        held = self._clock() - w.since
        stats.held_s += held
        stats.longest_s = max(stats.longest_s, held)
        if w.forced:
            stats.forced += 1
        return Grant(w.index, held, w.forced)

    def _grant_now(self, session_id: str, index: int, tokens: int) -> None:
        if index >= 0:
            self._shadows[index].start(session_id, tokens)

    def _reserved(self, now: float) -> set[int]:
        """Replicas reserved for sessions held past half the bound."""
        half = self.settings.max_hold_s / 2
        out: set[int] = set()
        for w in self._waiters:
            if now - w.since >= half:
                if w.home is not None and self._healthy(w.home):
                    out.add(w.home)
                else:
                    out.update(range(len(self._shadows)))
        return out

    def changed(self) -> None:
        """Something freed room (a call ended, a session ended or moved): the held
        sessions that now fit go on."""
        if self._waiters:
            self._dispatch(self._clock())

    def _dispatch(self, now: float) -> None:
        waiters = self._waiters
        if not waiters:
            return
        self._last = now
        bound = self.settings.max_hold_s
        half = bound / 2
        reserved: set[int] = set()
        order = sorted(waiters, key=lambda w: (not self._resident(w), w.since))
        for w in order:
            waited = now - w.since
            index = self._place(w.session_id, w.home, w.tokens, now, reserved)
            if index == _FULL and waited >= bound:
                w.forced = True
                home = w.home
                if home is not None and self._healthy(home):
                    index = home
                else:
                    index = self._place(w.session_id, None, 0, now, set())
                    if index == _FULL:
                        index = ANY
            if index == _FULL:
                if waited >= half:  # nobody else is admitted where it waits
                    if w.home is not None and self._healthy(w.home):
                        reserved.add(w.home)
                    else:
                        reserved.update(range(len(self._shadows)))
                continue
            waiters.remove(w)
            w.index = index
            self._grant_now(w.session_id, index, w.tokens)
            w.event.set()

    @property
    def held(self) -> int:
        """Sessions held now."""
        return len(self._waiters)
