"""Routing: which endpoint (replica) a call goes to.

A router is a small object with two methods. ``choose`` picks an endpoint index for a call
from the endpoints' live load (:class:`EndpointLoad`) and what is known about the call
(:class:`RouteKey`); ``served`` tells it where the call was sent, so that prefix-aware
routers learn which replica holds which prompt prefix. Routers never see the HTTP request.

Every router obeys the same fallback order (``_candidates``): healthy endpoints not
in ``avoid``; else any endpoint not in ``avoid``; else healthy ones; else all.

The routers, their sources and their exact rules are described in ``docs/routing.md``.
"""

from __future__ import annotations

import hashlib
import math
import random
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from .._ids import random_bytes

__all__ = [
    "DEFAULT_CALL_COST_TOKENS",
    "DEFAULT_PREFIX_CAPACITY",
    "DEFAULT_RETENTION_MARGIN",
    "PREFIX_CUTS",
    "EndpointLoad",
    "HashAffinity",
    "LeastLoaded",
    "RoundRobin",
    "RouteKey",
    "Router",
    "SessionAffinity",
    "load_score",
    "make_router",
    "prefix_fingerprints",
]

DEFAULT_CALL_COST_TOKENS: Final = 256
"""What one call in flight weighs in :func:`load_score`, in tokens, on top of its tokens."""

DEFAULT_PREFIX_CAPACITY: Final = 4096
"""Fingerprints a :class:`SessionAffinity` router remembers (least recently used go first)."""

DEFAULT_RETENTION_MARGIN: Final = 1.5
"""A session idle for more than this times its home's retention estimate is routed by load."""

PREFIX_CUTS: Final = (256, 1024, 4096, 16384, 65536)
"""Byte lengths at which :func:`prefix_fingerprints` fingerprints a request body."""


@dataclass(slots=True)
class EndpointLoad:
    """Live load of one endpoint, as agentrt sees it from the client.

    ``running``, ``waiting`` and ``kv_usage`` come from polling the engine's metrics
    (see :func:`agentrt.scheduling.parse_vllm_metrics`) and are ``None`` when not polled.
    """

    weight: float = 1.0
    """Relative capacity (a replica on two GPUs might weigh 2)."""
    in_flight: int = 0
    """Calls this client has sent there and not yet seen finish."""
    sessions: int = 0
    """Sessions currently pinned to this endpoint: open sessions whose last turn went
    there (a session that moves counts at its new endpoint; one that ends, nowhere)."""
    outstanding_tokens: int = 0
    """Estimated tokens (prompt + expected output) of the calls in flight."""
    healthy: bool = True
    """False while the endpoint's health tracker has it marked down."""
    running: int | None = None
    """Requests the engine is running (all clients), when polled."""
    waiting: int | None = None
    """Requests waiting in the engine's queue (all clients), when polled."""
    kv_usage: float | None = None
    """Fraction of the engine's KV cache in use, 0..1, when polled."""
    retention_s: float | None = None
    """How long the replica likely keeps an idle session's prefix cached, seconds, as
    estimated from its replies' cached tokens (:class:`RetentionEstimator`); None until
    there is evidence."""
    kv_capacity: float | None = None
    """Tokens of KV cache placement assumes the replica holds for this client's
    sessions: the engine's figure (``vllm:cache_config_info``), a setting
    (``Endpoint(kv_capacity=)``), or learned from the evictions its replies revealed
    (:class:`~agentrt.scheduling._workingset.WorkingSet`); None while unknown."""
    kv_capacity_source: Literal["engine", "setting", "learned"] | None = None
    """Where ``kv_capacity`` came from (None while unknown)."""
    kv_demand: float | None = None
    """Tokens of context the live sessions this client placed there will want cached
    soon, each weighted by how soon it sends again (docs/routing.md, "Placement by
    working set"); None where not computed (one endpoint, or a router that places no
    sessions). Refreshed for the endpoints a call's placement looks at."""

    @property
    def view(self) -> Literal["engine", "local"]:
        """Whose calls the routers count here: ``"engine"`` while the engine's polled
        metrics give its running and waiting requests (every client's, the whole
        fleet's), ``"local"`` when only this process's own calls in flight are known."""
        return "local" if self.running is None and self.waiting is None else "engine"


