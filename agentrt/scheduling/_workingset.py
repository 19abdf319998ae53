"""Each replica's KV working set, as the client sees it: the sessions placed there, how
many tokens of context each holds, when each last touched its cache and when it will
next send.

An operating system places and swaps processes by their working sets, the memory's
capacity and when a sleeper wakes. agentrt knows the same of its sessions: the context
it sent (and the reply's size), the tool wait declared or learned after each reply, and
when the session ended. :class:`WorkingSet` keeps them per replica, and answers the two
questions placement asks (``docs/routing.md``, "Placement by working set"):

* **Will a waking session find its context at home?** A prefix cache evicts the least
  recently used blocks first (vLLM frees a request's blocks tail first, so a session
  losing part of its context keeps its prefix). A session's context is still cached if
  the tokens touched there since it last touched its own (its *stack distance*: the
  contexts of the sessions that ran after it) plus its own fit in the replica's capacity:
  :meth:`WorkingSet.resident` is that estimate, in tokens.
* **How full is each replica?** :meth:`WorkingSet.demand`: the contexts of its live
  sessions, each weighted by how soon it will send again (a session with a call in
  flight, or whose wait is unknown or ends within ``horizon_s``, weighs fully; one
  waking later weighs ``horizon_s / time to wake``; a session whose job ended weighs
  nothing: it is gone from the working set).

The capacity comes from a setting where one is given (``Endpoint(kv_capacity=)``: a user
who names it wins), else from the engine where it says (vLLM's
``vllm:cache_config_info``: ``num_gpu_blocks * block_size``; the embedded engine serves
the same gauge), and is corrected by what replies report: a resumed turn whose cached tokens
fall short of its previous context reveals an eviction, and how much the cache held
above it (:meth:`WorkingSet.observe`). In a fleet each process sees only its own sessions,
so the capacity it learns is its share: the estimate stays consistent with the view.

Where the engine publishes its KV-cache events (vLLM's ``--kv-events-config``, the
embedded engine's), :attr:`WorkingSet.exact` holds the replica's ledger of them
(``_kvevents.KvLedger``): :meth:`WorkingSet.resident` is then the session's context still
cached there, exactly, wherever the ledger could tell which blocks are the session's; the
capacity is learned from the evictions the events show rather than guessed from replies;
:meth:`WorkingSet.cached_tokens` is the replica's cached tokens. Where the ledger cannot
tell (a session whose blocks it could not assign), the estimate above stands.

Pure bookkeeping: no HTTP, no clock of its own (times are given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from ._kvevents import KvLedger

__all__ = [
    "DEFAULT_HORIZON_S",
    "CapacitySource",
    "WorkingSet",
]

DEFAULT_HORIZON_S: Final = 30.0
"""A sleeping session waking within this many seconds weighs fully in its replica's
demand; one waking later weighs ``horizon / time to wake``."""

SHARED_FOR_S: Final = 120.0
"""A replica where other clients' calls were seen counts as shared this long after."""

_LEARN_RATE: Final = 0.25
"""How far one observation moves the learned capacity toward what it revealed."""

_MIN_CONTEXT: Final = 256
"""Smallest previous context (tokens) whose resume is evidence about the capacity."""

CapacitySource = Literal["engine", "setting", "learned"]
"""Where a replica's KV capacity came from (``rt.endpoint_loads()``, the journal)."""


@dataclass(slots=True)
class _Footprint:
    tokens: int
    """Context tokens the session holds there (prompt + completion of its last call, or
    the estimate of the call in flight)."""
    touched: int
    """When it last touched its cache: a sequence number, larger is later."""
    wake_at: float | None
    """When it is expected to send again (None: unknown)."""
    busy: bool
    """A call of it is in flight there."""
    held: bool = False
    """Load control holds it at its tool boundary (suspended): it counts in no demand
    until its next call starts (``scheduling/_loadcontrol.py``)."""


