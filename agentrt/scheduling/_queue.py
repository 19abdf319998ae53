"""Ordering policies: which waiting call an endpoint admits next.

A :class:`Policy` holds the calls (:class:`Ticket`) waiting for admission at one endpoint
and decides their order. It also assigns every call a queue level (``classify``), which is
what agentrt passes to engines that accept a priority, and it learns from the runtime's
feedback (service received, tool waits, job ends).

All queue operations are O(log n) or better: FIFO deques and heaps with lazy deletion
(a cancelled ticket is marked, skipped when it reaches the front, and swept out in bulk
when the dead entries outnumber the live ones). See ``docs/scheduling.md`` for the rule
each policy implements and its source.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ._priority import DEFAULT_LEVELS_S, plas_priority

__all__ = [
    "ATLAS",
    "EDF",
    "FCFS",
    "MLFQ",
    "PLAS",
    "Policy",
    "Ticket",
    "make_policy",
]

_COMPACT_SLACK = 64
"""Dead entries tolerated beyond the live count before a sweep."""


@dataclass(slots=True, eq=False)
class Ticket:
    """One call asking for admission at an endpoint.

    Tickets compare by identity. A ticket sits in at most one policy at a time.
    """

    call_id: str
    job_id: str
    program_id: str
    session_id: str
    parent_session_id: str | None = None
    tokens: int = 0
    """Estimated cost in tokens (prompt + expected output), for token budgets."""
    deadline_at: float | None = None
    """Absolute clock time (``anyio.current_time()``) of the job's deadline."""
    priority: int = 0
    """Queue level assigned by the policy's ``classify``; 0 runs first."""
    enqueued_at: float = 0.0
    idle_expected_s: float | None = None
    """The idle expected after the call (its ``CallMetadata.idle_expected_s``), set by the
    transport before ``on_call_end``."""
    _seq: int = field(default=-1, init=False, repr=False)
    """Push sequence number while queued in a policy, -1 otherwise (lazy deletion)."""
    _bucket: int = field(default=0, init=False, repr=False)
    """The policy's container index for this ticket, fixed at push."""
    _held: bool = field(default=False, init=False, repr=False)
    """Admitted and not yet released (``Admission``'s bookkeeping)."""