@dataclass(slots=True, frozen=True)
class RouteKey:
    """What a router knows about the call it places."""

    session_id: str
    home: int | None
    """Endpoint that served the session's previous turn; ``None`` before the first."""
    first_turn: bool
    prefix: tuple[int, ...] = ()
    """Fingerprints of growing prefixes of the prompt (:func:`prefix_fingerprints`)."""
    tokens: int = 0
    """Estimated tokens of this call (0 when unknown)."""
    idle_s: float | None = None
    """Seconds since the session's last reply (None before its first)."""
    stable: bool = False
    """The session's id was given by the caller, so another process may continue the
    session: routers that place by it (:class:`SessionAffinity`) place its first turn
    here by hashing the id, as every process does."""
    context: int = 0
    """Tokens of context the session left at ``home`` (its last call's prompt and
    completion; 0 before its first reply)."""
    resident: int | None = None
    """Of ``context``, the tokens likely still cached at ``home`` (the replica's LRU
    modelled from what ran there since: :meth:`WorkingSet.resident`); None where not
    known (the home's capacity unknown)."""


class Router(Protocol):
    """Chooses an endpoint index for a call."""

    name: str

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        """The index of the endpoint for this call (``0 <= index < len(loads)``)."""
        ...

    def served(self, index: int, key: RouteKey) -> None:
        """The call was sent to endpoint ``index``."""
        ...


# ---------------------------------------------------------------- shared helpers


def prefix_fingerprints(body: bytes) -> tuple[int, ...]:
    """Fingerprints of ``body[:cut]`` for each cut in :data:`PREFIX_CUTS` shorter than it.

    An OpenAI chat request body starts with its messages, system prompt first, so requests
    that share a system prompt share their early fingerprints. Each fingerprint is a CRC-32
    chained over the whole prefix (every byte counts) with the cut length in the high bits,
    so equal fingerprints mean equal prefixes up to CRC collisions. Cost: one pass over at
    most 64 KiB (about 10 µs on a 2020s x86 core, 3 µs for a 16 KiB body).
    """
    view = memoryview(body)
    size = len(view)
    out: list[int] = []
    crc = 0
    start = 0
    for cut in PREFIX_CUTS:
        if cut >= size:
            break
        crc = zlib.crc32(view[start:cut], crc)
        out.append((cut << 32) | crc)
        start = cut
    return tuple(out)


ENGINE_FLOOR_CALLS: Final = 8
"""Where the engines' metrics are polled, a replica running and queueing at most this many
requests (every client's) is never overloaded: far below any engine's batch, a move would
cost a session its cached prefix and save it almost nothing. Without it, a fleet's
processes split sessions on ordinary fluctuations of small counts (docs/routing.md)."""


def _calls(load: EndpointLoad) -> int:
    """Calls at the endpoint: ours in flight, or the engine's count if polled and larger."""
    if load.running is None and load.waiting is None:
        return load.in_flight
    return max(load.in_flight, (load.running or 0) + (load.waiting or 0))


def load_score(load: EndpointLoad, call_cost: float = DEFAULT_CALL_COST_TOKENS) -> float:
    """One number for an endpoint's load, in tokens per unit of weight.

    ``(outstanding_tokens + call_cost * calls) / weight``, where ``calls`` is
    ``in_flight`` or, when the engine is polled, ``max(in_flight, running + waiting)``.
    Without token estimates this is proportional to the calls in flight.
    """
    return (load.outstanding_tokens + call_cost * _calls(load)) / load.weight


MEMORY_SLACK: Final = 0.25
"""First turns go to the replicas whose KV fill (working set over capacity, this call's
tokens included) is within this of the emptiest's, once any is more than half full."""


def kv_fill(load: EndpointLoad, extra: float = 0.0) -> float | None:
    """The replica's working set (``kv_demand``) plus ``extra`` tokens over its
    ``kv_capacity``; None while either is unknown."""
    capacity, demand = load.kv_capacity, load.kv_demand
    if capacity is None or demand is None:
        return None
    return (demand + extra) / capacity


def _fits(load: EndpointLoad, tokens: int) -> bool:
    """Whether ``tokens`` more fit in the replica's KV (yes where its capacity is not
    known: no eviction was ever seen there)."""
    fill = kv_fill(load, tokens)
    return fill is None or fill <= 1.0


