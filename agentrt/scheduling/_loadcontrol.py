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
  (``WorkingSet.demand``; a session waking later weighs in proportion). Otherwise the
  session is *held*: it counts in no demand (its KV ages out, or is released where the
  engine takes a directive) until there is room again. A sleeping session whose context
  is already evicted counts in no demand either (nothing of it is left to keep).
* **Work conservation.** A replica with no call in flight (none of this process's, none
  of other clients' that the engine shows) takes one held session (or first turn)
  whatever the room: the demand of sessions in tool waits never keeps a replica idle
  while sessions are held for it, as an OS's load control never idles the processor
  while processes are suspended. Every call's end looks again.
* **First turns** of new sessions are admitted only where there is room: on the replica
  with the most, which placement then keeps them on.
* **Resume order**: a held session whose context is still resident there first (it is
  cheap to resume), then the longest held. A session held past half of ``max_hold_s``
  reserves its replica (no new or evicted session is admitted there before it, on
  arrival or in a pass: large sessions do not starve behind small ones; one with no
  healthy home, the replica with the most room then, and only that one); a resident
  session's resume is held back only by room, never by a reservation (held, its context
  would age out: holding resident resumes behind reservations cost a fifth of the
  throughput past the knee). One held ``max_hold_s`` goes on whatever the room (a
  forced admission). No session waits past the bound.
* **Where**: a session resumes on its own replica, unless that replica is down, or its
  context is no longer resident there and another replica has room (nothing is lost).

A replica is gated against ``WorkingSet.gate_capacity`` (plus part of its host tier):
the engine's or configured figure; none (not gated) where neither is known. In a fleet
each process gates its own sessions, with no coordinator: on a replica where the engine
shows other clients' calls, it fills at most the capacity it learned from the evictions
its replies reveal (its share), and counts what the others' running requests hold there
as the engine reports it (``WorkingSet.others_tokens``).