class WorkingSet:
    """One replica's KV working set as placed by this client (see the module docstring).

    ``capacity`` is the engine-reported or configured capacity in tokens (None unknown);
    :attr:`capacity_tokens` is the estimate in use, corrected by observations.
    """

    __slots__ = (
        "_demand",
        "_given",
        "_learned",
        "_seq",
        "_sessions",
        "_version",
        "capacity",
        "engine_used",
        "evictions",
        "exact",
        "horizon_s",
        "host_tokens",
        "shared_at",
    )

    def __init__(
        self,
        capacity: int | None = None,
        *,
        source: CapacitySource = "setting",
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"KV capacity must be > 0 tokens, got {capacity!r}")
        if not (horizon_s > 0 and math.isfinite(horizon_s)):
            raise ValueError(f"horizon_s must be a finite number > 0, got {horizon_s!r}")
        self.capacity = capacity
        self.host_tokens = 0
        self.engine_used: float | None = None
        """Tokens of KV the engine's running requests hold, as its last poll said
        (``vllm:kv_cache_usage_perc`` times the capacity; None unpolled): on a shared
        replica, load control counts what of it is not this process's as taken."""
        self.shared_at: float | None = None
        """When the engine last showed calls of other clients (its polled running and
        waiting above this process's own), None if never (:meth:`saw_others`)."""
        """The replica's host tier (CPU offload) in tokens, where its engine says
        (``num_cpu_blocks`` on ``vllm:cache_config_info``): load control counts part of
        it as room (a reload costs a fraction of a recompute)."""
        self._given: CapacitySource = source
        self.horizon_s = horizon_s
        self._learned: float | None = None
        self._sessions: dict[str, _Footprint] = {}
        self._seq = 0
        self._version = 0
        """Bumped on every change of the sessions or the learned capacity
        (:attr:`version`)."""
        self._demand: (
            tuple[tuple[int, int, float | None, int], float, float, frozenset[str]] | None
        ) = None
        """(version, since, demand): :meth:`demand` with nobody left out, kept while
        nothing changes from ``since`` on (only where no live session weighs in part:
        then later times give the same figure)."""
        self.evictions = 0
        """Resumed turns that found part of their context evicted here."""
        self.exact: KvLedger | None = None
        """The replica's KV-cache events, where it publishes them and they are read
        (module docstring); None: the estimate alone."""

    # ------------------------------------------------------------ what it knows

    @property
    def capacity_tokens(self) -> float | None:
        """The capacity placement assumes: the learned one once an eviction was seen
        (never above the engine's or configured one), else that one; None if unknown.
        With the engine's events and no figure from the engine or a setting, what the
        cache held when it last evicted stands for the learned one."""
        learned = self._learned_now()
        if learned is None:
            return None if self.capacity is None else float(self.capacity)
        return learned if self.capacity is None else min(learned, float(self.capacity))

    @property
    def gate_capacity(self) -> float | None:
        """The capacity load control fills, None (no gate) where neither the engine nor
        a setting gave one: the engine's or configured figure while this process is
        alone on the replica (it must not hold sessions back below what the replica
        holds); on a shared one, the learned figure where lower, which in a fleet is
        this process's share (the module docstring). A capacity learned without a
        figure to bound it runs low (it held the demand's light load back by a fifth in
        the golden replays), so it gates nothing."""
        if self.capacity is None:
            return None  # learned alone, the figure runs low: no gate on a guess
        if self.shared_at is None:
            return float(self.capacity)
        return self.capacity_tokens

    def saw_others(self, others: bool, now: float) -> None:
        """A poll of the engine: whether it showed other clients' calls. A replica
        counts as shared from the first sighting until none was seen for
        :data:`SHARED_FOR_S`."""
        if others:
            self.shared_at = now
        elif self.shared_at is not None and now - self.shared_at > SHARED_FOR_S:
            self.shared_at = None

    @property
    def source(self) -> CapacitySource | None:
        """Where :attr:`capacity_tokens` comes from (None while unknown)."""
        learned = self._learned_now()
        if learned is not None and (self.capacity is None or learned < self.capacity):
            return "learned"
        return None if self.capacity is None else self._given

    def _learned_now(self) -> float | None:
        exact = self.exact
        if exact is None:
            return self._learned
        if self.capacity is not None:
            return None  # the engine's (or configured) figure; the events only confirm it
        seen = exact.capacity_seen()
        return None if seen is None else float(seen)

    @property
    def version(self) -> int:
        """A number that changes whenever the working set does (a session started, admitted,
        held, finished or left; the learned capacity moved): with the same version and
        the same figures from outside (capacity, host tier, the engine's), what it says
        of its sessions only changes with the time (load control skips a look that
        cannot tell anything new)."""
        return self._version

    @property
    def sessions(self) -> int:
        """Sessions in the working set (live, placed here)."""
        return len(self._sessions)

    def contexts(self) -> dict[str, int]:
        """Each live session's context tokens here, by session id (a copy)."""
        return {sid: f.tokens for sid, f in self._sessions.items()}

    def tokens(self) -> int:
        """Context tokens of the live sessions here, unweighted."""
        return sum(f.tokens for f in self._sessions.values())

    def busy_tokens(self) -> int:
        """Context tokens of this process's sessions with a call in flight here."""
        return sum(f.tokens for f in self._sessions.values() if f.busy)

    def others_tokens(self) -> float:
        """On a shared replica (:meth:`saw_others`), the KV other clients' running
        requests hold there as the engine last reported it; 0.0 elsewhere."""
        used = self.engine_used
        if self.shared_at is None or used is None:
            return 0.0
        return max(used - self.busy_tokens(), 0.0)

    def demand(self, now: float, exclude: str | None = None) -> float:
        """Tokens the live sessions here will want cached soon: each session's context
        weighted by how soon it sends (module docstring); sessions held by load control
        and ``exclude`` left out, and so are sleeping sessions whose context is already
        evicted (:meth:`evicted`): there is nothing of theirs left to keep, and their
        next call recomputes it wherever it goes."""
        exact = self.exact
        key = (
            self._version,
            -1 if exact is None else exact.events,
            self.capacity_tokens,
            self.host_tokens,
        )
        cached = self._demand
        if cached is not None and cached[0] == key and now >= cached[1]:
            # Nothing changed and every live session weighed fully then: it still does
            # (a session due by then stays due), and the figure is a sum of integers, so
            # leaving one out is exact.
            f = None if exclude is None else self._sessions.get(exclude)
            if f is None or f.held or exclude in cached[3]:
                return cached[2]
            return cached[2] - f.tokens
        horizon = self.horizon_s
        gone = self.evicted()
        total = 0.0
        partial = False
        for sid, f in self._sessions.items():
            if f.held or sid == exclude or sid in gone:
                continue
            wake = f.wake_at
            if f.busy or wake is None or wake - now <= horizon:
                total += f.tokens
            else:
                total += f.tokens * horizon / (wake - now)
                partial = True
        if exclude is None and not partial:
            self._demand = (key, now, total, gone)
        return total

    def evicted(self) -> frozenset[str]:
        """The sessions without a call in flight here whose context is likely evicted
        already (under half of it resident, by :meth:`resident`'s rule), worked out for
        all of them in one pass: none while neither the capacity nor the engine's
        events are known. A host tier holds what the accelerator evicts (it comes back
        at a reload's cost): there a context is gone only once it would have left both,
        by the estimate (the events tell the accelerator's cache alone)."""
        capacity = self.capacity_tokens
        exact = self.exact
        if self.host_tokens > 0:
            exact = None
            if capacity is not None:
                capacity += self.host_tokens
        if capacity is None and exact is None:
            return frozenset()
        sessions = self._sessions
        busy = sum(f.tokens for f in sessions.values() if f.busy)
        out: list[str] = []
        later = 0  # tokens of the idle sessions touched after this one
        idle = sorted(
            ((sid, f) for sid, f in sessions.items() if not f.busy),
            key=lambda item: -item[1].touched,
        )
        for sid, f in idle:
            resident: int | None = None
            if exact is not None:
                known = exact.resident(sid)
                if known is not None:
                    resident = min(known, f.tokens)
            if resident is None and capacity is not None:
                resident = int(min(max(capacity - busy - later, 0.0), float(f.tokens)))
            if resident is not None and 2 * resident < f.tokens:
                out.append(sid)
            later += f.tokens
        return frozenset(out)

    def context(self, session_id: str) -> int:
        """The session's context tokens here (0 if it holds none)."""
        f = self._sessions.get(session_id)
        return 0 if f is None else f.tokens

    def stack_distance(self, session_id: str) -> int:
        """Tokens touched here since the session last touched its own context: the
        contexts of the sessions that ran after it (in flight ones included)."""
        f = self._sessions.get(session_id)
        if f is None:
            return 0
        since = f.touched
        return sum(
            o.tokens
            for sid, o in self._sessions.items()
            if (o.touched > since or o.busy) and sid != session_id
        )

    def cached_tokens(self) -> int | None:
        """Tokens the replica caches now, from its events; None without them."""
        exact = self.exact
        return None if exact is None else exact.cached_tokens()

    def resident(self, session_id: str) -> int | None:
        """Tokens of the session's context still cached here: from the engine's events
        where they tell (:attr:`exact`), else likely so (LRU: what fits above the stack
        distance), or None while the capacity is unknown."""
        f = self._sessions.get(session_id)
        if f is None:
            return 0
        exact = self.exact
        if exact is not None:
            known = exact.resident(session_id)
            if known is not None:
                return min(known, f.tokens)
        capacity = self.capacity_tokens
        if capacity is None:
            return None
        room = capacity - self.stack_distance(session_id)
        return int(min(max(room, 0.0), float(f.tokens)))

    # ------------------------------------------------------------ what happens

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    def _changed(self) -> None:
        self._version += 1

    def start(self, session_id: str, tokens: int) -> None:
        """A call of the session was sent here: its context (at least ``tokens``) is
        touched and in use."""
        self._changed()
        if self.exact is not None:
            self.exact.started(session_id)
        f = self._sessions.get(session_id)
        if f is None:
            self._sessions[session_id] = _Footprint(tokens, self._tick(), None, True)
            return
        f.tokens = max(f.tokens, tokens)
        f.touched = self._tick()
        f.busy = True
        f.held = False

    def admit(self, session_id: str, tokens: int) -> None:
        """Load control admitted the session's next call here: from now on its context
        (at least ``tokens``) counts in the demand, as if in flight, so that nobody else
        takes its room. Not a touch: :meth:`start` touches it when the call is sent (its
        stack distance, measured then, stays the one since its previous call)."""
        self._changed()
        f = self._sessions.get(session_id)
        if f is None:
            self._sessions[session_id] = _Footprint(tokens, self._tick(), None, True)
            return
        f.tokens = max(f.tokens, tokens)
        f.busy = True
        f.held = False

    def hold(self, session_id: str) -> None:
        """Load control suspended the session at its tool boundary: its context counts in
        no demand here until its next call starts (it ages out of the cache as others
        run; :meth:`resident` tells how much is left)."""
        self._changed()
        f = self._sessions.get(session_id)
        if f is not None:
            f.held = True
            f.busy = False

    def held(self, session_id: str) -> bool:
        """Whether load control holds the session here."""
        f = self._sessions.get(session_id)
        return f is not None and f.held

    def finish(self, session_id: str, tokens: int | None, wake_at: float | None) -> None:
        """The session's call here ended: it holds ``tokens`` of context (None: as
        before) and will send again at ``wake_at`` (None: unknown)."""
        self._changed()
        if self.exact is not None:
            self.exact.finished(session_id)
        f = self._sessions.get(session_id)
        if f is None:
            return
        if tokens is not None:
            f.tokens = tokens
        f.touched = self._tick()
        f.busy = False
        f.wake_at = wake_at

    def leave(self, session_id: str) -> None:
        """The session ended, or moved away: its context counts here no more."""
        self._changed()
        self._sessions.pop(session_id, None)
        if self.exact is not None:
            self.exact.forget(session_id)

    def observe(self, distance: int, previous: int, cached: int, prompt: int | None = None) -> None:
        """A resumed turn here: ``previous`` tokens of context left by its last call,
        ``cached`` of them found cached, ``distance`` tokens touched by others between
        (its stack distance when it was sent), ``prompt`` the turn's prompt tokens (None:
        unknown). An eviction tells the capacity: the cache held ``distance + cached`` at
        most; a full hit that the estimate called an eviction tells it held ``distance +
        previous`` at least.

        Not evidence: a turn with nothing of this client's run there since its last
        (``distance`` 0: an LRU cache that just held the whole context cannot have
        evicted it for lack of room; the shortfall is a rewritten prompt, or traffic this
        client does not see), and a prompt under half the previous context (a compacted
        conversation reads as an eviction however much was cached). Replaying Claude Code
        traces, such turns were every "eviction" seen with ample KV, and taught
        capacities of a fifth of the engine's (docs/benchmarks/steady.md, "How close the
        client's view is")."""
        if previous < _MIN_CONTEXT or distance <= 0 or self.exact is not None:
            return  # with the engine's events, evictions are seen, not inferred
        self._changed()
        if prompt is not None and 2 * prompt < previous:
            return
        estimate = self.capacity_tokens
        if 2 * cached < previous:  # evicted (RetentionEstimator's rule for a hit)
            self.evictions += 1
            held = float(distance + cached)
            if estimate is None:
                self._learned = held
            elif held < estimate:
                self._learned = estimate + _LEARN_RATE * (held - estimate)
        elif estimate is not None and self._learned is not None:
            held = float(distance + previous)
            if held > estimate:
                learned = estimate + _LEARN_RATE * (held - estimate)
                # Back at the engine's or configured figure: the learned one is dropped.
                self._learned = None if self.capacity and learned >= self.capacity else learned

    def set_capacity(self, tokens: int, source: CapacitySource) -> None:
        """The engine says the capacity is ``tokens`` (its callers ask it only while no
        capacity is known: one given as a setting wins over the engine's)."""
        if tokens <= 0:
            return
        self._changed()
        self.capacity = tokens
        self._given = source
        if self._learned is not None and self._learned >= tokens:
            self._learned = None