def _roomiest(loads: Sequence[EndpointLoad], pool: list[int], tokens: int) -> list[int]:
    """Of ``pool``, the replicas whose KV fill is near the emptiest's (within
    :data:`MEMORY_SLACK`), once memory matters (some replica more than half full);
    ``pool`` itself where a fill is unknown."""
    fills: list[float] = []
    for i in pool:
        fill = kv_fill(loads[i], tokens)
        if fill is None:
            return pool
        fills.append(fill)
    if not fills or max(fills) <= 0.5:
        return pool
    ceiling = max(min(fills) + MEMORY_SLACK, 0.5)
    return [i for i, fill in zip(pool, fills, strict=True) if fill <= ceiling]


def _candidates(loads: Sequence[EndpointLoad], avoid: Collection[int]) -> list[int]:
    """The indices a router may choose from, best tier first.

    Healthy and not avoided; else not avoided (every healthy one is avoided); else healthy
    (every index is avoided); else all. ``avoid`` wins over health: it names endpoints that
    this very call has just failed on.
    """
    n = len(loads)
    if n == 0:
        raise ValueError("no endpoints to route to")
    free = [i for i in range(n) if i not in avoid]
    pool = free or list(range(n))
    healthy = [i for i in pool if loads[i].healthy]
    return healthy or pool


def _least_loaded(
    loads: Sequence[EndpointLoad],
    pool: Sequence[int],
    tokens: int,
    offset: int = 0,
    prefer: int | None = None,
) -> int:
    """The least-loaded index of ``pool``: by weighted outstanding tokens (this call's
    included), then weighted calls, then weighted pinned sessions; equal loads go to
    ``prefer`` if it is among them, else by index counted from ``offset`` (a router draws
    it at random for each call, so that processes that see the same loads, every replica
    idle when they start, do not all pick the same one)."""
    n = len(loads)

    def order(i: int) -> tuple[float, float, float, bool, int]:
        load = loads[i]
        w = load.weight
        return (
            (load.outstanding_tokens + tokens) / w,
            (_calls(load) + 1) / w,
            load.sessions / w,
            i != prefer,
            (i - offset) % n,
        )

    return min(pool, key=order)


def _salted(salt: bytes | None) -> random.Random:
    """A router's generator for breaking ties: seeded from ``salt``, else from fresh
    random bytes (each process its own, see ``agentrt/_ids.py``)."""
    return random.Random(salt if salt is not None else random_bytes(16))


def _names(names: list[bytes] | None, n: int) -> list[bytes]:
    """The endpoints' names for rendezvous hashing: those given, else their indices."""
    if names is None:
        return [str(i).encode() for i in range(n)]
    if len(names) != n:
        raise ValueError(f"router knows {len(names)} endpoints, got {n} loads")
    return names


def _check_names(endpoints: Sequence[str] | None) -> list[bytes] | None:
    if endpoints is None:
        return None
    if len(set(endpoints)) != len(endpoints):
        raise ValueError("endpoint names must be distinct")
    return [e.encode() for e in endpoints]


def _rendezvous(key: str, names: list[bytes], loads: Sequence[EndpointLoad]) -> list[int]:
    """All indices, highest weighted rendezvous score of ``key`` first (the same order in
    every process given the same names and weights)."""
    sid = key.encode() + b"\x00"
    scores: list[tuple[float, int]] = []
    for i, (name, load) in enumerate(zip(names, loads, strict=True)):
        digest = hashlib.blake2b(sid + name, digest_size=8).digest()
        u = ((int.from_bytes(digest, "big") >> 11) + 0.5) / 2.0**53  # exact, in (0, 1)
        scores.append((-load.weight / math.log(u), -i))
    return [-neg_i for _, neg_i in sorted(scores, reverse=True)]


def _coerce_key(key: Any) -> RouteKey:
    """Transitional: accept the runtime's old ``choose(loads, session, avoid)`` call shape.

    Remove once ``_call._route`` builds a :class:`RouteKey`.
    """
    if isinstance(key, RouteKey):
        return key
    if key is None:
        return RouteKey(session_id="", home=None, first_turn=True)
    home = getattr(key, "endpoint_index", None)
    return RouteKey(session_id=str(getattr(key, "id", "")), home=home, first_turn=home is None)