class Policy(Protocol):
    """Orders the calls waiting at one endpoint and learns from the runtime's feedback."""

    name: str

    def classify(self, ticket: Ticket, now: float) -> int:
        """Set and return ``ticket.priority``. Cheap: called for every call."""
        ...

    def push(self, ticket: Ticket, now: float) -> None:
        """Queue ``ticket`` (sets ``enqueued_at`` to ``now``)."""
        ...

    def pop(self, now: float) -> Ticket | None:
        """Remove and return the next ticket to admit, or None when empty."""
        ...

    def remove(self, ticket: Ticket) -> bool:
        """Drop a queued ticket (a cancelled waiter); False if it was not queued."""
        ...

    def __len__(self) -> int: ...

    def on_call_end(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        """The call received ``service_s`` LLM seconds and used ``tokens`` tokens."""
        ...

    def on_tool(self, job_id: str, session_id: str, expected_s: float | None) -> None:
        """The session yielded to a tool, expected to wait ``expected_s`` seconds (declared
        or learned; None: unknown)."""
        ...

    def on_tool_end(self, job_id: str, session_id: str, waited_s: float) -> None:
        """The session's tool wait ended after ``waited_s`` seconds."""
        ...

    def on_job_end(self, job_id: str, program_id: str) -> None:
        """The job ended: drop its state."""
        ...


_Entry = tuple[int, Ticket]


def _head(q: deque[_Entry]) -> Ticket | None:
    """The oldest live ticket of ``q``, dropping dead entries from the front."""
    while q:
        seq, t = q[0]
        if t._seq == seq:
            return t
        q.popleft()
    return None


def _sweep(q: deque[_Entry]) -> deque[_Entry]:
    return deque(e for e in q if e[1]._seq == e[0])


class _Lazy:
    """Sequence numbers, the live count and the dead-entry sweep shared by the policies,
    and no-op feedback methods."""

    __slots__ = ("_count", "_dead", "_len")

    def __init__(self) -> None:
        self._count = itertools.count()
        self._len = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._len

    def _enter(self, ticket: Ticket, now: float, bucket: int) -> _Entry:
        if ticket._seq >= 0:
            raise ValueError(f"ticket {ticket.call_id!r} is already queued")
        seq = next(self._count)
        ticket._seq = seq
        ticket._bucket = bucket
        ticket.enqueued_at = now
        self._len += 1
        return (seq, ticket)

    def _leave(self, ticket: Ticket) -> None:
        ticket._seq = -1
        self._len -= 1

    def _pop_front(self, q: deque[_Entry]) -> Ticket | None:
        t = _head(q)
        if t is not None:
            q.popleft()
            self._leave(t)
        return t

    def remove(self, ticket: Ticket) -> bool:
        if ticket._seq < 0:
            return False
        self._leave(ticket)
        self._dead += 1
        if self._dead > self._len + _COMPACT_SLACK:
            self._dead = 0
            self._compact()
        return True

    def _compact(self) -> None:
        raise NotImplementedError

    # Feedback: ignored unless a policy overrides it.

    def on_call_end(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        pass

    def on_tool(self, job_id: str, session_id: str, expected_s: float | None) -> None:
        pass

    def on_tool_end(self, job_id: str, session_id: str, waited_s: float) -> None:
        pass

    def on_job_end(self, job_id: str, program_id: str) -> None:
        pass


class _JobTracker:
    """Which jobs each program has alive, so per-program state lives as long as they do."""

    __slots__ = ("_jobs", "_programs")

    def __init__(self) -> None:
        self._jobs: dict[str, str] = {}
        self._programs: dict[str, int] = {}

    def touch(self, job_id: str, program_id: str) -> None:
        if job_id not in self._jobs:
            self._jobs[job_id] = program_id
            self._programs[program_id] = self._programs.get(program_id, 0) + 1

    def end(self, job_id: str) -> str | None:
        """Forget the job; return its program if that program has no job left."""
        program = self._jobs.pop(job_id, None)
        if program is None:
            return None
        left = self._programs[program] - 1
        if left:
            self._programs[program] = left
            return None
        del self._programs[program]
        return program

    def __len__(self) -> int:
        return len(self._jobs)


class FCFS(_Lazy):
    """First come, first served: calls leave in the order they were queued."""

    __slots__ = ("_q",)
    name = "fcfs"

    def __init__(self) -> None:
        super().__init__()
        self._q: deque[_Entry] = deque()

    def classify(self, ticket: Ticket, now: float) -> int:
        ticket.priority = 0
        return 0

    def push(self, ticket: Ticket, now: float) -> None:
        self.classify(ticket, now)
        self._q.append(self._enter(ticket, now, 0))

    def pop(self, now: float) -> Ticket | None:
        return self._pop_front(self._q)

    def _compact(self) -> None:
        self._q = _sweep(self._q)


class _AttainedService(_Lazy):
    """Discretized least-attained-service queues with Autellix's anti-starvation.

    Subclasses keep ``_service`` (program -> attained LLM seconds) up to date. A ticket's
    queue is fixed when it is pushed; FCFS inside a queue. ``pop`` looks at the head (the
    oldest waiter) of each queue: a head whose wait / max(service, floor) reached
    ``starvation_ratio`` is starving, and the oldest starving head is served first;
    otherwise the head of the first non-empty queue. O(levels) per pop.
    """

    __slots__ = ("_floor", "_jobs", "_levels", "_queues", "_ratio", "_service")

    def __init__(
        self,
        levels: Sequence[float] = DEFAULT_LEVELS_S,
        *,
        starvation_ratio: float | None = 4.0,
        service_floor_s: float = 1.0,
    ) -> None:
        super().__init__()
        if list(levels) != sorted(levels) or any(b <= 0 for b in levels):
            raise ValueError(f"levels must be positive and increasing, got {levels!r}")
        if starvation_ratio is not None and starvation_ratio <= 0:
            raise ValueError(f"starvation_ratio must be > 0 or None, got {starvation_ratio}")
        if service_floor_s <= 0:
            raise ValueError(f"service_floor_s must be > 0, got {service_floor_s}")
        self._levels = tuple(levels)
        self._ratio = starvation_ratio
        self._floor = service_floor_s
        self._queues: list[deque[_Entry]] = [deque() for _ in range(len(self._levels) + 1)]
        self._service: dict[str, float] = {}
        self._jobs = _JobTracker()

    def classify(self, ticket: Ticket, now: float) -> int:
        self._jobs.touch(ticket.job_id, ticket.program_id)
        p = plas_priority(self._service.get(ticket.program_id, 0.0), self._levels)
        ticket.priority = p
        return p

    def push(self, ticket: Ticket, now: float) -> None:
        p = self.classify(ticket, now)
        self._queues[p].append(self._enter(ticket, now, p))

    def pop(self, now: float) -> Ticket | None:
        first: Ticket | None = None
        starving: Ticket | None = None
        ratio = self._ratio
        for q in self._queues:
            t = _head(q)
            if t is None:
                continue
            if first is None:
                first = t
                if ratio is None:
                    break
            if ratio is not None and (starving is None or t._seq < starving._seq):
                service = max(self._service.get(t.program_id, 0.0), self._floor)
                if now - t.enqueued_at >= ratio * service:
                    starving = t
        chosen = starving or first
        if chosen is None:
            return None
        self._queues[chosen._bucket].popleft()
        self._leave(chosen)
        return chosen

    def _compact(self) -> None:
        self._queues = [_sweep(q) for q in self._queues]

    def on_job_end(self, job_id: str, program_id: str) -> None:
        program = self._jobs.end(job_id)
        if program is not None:
            self._service.pop(program, None)

    def known_programs(self) -> int:
        """Programs with attained-service state (for tests and memory checks)."""
        return len(self._service)


class PLAS(_AttainedService):
    """Program-level least attained service (Autellix, 2025).

    A call's queue is the discretized LLM seconds its program has received so far
    (:func:`plas_priority`), FCFS inside a queue, with anti-starvation promotion.
    """

    __slots__ = ()
    name = "plas"

    def on_call_end(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        self._jobs.touch(ticket.job_id, ticket.program_id)
        p = ticket.program_id
        self._service[p] = self._service.get(p, 0.0) + service_s


class ATLAS(_AttainedService):
    """Attained service along the critical path, for parallel programs (Autellix, 2025).

    Per session, ``cp(session) = cp(parent when the session was first seen) + the
    session's own service``. A program's attained service is the maximum ``cp`` over its
    sessions (its longest critical path so far), so the parallel sub-agents of a program
    share one priority and a wide program is not penalised for its width. Queues, FCFS
    and anti-starvation as :class:`PLAS`.
    """

    __slots__ = ("_job_sessions", "_sessions")
    name = "atlas"

    def __init__(
        self,
        levels: Sequence[float] = DEFAULT_LEVELS_S,
        *,
        starvation_ratio: float | None = 4.0,
        service_floor_s: float = 1.0,
    ) -> None:
        super().__init__(levels, starvation_ratio=starvation_ratio, service_floor_s=service_floor_s)
        self._sessions: dict[str, list[float]] = {}
        """session -> [cp of the parent at spawn, own service]"""
        self._job_sessions: dict[str, list[str]] = {}

    def _session(self, ticket: Ticket) -> list[float]:
        s = self._sessions.get(ticket.session_id)
        if s is None:
            base = 0.0
            parent = ticket.parent_session_id
            if parent is not None and (ps := self._sessions.get(parent)) is not None:
                base = ps[0] + ps[1]
            s = self._sessions[ticket.session_id] = [base, 0.0]
            self._job_sessions.setdefault(ticket.job_id, []).append(ticket.session_id)
        return s

    def classify(self, ticket: Ticket, now: float) -> int:
        self._session(ticket)
        return super().classify(ticket, now)

    def on_call_end(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        self._jobs.touch(ticket.job_id, ticket.program_id)
        s = self._session(ticket)
        s[1] += service_s
        cp = s[0] + s[1]
        p = ticket.program_id
        if cp > self._service.get(p, 0.0):
            self._service[p] = cp

    def critical_path(self, session_id: str) -> float:
        """The attained service along ``session_id``'s critical path (0 if unknown)."""
        s = self._sessions.get(session_id)
        return 0.0 if s is None else s[0] + s[1]

    def on_job_end(self, job_id: str, program_id: str) -> None:
        for sid in self._job_sessions.pop(job_id, ()):
            self._sessions.pop(sid, None)
        super().on_job_end(job_id, program_id)


@dataclass(slots=True)
class _JobLevel:
    level: int = 0
    used: int = 0
    """Tokens used at the current level."""
    service_s: float = 0.0
    """LLM service of the job's last finished call."""
    idle_expected_s: float | None = None
    """The idle its last finished call expected after it."""
    undecided: bool = False
    """A call has ended since the job's last yield was classified."""


class MLFQ(_Lazy):
    """Multi-level feedback queue over jobs (after Astraea, 2025).

    Each job has a level, 0 first. Level ``l`` has a quota of ``base_quota_tokens * 2**l``
    tokens; a job that uses its quota at a level is demoted one level. A tool yield whose
    wait is at least ``io_ratio`` times the LLM service of the job's last call is
    I/O-bound and promotes the job one level (at most once per call). The wait is the
    expected one when known at the yield (declared or learned ``expected_s``, else the
    last call's ``idle_expected_s``), else the observed one when the wait ends. Inside a
    level the waiting call with the highest response ratio
    ``(wait + expected service) / expected service`` goes first, expected service
    proportional to ``ticket.tokens``: calls are bucketed by ``tokens.bit_length()`` into
    FIFO classes and the heads of the classes compared (O(classes) per pop). Across
    levels, a call that has waited ``max_wait_s`` is served next whatever its level
    (aging; None disables it).
    """

    __slots__ = (
        "_base",
        "_classes",
        "_fifo",
        "_io_ratio",
        "_jobs",
        "_level_len",
        "_max_wait",
        "_nlevels",
    )
    name = "mlfq"

    _NCLASSES = 33

    def __init__(
        self,
        *,
        levels: int = 8,
        base_quota_tokens: int = 4096,
        max_wait_s: float | None = 60.0,
        io_ratio: float = 1.0,
    ) -> None:
        super().__init__()
        if not (io_ratio > 0 and math.isfinite(io_ratio)):
            raise ValueError(f"io_ratio must be a finite number > 0, got {io_ratio!r}")
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        if base_quota_tokens < 1:
            raise ValueError(f"base_quota_tokens must be >= 1, got {base_quota_tokens}")
        if max_wait_s is not None and max_wait_s <= 0:
            raise ValueError(f"max_wait_s must be > 0 or None, got {max_wait_s}")
        self._nlevels = levels
        self._base = base_quota_tokens
        self._max_wait = max_wait_s
        self._io_ratio = io_ratio
        self._classes: list[list[deque[_Entry]]] = [
            [deque() for _ in range(self._NCLASSES)] for _ in range(levels)
        ]
        self._level_len = [0] * levels
        self._fifo: deque[_Entry] = deque()
        """Every queued ticket in arrival order (for aging across levels)."""
        self._jobs: dict[str, _JobLevel] = {}

    def quota(self, level: int) -> int:
        """Tokens a job may use at ``level`` before it is demoted."""
        return self._base << level

    def _job(self, job_id: str) -> _JobLevel:
        j = self._jobs.get(job_id)
        if j is None:
            j = self._jobs[job_id] = _JobLevel()
        return j

    def classify(self, ticket: Ticket, now: float) -> int:
        p = self._job(ticket.job_id).level
        ticket.priority = p
        return p

    def push(self, ticket: Ticket, now: float) -> None:
        level = self.classify(ticket, now)
        cls = min(max(ticket.tokens, 0).bit_length(), self._NCLASSES - 1)
        entry = self._enter(ticket, now, level * self._NCLASSES + cls)
        self._classes[level][cls].append(entry)
        self._level_len[level] += 1
        if self._max_wait is not None:
            self._fifo.append(entry)
            if len(self._fifo) > 2 * self._len + _COMPACT_SLACK:
                self._fifo = _sweep(self._fifo)

    def _leave(self, ticket: Ticket) -> None:
        self._level_len[ticket._bucket // self._NCLASSES] -= 1
        super()._leave(ticket)

    def pop(self, now: float) -> Ticket | None:
        if not self._len:
            return None
        if self._max_wait is not None:
            oldest = _head(self._fifo)
            if oldest is not None and now - oldest.enqueued_at >= self._max_wait:
                self._fifo.popleft()
                self._take(oldest)
                return oldest
        level = next(i for i, n in enumerate(self._level_len) if n)
        best: Ticket | None = None
        best_ratio = -1.0
        for q in self._classes[level]:
            if not q:
                continue
            t = _head(q)
            if t is None:
                continue
            # (wait + e) / e ranks like wait / e; e = tokens * (s per token), a common factor.
            r = (now - t.enqueued_at) / max(t.tokens, 1)
            if r > best_ratio:  # ties: the smaller class (scanned first) wins
                best, best_ratio = t, r
        assert best is not None
        self._take(best)
        return best

    def _take(self, t: Ticket) -> None:
        q = self._classes[t._bucket // self._NCLASSES][t._bucket % self._NCLASSES]
        if _head(q) is t:  # always, as t is the oldest of its class
            q.popleft()
        else:  # pragma: no cover - defensive: leave the entry to the sweep
            self._dead += 1
        self._leave(t)

    def _compact(self) -> None:
        self._classes = [[_sweep(q) for q in level] for level in self._classes]
        self._fifo = _sweep(self._fifo)

    def on_call_end(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        j = self._job(ticket.job_id)
        j.used += tokens
        while j.level < self._nlevels - 1 and j.used >= self.quota(j.level):
            j.used -= self.quota(j.level)
            j.level += 1
        if j.level == self._nlevels - 1:
            j.used = min(j.used, self.quota(j.level))
        j.service_s = service_s
        j.idle_expected_s = ticket.idle_expected_s
        j.undecided = True

    def on_tool(self, job_id: str, session_id: str, expected_s: float | None) -> None:
        j = self._jobs.get(job_id)
        if j is None or not j.undecided:
            return
        wait = expected_s if expected_s is not None else j.idle_expected_s
        if wait is not None:  # else judged by the observed wait, at its end
            self._classify_yield(j, wait)

    def on_tool_end(self, job_id: str, session_id: str, waited_s: float) -> None:
        j = self._jobs.get(job_id)
        if j is not None and j.undecided:
            self._classify_yield(j, waited_s)

    def _classify_yield(self, j: _JobLevel, wait_s: float) -> None:
        """Promote the job one level if the yield is I/O-bound (once per call)."""
        j.undecided = False
        if wait_s >= self._io_ratio * j.service_s and j.level > 0:
            j.level -= 1
            j.used = 0

    def on_job_end(self, job_id: str, program_id: str) -> None:
        self._jobs.pop(job_id, None)

    def level_of(self, job_id: str) -> int:
        """The job's current level (0 if unknown)."""
        j = self._jobs.get(job_id)
        return 0 if j is None else j.level


class EDF(_Lazy):
    """Earliest deadline first: calls with a deadline by ``deadline_at`` (ties FCFS), then
    the calls without one, FCFS.

    ``classify`` gives 0 to calls with a deadline and 1 to the others.
    """

    __slots__ = ("_heap", "_rest")
    name = "edf"

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[float, int, Ticket]] = []
        self._rest: deque[_Entry] = deque()

    def classify(self, ticket: Ticket, now: float) -> int:
        p = 0 if ticket.deadline_at is not None else 1
        ticket.priority = p
        return p

    def push(self, ticket: Ticket, now: float) -> None:
        p = self.classify(ticket, now)
        entry = self._enter(ticket, now, p)
        if ticket.deadline_at is None:
            self._rest.append(entry)
        else:
            heapq.heappush(self._heap, (ticket.deadline_at, entry[0], ticket))

    def pop(self, now: float) -> Ticket | None:
        heap = self._heap
        while heap:
            _, seq, t = heapq.heappop(heap)
            if t._seq == seq:
                self._leave(t)
                return t
        return self._pop_front(self._rest)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2]._seq == e[1]]
        heapq.heapify(self._heap)
        self._rest = _sweep(self._rest)


_POLICIES: dict[str, Callable[[], Policy]] = {
    "atlas": ATLAS,
    "edf": EDF,
    "fcfs": FCFS,
    "mlfq": MLFQ,
    "plas": PLAS,
}


def make_policy(name_or_policy: str | Policy) -> Policy:
    """A fresh policy by name (``"fcfs"``, ``"plas"``, ``"atlas"``, ``"mlfq"``, ``"edf"``),
    or ``name_or_policy`` itself if it is already a policy."""
    if not isinstance(name_or_policy, str):
        return name_or_policy
    factory = _POLICIES.get(name_or_policy.strip().lower())
    if factory is None:
        raise ValueError(
            f"unknown scheduling policy {name_or_policy!r}; "
            f"choose one of: {', '.join(sorted(_POLICIES))}"
        )
    return factory()