Pure bookkeeping over narrow inputs (the replicas' working sets, their health, a clock):
no HTTP, no runtime state (docs/scheduling.md, "Load control").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import anyio

from ._workingset import WorkingSet

__all__ = ["ANY", "Gate", "Grant", "LoadControl", "LoadStatistics"]

ANY: Final = -1
"""A grant that names no replica: no capacity is known, the router chooses."""

_FULL: Final = -2

_SLACK: Final = 1e-6
"""A held session reaches the bound this close to it (seconds): the timer sleeps until
``since + max_hold_s``, and the clock it wakes to may read a rounding below that (where
``now - since`` fell one unit short of the bound, the timer slept 0 s again and again at
a clock that never moved: a virtual clock's replay spun there)."""


@dataclass(frozen=True, slots=True)
class LoadControl:
    """Load control's settings (``Runtime(load_control=...)``; ``True`` is these
    defaults, ``False`` turns it off).

    * **max_hold_s** - the longest a session waits at a tool boundary: held this long,
      it goes on whatever the room. Past half of it, it reserves its replica.
    * **watermark** - the share of a replica's KV capacity that live working sets may
      fill (the rest is headroom for decode and chunked prefill).
    * **tick_s** - how often held sessions look for room besides when calls end.
    * **host_weight** - the share of a replica's host tier (CPU offload, where its
      engine says how large) counted as room: a waiting session's context offloaded
      there comes back at a reload's cost, a fraction of a recompute's, but not free.
    """

    max_hold_s: float = 300.0
    watermark: float = 0.95
    tick_s: float = 1.0
    host_weight: float = 0.5

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
        if not (isinstance(self.host_weight, int | float) and 0 <= self.host_weight <= 1):
            raise ValueError(f"LoadControl host_weight must be in [0, 1], got {self.host_weight!r}")


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
    resident: bool = True
    """Its context may still be resident at home (once found gone, it stays gone while
    it is held: held, it touches nothing)."""
    checked: tuple[int, int] | None = None
    """Its home's (version, events) when :attr:`resident` was last worked out: it is
    worked out again only once they change."""
    target: int | None = None
    """Held past half the bound without a home to wait for (a first turn, or its home
    down): the replica it reserves, the one with the most room when it got there."""


class Gate:
    """Load control over the replicas' working sets (see the module docstring).

    ``working_sets[i]`` is replica ``i``'s working set (:class:`WorkingSet`), ``healthy(i)``
    whether it answers, ``clock`` the event loop's time.

    Held sessions look for room whenever something frees some (:meth:`changed`: a call
    ended, a session ended); besides, one of them (the *timer*) wakes every ``tick_s``
    to look for all of them and to apply the bound, so that a thousand held sessions
    cost one timeout, not a thousand.

    A look (a *pass* over the held sessions) runs only where it may tell something new:
    something it reads changed since the last one (a replica's working set, health,
    capacity, host tier or the engine's figures; a held session left), or a held
    session reached the bound, or half of it without a replica reserved yet. With
    nothing changed, a later look cannot admit what an earlier one did not: the room
    only shrinks as sleeping sessions near their wake, and reservations only grow."""

    __slots__ = (
        "_clock",
        "_dirty",
        "_healthy",
        "_passes",
        "_seen",
        "_timer",
        "_waiters",
        "_working_sets",
        "settings",
        "stats",
    )

    def __init__(
        self,
        working_sets: Sequence[WorkingSet],
        healthy: Callable[[int], bool],
        settings: LoadControl,
        clock: Callable[[], float],
    ) -> None:
        self._working_sets = working_sets
        self._healthy = healthy
        self.settings = settings
        self._clock = clock
        self._waiters: list[_Waiter] = []
        """The held sessions, the longest held first (appended as they come)."""
        self._timer: _Waiter | None = None
        self.stats = LoadStatistics()
        self._seen: tuple[object, ...] | None = None
        """What the last pass read (:meth:`_inputs`), taken as it began."""
        self._dirty = True
        """The held sessions changed (one left) since the last pass."""
        self._passes = 0
        """Passes over the held sessions so far (the tests count them)."""

    # ------------------------------------------------------------ the room

    def _rooms(self, now: float, exclude: str | None = None) -> list[tuple[float, bool] | None]:
        """Each replica's room (tokens its live working set leaves under the watermark,
        ``exclude``'s context left out) and whether it is *idle*: nothing lives there,
        or no call runs there (none of this process's in flight or admitted, and none
        of other clients' that the engine shows). An idle replica takes one session
        whatever the room (work conservation: sleeping sessions' demand never keeps a
        replica idle while sessions are held for it); None where its capacity is
        unknown (it is not gated)."""
        out: list[tuple[float, bool] | None] = []
        watermark, host = self.settings.watermark, self.settings.host_weight
        for ws in self._working_sets:
            capacity = ws.gate_capacity
            if capacity is None:
                out.append(None)
                continue
            # Others': on a replica shared with other clients, what their running
            # requests hold there as the engine reports it (0 where this process is alone).
            demand = ws.demand(now, exclude) + ws.others_tokens()
            room = (capacity + host * ws.host_tokens) * watermark - demand
            idle = demand <= 0.0 or (ws.busy_tokens() == 0 and ws.others_tokens() <= 0.0)
            out.append((room, idle))
        return out

    def _up(self) -> list[bool]:
        """Each replica's health, read once for a pass."""
        return [self._healthy(i) for i in range(len(self._working_sets))]

    def _place(
        self,
        home: int | None,
        tokens: int,
        rooms: list[tuple[float, bool] | None],
        reserved: set[int],
        up: list[bool],
        movable: bool = False,
    ) -> int:
        """Where a session of ``tokens`` may go now: its home if it fits there; a new
        (or homeless) session, or one ``movable`` (its context no longer resident at
        home: nothing is lost by moving), the healthy replica (``up``) with the most
        room where it fits, :data:`ANY` where some capacity is unknown; else
        ``_FULL``."""
        home_up = home is not None and up[home]
        if home_up:
            assert home is not None
            room = rooms[home]
            if home not in reserved and (room is None or room[1] or room[0] >= tokens):
                return home
            if not movable:
                return _FULL
        healthy = range(len(rooms)) if True not in up else (i for i, ok in enumerate(up) if ok)
        best, most = _FULL, -math.inf
        for i in healthy:
            room = rooms[i]
            if room is None:
                return ANY if not home_up else _FULL
            if i in reserved or i == home:
                continue
            if (room[1] or room[0] >= tokens) and room[0] > most:
                best, most = i, room[0]
        return best

    def _tokens(self, session_id: str, home: int | None, tokens: int) -> int:
        if home is None:
            return tokens
        return max(tokens, self._working_sets[home].context(session_id))

    def _resident(self, session_id: str, home: int | None) -> bool:
        """Whether at least half the session's context is likely still cached at home."""
        if home is None:
            return False
        ws = self._working_sets[home]
        resident = ws.resident(session_id)
        return resident is not None and 2 * resident >= ws.context(session_id) > 0

    def _still_resident(self, w: _Waiter) -> bool:
        """Whether the held session's context may still be resident at home: worked out
        again only where its home changed since it last was (the answer reads nothing
        else)."""
        home = w.home
        if not w.resident or home is None:
            w.resident = False
            return False
        ws = self._working_sets[home]
        exact = ws.exact
        key = (ws.version, -1 if exact is None else exact.events)
        if key != w.checked:
            w.checked = key
            w.resident = self._resident(w.session_id, home)
        return w.resident

    def _inputs(self) -> tuple[object, ...]:
        """What a pass reads besides the time and the held sessions: each replica's
        working set (its version and its engine's events), health, capacity, host tier
        and the engine's figures."""
        out: list[object] = []
        healthy = self._healthy
        for i, ws in enumerate(self._working_sets):
            exact = ws.exact
            out.append(
                (
                    ws.version,
                    -1 if exact is None else exact.events,
                    healthy(i),
                    ws.capacity,
                    ws.host_tokens,
                    ws.engine_used,
                    ws.shared_at,
                )
            )
        return tuple(out)

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
            up = self._up()
            rooms = self._rooms(now, session_id)
            movable = home is not None and not self._resident(session_id, home)
            # A resident resume is held back by room alone, not by reservations.
            reserved = set() if home is not None and not movable else self._reserved(now, up)
            index = self._place(home, tokens, rooms, reserved, up, movable)
            if index != _FULL:
                self._grant(session_id, index, tokens)
                return Grant(index, 0.0, False)
        w = _Waiter(session_id, home, tokens, now)
        if home is not None:
            self._working_sets[home].hold(session_id)
        self._waiters.append(w)
        self._dirty = True
        stats = self.stats
        stats.holds += 1
        stats.held_now += 1
        tick, bound = self.settings.tick_s, self.settings.max_hold_s
        try:
            self._look(now)  # its leaving may make room for a resident one
            while w.index == _FULL:
                if self._timer is None:
                    self._timer = w
                if self._timer is w:
                    # Until the next tick, or the oldest held session's bound if sooner.
                    # (Past a look, nobody is within _SLACK of it: the sleep moves the clock.)
                    due = self._waiters[0].since + bound - self._clock()
                    with anyio.move_on_after(max(min(tick, due), 0.0)):
                        await w.event.wait()
                    if w.index == _FULL:
                        self._look(self._clock())
                else:
                    await w.event.wait()
                if w.index == _FULL:
                    w.event = anyio.Event()  # woken to become the timer
        finally:
            stats.held_now -= 1
            if w.index == _FULL:  # cancelled while held
                self._waiters.remove(w)
                self._dirty = True  # its reservation, if any, is gone
            if self._timer is w:
                self._timer = None
                if self._waiters:  # the next one keeps time
                    self._waiters[0].event.set()
        held = self._clock() - w.since
        stats.held_s += held
        stats.longest_s = max(stats.longest_s, held)
        if w.forced:
            stats.forced += 1
        return Grant(w.index, held, w.forced)

    def _grant(self, session_id: str, index: int, tokens: int) -> None:
        if index >= 0:
            self._working_sets[index].admit(session_id, tokens)

    def _reserved(self, now: float, up: list[bool]) -> set[int]:
        """Replicas reserved for sessions held past half the bound: each its home, or,
        without a healthy home, its target (:meth:`_targets`)."""
        half = self.settings.max_hold_s / 2
        out: set[int] = set()
        rooms: list[tuple[float, bool] | None] | None = None
        for w in self._waiters:  # the longest held first
            if now - w.since < half:
                break
            if w.home is not None and up[w.home]:
                out.add(w.home)
                continue
            if rooms is None:
                rooms = self._rooms(now)
                self._targets(now, rooms, up)
            if w.target is not None:
                out.add(w.target)
        return out

    def _targets(self, now: float, rooms: list[tuple[float, bool] | None], up: list[bool]) -> None:
        """Give each session held past half the bound without a healthy home to wait for
        (a first turn, or its home down) the replica it reserves, where it has none yet
        (or that one is down): the healthy one with the most room, another's target
        left out where another is left; kept while it stays healthy."""
        half = self.settings.max_hold_s / 2
        healthy = [i for i, ok in enumerate(up) if ok] or list(range(len(up)))
        taken: set[int] = set()
        pending: list[_Waiter] = []
        for w in self._waiters:  # the longest held first
            if now - w.since < half:
                break
            if w.home is not None and up[w.home]:
                continue
            if w.target is not None and up[w.target]:
                taken.add(w.target)
            else:
                pending.append(w)
        for w in pending:
            free = [i for i in healthy if i not in taken] or healthy
            w.target = max(free, key=lambda i: _room(rooms[i]))
            taken.add(w.target)

    def changed(self) -> None:
        """Something freed room (a call ended, a session ended or moved): the held
        sessions that now fit go on."""
        if self._waiters:
            self._look(self._clock())

    def _look(self, now: float) -> None:
        """A pass over the held sessions, where it may tell something new (the class
        docstring): else it is skipped, its outcome known (nobody goes on)."""
        waiters = self._waiters
        if not waiters:
            return
        inputs = self._inputs()
        if self._dirty or inputs != self._seen or self._due(now):
            self._dispatch(now, inputs)

    def _due(self, now: float) -> bool:
        """Whether time alone may change a pass's outcome: a held session reached the
        bound, or half of it without a replica reserved yet (:meth:`_targets`)."""
        bound = self.settings.max_hold_s
        waiters = self._waiters
        if now >= waiters[0].since + bound - _SLACK:
            return True
        half = bound / 2
        for w in waiters:  # the longest held first
            if now - w.since < half:
                break
            if w.target is None and (w.home is None or not self._healthy(w.home)):
                return True
        return False

    def _dispatch(self, now: float, inputs: tuple[object, ...] | None = None) -> None:
        """Grant the held sessions that fit now (resident ones first, then the longest
        held), and those held ``max_hold_s`` whatever the room."""
        waiters = self._waiters
        if not waiters:
            return
        self._passes += 1
        self._seen = self._inputs() if inputs is None else inputs
        self._dirty = False
        up = self._up()
        bound = self.settings.max_hold_s
        rooms = self._rooms(now)
        for w in waiters:
            self._still_resident(w)
        self._targets(now, rooms, up)
        if now < waiters[0].since + bound - _SLACK and not self._any_fits(waiters, rooms, up):
            return  # nothing is due and nothing fits: the common case when full
        half = bound / 2
        reserved: set[int] = set()
        order = sorted(waiters, key=lambda w: (not w.resident, w.since))
        for w in order:  # reservations keep the non-resident ones off, as on arrival
            waited = now - w.since
            home = w.home
            index = self._place(
                home, w.tokens, rooms, set() if w.resident else reserved, up, not w.resident
            )
            if index == _FULL and now >= w.since + bound - _SLACK:
                w.forced = True
                if home is not None and up[home]:
                    index = home
                else:
                    index = self._place(None, 0, rooms, set(), up)
                    if index == _FULL:
                        index = ANY
            if index == _FULL:
                if waited >= half:  # nobody else is admitted where it waits
                    if home is not None and up[home]:
                        reserved.add(home)
                    elif w.target is not None:  # only the replica it would take
                        reserved.add(w.target)
                continue
            waiters.remove(w)
            w.index = index
            self._grant(w.session_id, index, w.tokens)
            room = rooms[index] if index >= 0 else None
            if room is not None:
                rooms[index] = (room[0] - w.tokens, False)
            w.event.set()

    def _any_fits(
        self, waiters: list[_Waiter], rooms: list[tuple[float, bool] | None], up: list[bool]
    ) -> bool:
        """Whether some held session may fit somewhere now (a quick look, reservations
        aside)."""
        widest = -math.inf
        for i, room in enumerate(rooms):
            if room is None or room[1]:
                return True
            if up[i]:
                widest = max(widest, room[0])
        for w in waiters:
            home = w.home
            if home is not None and up[home]:
                room = rooms[home]
                if room is not None and room[0] >= w.tokens:
                    return True
                if w.resident:
                    continue  # it waits for its home
            if widest >= w.tokens:
                return True
        return False

    @property
    def held(self) -> int:
        """Sessions held now."""
        return len(self._waiters)


def _room(room: tuple[float, bool] | None) -> float:
    """A replica's room as a number (unknown capacity: unbounded)."""
    return math.inf if room is None else room[0]