# ---------------------------------------------------------------- routers


class RoundRobin:
    """Each call to the next endpoint in turn, ignoring sessions and load (what plain
    clients and most load balancers do). Skips avoided and unhealthy endpoints. The turn
    starts at endpoint ``start``, by default a random one (drawn from ``salt``, else per
    process), so that processes of a fleet do not all start at the first."""

    name = "round_robin"

    def __init__(self, *, start: int | None = None, salt: bytes | None = None) -> None:
        if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
            raise TypeError(f"start must be an int or None, got {start!r}")
        self._next = _salted(salt).randrange(1 << 30) if start is None else start

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        """The next allowed endpoint after the previous choice."""
        allowed = set(_candidates(loads, avoid))
        n = len(loads)
        for _ in range(n):
            i = self._next % n
            self._next = i + 1
            if i in allowed:
                return i
        raise AssertionError("unreachable: _candidates() is never empty")  # pragma: no cover

    def served(self, index: int, key: RouteKey) -> None:
        """Nothing to learn."""


class LeastLoaded:
    """Each call to the least-loaded endpoint, ignoring sessions.

    Least loaded: fewest estimated outstanding tokens (this call's included) per unit of
    weight, then fewest calls per unit of weight (the engine's count where polled, see
    :attr:`EndpointLoad.view`), then fewest pinned sessions; equal loads are broken at
    random (from ``salt``, else per process). Unhealthy and avoided endpoints are skipped.
    """

    name = "least_loaded"

    def __init__(self, *, salt: bytes | None = None) -> None:
        self._rng = _salted(salt)

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        """The least-loaded allowed endpoint."""
        key = _coerce_key(key)
        offset = self._rng.randrange(len(loads)) if loads else 0
        return _least_loaded(loads, _candidates(loads, avoid), key.tokens, offset)

    def served(self, index: int, key: RouteKey) -> None:
        """Nothing to learn."""


class SessionAffinity:
    """SMetric-style session routing: keep a session where its KV cache is.

    * A session with a home (``key.home``: where its previous turn ran) stays there unless
      the home is unhealthy, avoided, or overloaded: its :func:`load_score` exceeds
      ``max(overload * mean, call_cost)``, the mean taken over the healthy endpoints (all
      of them if none is healthy), and, where its engine is polled (``view ==
      "engine"``), its engine runs and queues more than :data:`ENGINE_FLOOR_CALLS`
      requests. An endpoint carrying at most one call's worth is never overloaded.
    * A first turn of a session whose id the caller gave (``key.stable``: another
      process may hold its earlier turns), or such a session that moves, goes where
      every process sends it: the first endpoint in the rendezvous order of its id
      (:class:`HashAffinity`'s, by endpoint name) that is allowed and not overloaded as
      its engine reports it (this process's own calls, which other processes do not
      see, never skip one). A failover thus follows the same order in every process.
    * Otherwise (first turn, or the session moves) the call goes to the allowed endpoint
      that last served the longest known prefix of the prompt (``key.prefix``, learned
      through :meth:`served`) if its load is at most the allowed endpoints' mean plus
      one call's cost; else to the least-loaded allowed endpoint (:class:`LeastLoaded`'s
      order, equal loads broken at random). A session that moves leaves its home
      unless no other endpoint is allowed.
    * A session returning from a wait longer than its home likely keeps its cache
      (``key.idle_s > retention_margin * loads[home].retention_s``) has nothing left to
      lose there: it goes to the least-loaded allowed endpoint, its home included.
    * Placement by working set (where replicas' KV capacities are known, see
      :attr:`EndpointLoad.kv_capacity`): a session waking at a home whose working set
      exceeds its capacity (``kv_demand > kv_capacity``) and whose own context is
      likely evicted there (``2 * key.resident < key.context``) has little left to
      lose: it moves to an allowed replica where its context fits, if one exists,
      relieving its home. First turns and moving sessions go to the replicas with the
      most room (:data:`MEMORY_SLACK`) before load and prefix decide among them.

    Moves are counted by reason in :attr:`moves`: ``"retention"``, ``"memory"``,
    ``"overload"``, ``"unavailable"`` (home unhealthy or avoided).

    The prefix index maps fingerprint -> endpoint, holds at most ``prefix_capacity``
    entries and forgets the least recently used first.

    Loads are compared as this process sees them (:attr:`EndpointLoad.view`): the
    engines' running and waiting requests where their metrics are polled (the whole
    fleet's calls), else only this process's own calls in flight. Ties are broken at
    random (``salt``, else fresh per process): in a fleet of processes that all start
    seeing idle replicas, first turns spread instead of all going to the first replica.
    """

    name = "session_affinity"

    def __init__(
        self,
        *,
        overload: float = 2.0,
        call_cost: float = DEFAULT_CALL_COST_TOKENS,
        prefix_capacity: int = DEFAULT_PREFIX_CAPACITY,
        retention_margin: float = DEFAULT_RETENTION_MARGIN,
        endpoints: Sequence[str] | None = None,
        salt: bytes | None = None,
    ) -> None:
        if not overload >= 1.0:
            raise ValueError(f"overload factor must be >= 1.0, got {overload!r}")
        if not (retention_margin >= 1.0 and math.isfinite(retention_margin)):
            raise ValueError(f"retention_margin must be >= 1.0, got {retention_margin!r}")
        if not call_cost > 0:
            raise ValueError(f"call_cost must be > 0, got {call_cost!r}")
        if prefix_capacity < 0:
            raise ValueError(f"prefix_capacity must be >= 0, got {prefix_capacity!r}")
        self.overload = overload
        self.call_cost = call_cost
        self.prefix_capacity = prefix_capacity
        self.retention_margin = retention_margin
        self._names = _check_names(endpoints)
        self._rng = _salted(salt)
        self._prefixes: OrderedDict[int, int] = OrderedDict()
        self._moves: Counter[str] = Counter()
        self.move_reason: str | None = None
        """Why the last :meth:`choose` moved a session off its home (a key of
        :attr:`moves`), or None when it did not; the runtime puts it in ``SessionMoved``."""

    @property
    def moves(self) -> dict[str, int]:
        """Sessions moved off their home so far, by reason."""
        return dict(self._moves)

    def expired(self, load: EndpointLoad, key: RouteKey) -> bool:
        """Whether the session has been idle longer than its home likely keeps its cache."""
        return self._expired(load, key.idle_s)

    def _expired(self, load: EndpointLoad, idle: float | None) -> bool:
        retention = load.retention_s
        return (
            retention is not None and idle is not None and idle > self.retention_margin * retention
        )

    def keeps(
        self,
        loads: Sequence[EndpointLoad],
        home: int,
        idle_s: float | None,
        avoid: Collection[int],
    ) -> bool:
        """Whether :meth:`choose` keeps a session at ``home`` (idle ``idle_s``) by every
        rule that reads no working set: home allowed, its cache not likely gone, home
        not overloaded. Where it may not, the session may move, and a moving session
        goes where there is room: the runtime then brings every replica's working set
        up to date before choosing (its home's own fill is read by the memory rule)."""
        if home not in _candidates(loads, avoid):
            return False
        return not self._expired(loads[home], idle_s) and not self.overloaded(loads, home)

    @property
    def prefix_entries(self) -> int:
        """Fingerprints currently remembered (at most ``prefix_capacity``)."""
        return len(self._prefixes)

    def evicted(self, loads: Sequence[EndpointLoad], key: RouteKey, pool: list[int]) -> list[int]:
        """Where a session whose context is likely evicted at an overfull home may go
        instead (replicas of ``pool`` where its context fits), or ``[]`` if it stays."""
        home = key.home
        resident = key.resident
        if home is None or resident is None or 2 * resident >= key.context:
            return []
        fill = kv_fill(loads[home])
        if fill is None or fill <= 1.0:
            return []
        tokens = max(key.context, key.tokens)
        return [i for i in pool if i != home and _fits(loads[i], tokens)]

    def overloaded(self, loads: Sequence[EndpointLoad], index: int) -> bool:
        """Whether endpoint ``index`` carries more than ``overload`` times the mean load
        (and, where its engine is polled, runs and queues more than
        :data:`ENGINE_FLOOR_CALLS` requests: far below its batch, a move costs a session
        its cache and saves it almost nothing)."""
        here = loads[index]
        if here.view == "engine" and _calls(here) <= ENGINE_FLOOR_CALLS:
            return False
        scores = [load_score(load, self.call_cost) for load in loads]
        healthy = [s for s, load in zip(scores, loads, strict=True) if load.healthy] or scores
        mean = math.fsum(healthy) / len(healthy)
        return scores[index] > max(self.overload * mean, self.call_cost)

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        """Home if it may stay there, else the prefix holder, else the least loaded."""
        key = _coerce_key(key)
        pool = _candidates(loads, avoid)
        home = key.home
        self.move_reason = None
        if home is None:
            return self._place(loads, key, pool)
        if home in pool and self.expired(loads[home], key):
            reason = "retention"
            offset = self._rng.randrange(len(loads))
            roomy = _roomiest(loads, pool, max(key.tokens, key.context))
            index = _least_loaded(loads, roomy, key.tokens, offset, prefer=home)
        elif home in pool and (roomy := self.evicted(loads, key, pool)):
            reason = "memory"
            index = self._place(loads, key, roomy)
        elif home in pool and not self.overloaded(loads, home):
            return home
        else:
            reason = "overload" if home in pool else "unavailable"
            # The session moves: anywhere but its home, if possible.
            index = self._place(loads, key, [i for i in pool if i != home] or pool)
        if index != home:
            self._moves[reason] += 1
            self.move_reason = reason
        return index

    def _place(self, loads: Sequence[EndpointLoad], key: RouteKey, pool: list[int]) -> int:
        """A first turn's or a moving session's endpoint: a caller-given id's rendezvous
        choice; else the prefix holder, if it is not loaded above the mean; else the
        least loaded."""
        if key.stable:
            # Every process must pick alike, on a first turn and when the session
            # moves (its replica down: failover follows the same agreed order): only
            # the engines' load (which they all see) may skip an endpoint, never this
            # process's own calls.
            allowed = set(pool)
            for i in _rendezvous(key.session_id, _names(self._names, len(loads)), loads):
                if i in allowed and not (loads[i].view == "engine" and self.overloaded(loads, i)):
                    return i
        pool = _roomiest(loads, pool, max(key.tokens, key.context))
        if key.prefix:
            # A replica that holds the prompt's prefix wins only while it carries no more
            # than the pool's mean load: every session of an agent shares its system
            # prompt, so "the holder" would otherwise draw every new session to one replica.
            scores = {i: load_score(loads[i], self.call_cost) for i in pool}
            ceiling = math.fsum(scores.values()) / len(scores) + self.call_cost
            for fingerprint in reversed(key.prefix):
                holder = self._prefixes.get(fingerprint)
                if holder is not None and holder in scores and scores[holder] <= ceiling:
                    return holder
        return _least_loaded(loads, pool, key.tokens, self._rng.randrange(len(loads)))

    def served(self, index: int, key: RouteKey) -> None:
        """Remember that endpoint ``index`` now holds each of the prompt's prefixes."""
        if self.prefix_capacity == 0:
            return
        prefixes = self._prefixes
        for fingerprint in key.prefix:
            prefixes[fingerprint] = index
            prefixes.move_to_end(fingerprint)
        while len(prefixes) > self.prefix_capacity:
            prefixes.popitem(last=False)


class HashAffinity:
    """Rendezvous hashing of the session id with bounded loads.

    Each endpoint gets a score per session, ``-weight / ln(u)`` with ``u`` a uniform draw
    from a keyed hash (BLAKE2b) of the session id and the endpoint's name (weighted
    rendezvous / highest-random-weight hashing, Thaler and Ravishankar 1998). The session
    goes to the highest-scoring allowed endpoint whose calls in flight are below its cap,
    ``ceil(balance * (total + 1) * weight / total_weight)``, where ``total`` and
    ``total_weight`` are summed over the allowed endpoints (consistent hashing with bounded
    loads, Mirrokni, Thorup and Zadimoghaddam 2018; with equal weights the cap is
    ``ceil(c * (m + 1) / n)``). Some allowed endpoint is always below its cap.

    The calls counted are those this process can see (:attr:`EndpointLoad.view`): the
    engines' running and waiting requests where their metrics are polled, so that the
    bound holds for the whole fleet; else only this process's own calls in flight (in a
    fleet of K processes each then sees about 1/K of the load, and the bound binds late).

    The choice depends only on the session id, the endpoint names and the loads, so
    independent processes configured with the same endpoints agree without talking (up to
    their differing views of the load). Name the endpoints (``endpoints=[url, ...]``, as
    the Runtime does) so that the order they are listed in does not matter and adding one
    moves only its share of sessions; without names, endpoints are named by index.
    """

    name = "hash"

    def __init__(
        self,
        *,
        endpoints: Sequence[str] | None = None,
        balance: float = 1.25,
        salt: bytes | None = None,
    ) -> None:
        if not balance >= 1.0:
            raise ValueError(f"balance must be >= 1.0, got {balance!r}")
        self.balance = balance
        self._names = _check_names(endpoints)
        del salt  # nothing random: the hash is the agreement

    def _ranked(self, session_id: str, loads: Sequence[EndpointLoad]) -> list[int]:
        """All indices, highest rendezvous score first."""
        return _rendezvous(session_id, _names(self._names, len(loads)), loads)

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        """The highest-ranked allowed endpoint below its cap."""
        key = _coerce_key(key)
        pool = _candidates(loads, avoid)
        allowed = set(pool)
        calls = [_calls(load) for load in loads]
        room = self.balance * (sum(calls[i] for i in pool) + 1)
        weight = math.fsum(loads[i].weight for i in pool)
        for i in self._ranked(key.session_id, loads):
            if i in allowed and calls[i] < math.ceil(room * loads[i].weight / weight):
                return i
        # Unreachable while balance >= 1 (the caps add up to more than the calls).
        return min(pool, key=lambda i: (calls[i] / loads[i].weight, i))  # pragma: no cover

    def served(self, index: int, key: RouteKey) -> None:
        """Nothing to learn: the hash is the memory."""


_ROUTERS: Final[dict[str, Callable[..., Router]]] = {
    "round_robin": RoundRobin,
    "least_loaded": LeastLoaded,
    "session_affinity": SessionAffinity,
    "hash": HashAffinity,
}
"""Router names :func:`make_router` accepts (besides the aliases in ``_ALIASES``)."""

_ALIASES: Final = {"session": "session_affinity", "round-robin": "round_robin"}


_NAMED: Final = frozenset({"session_affinity", "hash"})
"""Routers that hash by endpoint name (they take ``endpoints=``)."""


def _name_endpoints(router: SessionAffinity | HashAffinity, endpoints: Sequence[str]) -> None:
    """Name a router object's endpoints by the runtime's URLs, in the runtime's order, so
    that it hashes by URL as one made by name does (never by position: two processes
    listing the same replicas in another order must agree). A router already named must
    name the same endpoints."""
    names = _check_names(endpoints)
    assert names is not None
    known = router._names
    if known is not None and sorted(known) != sorted(names):
        raise ValueError(
            f"router {router.name!r} was built for endpoints "
            f"{[n.decode() for n in known]}, the runtime has {list(endpoints)}"
        )
    router._names = names


def make_router(
    routing: str | Router, *, endpoints: Sequence[str] | None = None, **options: Any
) -> Router:
    """A router from its name (see ``docs/routing.md``) and constructor options, or
    ``routing`` itself if it is already a router.

    ``"session"`` and ``"round-robin"`` are accepted as aliases of ``"session_affinity"``
    and ``"round_robin"``. ``endpoints`` (their URLs) names the endpoints for the
    routers that hash by name; the others ignore it.
    """
    if not isinstance(routing, str):
        if options:
            raise ValueError("router options apply only to a router given by name")
        if endpoints is not None and isinstance(routing, SessionAffinity | HashAffinity):
            _name_endpoints(routing, endpoints)
        return routing
    name = _ALIASES.get(routing, routing)
    factory = _ROUTERS.get(name)
    if factory is None:
        names = ", ".join(repr(n) for n in [*_ROUTERS, *_ALIASES])
        raise ValueError(f"unknown routing {routing!r}; choose one of {names}")
    if endpoints is not None and name in _NAMED:
        options.setdefault("endpoints", endpoints)
    return factory(**options)
