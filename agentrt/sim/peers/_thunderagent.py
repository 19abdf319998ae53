"""Dynamo's experimental ThunderAgent router (``python -m dynamo.thunderagent_router``,
ai-dynamo/dynamo PR #9448 and its follow-ups): program-level pause and resume at tool
boundaries, in front of Dynamo's KV router, after the ThunderAgent paper (Kang et al.,
arXiv 2602.13692).

Sources read (ai-dynamo/dynamo ``components/src/dynamo/thunderagent_router/``):
``router.py`` at 08cda654593d (the scheduler: admission, tick, pause, resume, forced
resume, idle expiry), ``program_state.py`` at 10910f0b576b (the program table),
``capacity.py`` at 0ecb3fd73861 (the retention budget), ``__main__.py`` at 00b9ca2306692
(the request path), and the scheduler's page
``docs/fern/pages/use-cases/agents/thunderagent-program-scheduler.md`` at 00b9ca2306692
(the defaults below).

- **Programs.** A request names its program with ``x-dynamo-session-id`` (the frontend
  puts it in ``agent_context.session_id``). A request without one passes straight to the
  KV router (the :class:`~agentrt.sim.peers._dynamo.Dynamo` model here), unscheduled. A
  program is ``REASONING`` while a turn is in flight and ``ACTING`` between turns (in a
  tool), ``ACTIVE`` or ``PAUSED``. Its size (``token_total``) is the turn's prompt tokens
  when the turn is admitted, and prompt plus completion tokens when it ends.
- **Retention budget.** Per replica, ``block_size * (GPU blocks + host-tier blocks)``
  tokens (``capacity.py``: the KV capacity plus native offloading). A replica's use is
  the sum over its ``ACTIVE`` programs of ``token_total + 100`` (``buffer_per_program``);
  ``PAUSED`` programs count nowhere (their KV is left to the engine to evict).
- **Admission** (``_admit_locked``). A turn of a ``PAUSED`` program waits until the
  program is resumed. A turn of an ``ACTIVE`` program with a replica goes there at once
  (pinned: ``backend_instance_id``). An unplaced program is placed on the replica with
  the least *decayed* load among those with room for it (``capacity - use >= tokens +
  100``; an ``ACTING`` program's tokens decay as ``2^(-idle / 1 s)`` in that ranking); a
  new program waits (paused, ``admission_full``) when no replica has room or any program
  is paused (new programs queue behind paused ones); an unplaceable running program goes
  unpinned to the KV router, and the replica that serves it becomes its own.
- **The tick**, every 5 s: release programs idle (``ACTING``) for 600 s
  (``program_idle_ttl_seconds``: a client that sends no final request leaves its ended
  sessions in the budget that long), then resume, then pause (resume first: a program
  paused in a tick waits at least until the next).
- **Pause** (``_pause_until_safe_locked``): on a replica whose use is above 0.95 of its
  budget, pause ``ACTING`` programs smallest first until use is at most 0.80; if it is
  still above, mark *every* ``REASONING`` program there, each paused when its turn ends.
  Pausing is logical: nothing in flight is stopped, and the program loses its replica.
- **Resume** (``_greedy_resume_locked``), while the replicas are below 0.85 (0.95 less
  the 0.10 hysteresis): the paused programs in the order (a turn waiting, a new program,
  an idle one), smallest first within each, the prefix of that order that fits in the
  pool's summed headroom; then, largest first, each on the replica with the **most
  headroom** that fits it: not its own, which is why most resumes move (the replication
  below measured 70%).
- **Forced resume**: a turn that waited 1800 s (``resume_timeout_seconds``) resumes its
  program on the replica with the most headroom by decayed load, whatever the budget.
- **A final request** (``x-dynamo-session-final: true``) releases its program.

Defaults (``ThunderAgentConfig``): pause threshold 0.95, pause target 0.80, resume
hysteresis 0.10, tick 5 s, forced resume 1800 s, buffer 100 tokens, ACTING decay tau 1 s,
idle TTL 600 s.

Where this model departs from the real router (unvalidated against a running one):

- the completion tokens are the request's ``max_tokens`` (the embedded engine's replies are
  exactly that long; the router reads ``usage``), and the program does not grow while its
  reply streams (``record_output_tokens``);
- the soft-demote band (0.80-0.95) and the resume priority boost are left out: they
  change a request's priority in Dynamo's router queue, which this model, like
  ``dynamo``'s, leaves out;
- a final request is forwarded (to its program's replica) after releasing the program;
  the real router answers it without forwarding, as a harness sends it after the
  session's last turn;
- the tick runs on its 5 s grid from the first request, lazily: due ticks run before
  each request's admission and completion, and while turns wait one of them wakes at
  each tick; per-request admission locks, DP ranks, request-count ceilings (SGLang's
  ``max_running_requests``) and stale-worker repair are not modelled.

What a replication measured on real Claude Code sessions (zetxqx/thunderagent-original-
verification, ``12-llm-d-router-pool/RESULTS.md``, an llm-d port of upstream
ThunderAgent, 338 sessions on 4 vLLM pods): 1.42x the llm-d default's throughput, about
70% of resumes on another pod, 55 forced admissions and 25 client timeouts per run.
:meth:`ThunderAgent.stats` counts the same things here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio

from ._base import GatewayRequest, PeerPolicy, ReplicaView
from ._dynamo import Dynamo

__all__ = ["Program", "ProgramScheduler", "ThunderAgent", "ThunderAgentConfig", "ThunderAgentHome"]

SESSION_HEADER: Final = "x-dynamo-session-id"
FINAL_HEADER: Final = "x-dynamo-session-final"

Status = Literal["reasoning", "acting"]
Lifecycle = Literal["active", "paused", "terminated"]


@dataclass(frozen=True, slots=True)
class ThunderAgentConfig:
    """The router's knobs, at their defaults (``ThunderAgentConfig`` in ``router.py``)."""

    pause_threshold: float = 0.95
    pause_target: float = 0.80
    resume_hysteresis: float = 0.10
    resume_timeout_s: float = 1800.0
    tick_s: float = 5.0
    acting_token_weight: float = 1.0
    acting_decay_tau_s: float = 1.0
    buffer_per_program: int = 100
    idle_ttl_s: float = 600.0
    """0 disables idle expiry."""
    resume_home: bool = False
    """Not in the source: resume a paused program only on the replica it was paused from
    (a forced resume still goes anywhere), the follow-up the replication proposed
    (``thunderagent:home``)."""

    def __post_init__(self) -> None:
        if not 0 < self.pause_threshold <= 1.0 or not 0 <= self.pause_target:
            raise ValueError("pause_threshold must be in (0, 1] and pause_target >= 0")
        if self.pause_target > self.pause_threshold:
            raise ValueError("pause_target must be <= pause_threshold")
        if not 0 <= self.resume_hysteresis <= self.pause_threshold:
            raise ValueError("resume_hysteresis must be in [0, pause_threshold]")
        if not (self.tick_s > 0 and self.resume_timeout_s > 0):
            raise ValueError("tick_s and resume_timeout_s must be > 0")


@dataclass(slots=True, eq=False)
class Program:
    """One program (agent session) in the table (``program_state.py``)."""

    pid: str
    status: Status = "reasoning"
    lifecycle: Lifecycle = "active"
    replica: int | None = None
    tokens: int = 0
    """``token_total``"""
    steps: int = 0
    marked: bool = False
    """``marked_for_pause``: paused when its turn in flight ends."""
    acting_since: float | None = None
    paused_from: int | None = None
    """The replica it was paused from (None: paused before it had one)."""


@dataclass(slots=True)
class _Usage:
    capacity: int
    used: int = 0
    programs: list[Program] = field(default_factory=list)


class ProgramScheduler:
    """The router's program table and its decisions, with time passed in (no I/O: the
    gateway policy :class:`ThunderAgent` waits and wakes on its answers).

    ``capacities``: each replica's retention budget in tokens. ``on_resume`` is called
    with a program id when that program is resumed (its waiting turns may go).
    """

    def __init__(
        self,
        capacities: Sequence[int],
        config: ThunderAgentConfig | None = None,
        on_resume: Callable[[str], None] | None = None,
    ) -> None:
        if not capacities or any(c <= 0 for c in capacities):
            raise ValueError("every replica needs a positive capacity")
        self.capacities = list(capacities)
        self.cfg = config or ThunderAgentConfig()
        self.on_resume = on_resume or (lambda pid: None)
        self.programs: dict[str, Program] = {}
        self.paused: dict[str, None] = {}
        """Paused program ids, oldest pause first (ties in the resume order go that way)."""
        self.origin: float | None = None
        self.ticks = 0
        self.created = self.expired = self.ended = 0
        self.pauses = self.resumes = self.forced = self.moved = self.marks = 0
        self.peak_paused = 0

    # ---------------------------------------------------------------- accounting

    def program_tokens(self, p: Program, now: float, *, decayed: bool = False) -> int:
        """``_program_tokens``: a ``REASONING`` program's size; an ``ACTING`` one's
        weighted (the budget) or decayed by its idle time (the load ranking)."""
        if p.status != "acting":
            return p.tokens
        if not decayed:
            return int(p.tokens * self.cfg.acting_token_weight)
        tau = max(self.cfg.acting_decay_tau_s, 1e-3)
        idle = max(0.0, now - p.acting_since) if p.acting_since is not None else 0.0
        return int(p.tokens * 2.0 ** (-(idle / tau)))

    def usage(self, now: float) -> list[_Usage]:
        """Each replica's budget use from its ``ACTIVE`` programs."""
        out = [_Usage(c) for c in self.capacities]
        buf = self.cfg.buffer_per_program
        for p in self.programs.values():
            if p.replica is None or p.lifecycle != "active":
                continue
            u = out[p.replica]
            u.programs.append(p)
            u.used += self.program_tokens(p, now) + buf
        return out

    def utilization(self, now: float) -> list[float]:
        """Each replica's use over its budget."""
        return [u.used / u.capacity for u in self.usage(now)]

    def _decayed_used(self, u: _Usage, now: float) -> int:
        tokens = sum(self.program_tokens(p, now, decayed=True) for p in u.programs)
        return tokens + len(u.programs) * self.cfg.buffer_per_program

    def _least_loaded(self, usage: list[_Usage], now: float) -> int:
        return max(
            range(len(usage)), key=lambda i: usage[i].capacity - self._decayed_used(usage[i], now)
        )

    # ---------------------------------------------------------------- requests

    def admit(self, pid: str, prompt_tokens: int, now: float) -> bool:
        """A turn of program ``pid`` with ``prompt_tokens`` arrives (``_admit_locked``):
        True when it must wait for the program's resume; else it may go, to
        ``programs[pid].replica`` (None: unpinned)."""
        if self.origin is None:
            self.origin = now
        p = self.programs.get(pid)
        new = p is None
        if p is None:
            p = self.programs[pid] = Program(pid)
            self.created += 1
        p.steps += 1
        if prompt_tokens > 0:
            p.tokens = prompt_tokens
        p.status = "reasoning"
        p.acting_since = None
        if p.lifecycle == "paused":
            return True
        if p.replica is not None:
            return False
        replica = self._place(self.usage(now), p.tokens, now, queue_behind_paused=new)
        if replica is not None:
            p.replica = replica
            return False
        if not new:
            return False  # running and unplaceable: through, unpinned
        self._pause(p, now)  # admission_full
        return True

    def _place(
        self, usage: list[_Usage], tokens: int, now: float, *, queue_behind_paused: bool
    ) -> int | None:
        if queue_behind_paused and self.paused:
            return None
        required = tokens + self.cfg.buffer_per_program
        best: int | None = None
        best_load = 0
        for i, u in enumerate(usage):
            if u.capacity - u.used < required:
                continue
            load = self._decayed_used(u, now)
            if best is None or load < best_load:
                best, best_load = i, load
        return best

    def served_by(self, pid: str, replica: int) -> None:
        """An unpinned turn of ``pid`` reached ``replica`` (the first chunk's back-fill,
        ``assign_worker``): an active program without a replica takes it."""
        p = self.programs.get(pid)
        if p is not None and p.lifecycle == "active" and p.replica is None:
            p.replica = replica

    def complete(self, pid: str, prompt_tokens: int, completion_tokens: int, now: float) -> None:
        """A turn of ``pid`` ended (``after_request``): the program is ``ACTING`` with
        its new size, and paused now if it was marked."""
        p = self.programs.get(pid)
        if p is None:
            return
        p.tokens = prompt_tokens + completion_tokens
        p.status = "acting"
        p.acting_since = now
        if p.marked:
            p.marked = False
            self._pause_acting(p, now)

    def end(self, pid: str) -> bool:
        """Release ``pid`` (a final request; ``end_program``)."""
        p = self.programs.pop(pid, None)
        if p is None:
            return False
        self.paused.pop(pid, None)
        p.lifecycle = "terminated"
        self.ended += 1
        self.on_resume(pid)  # wake any turn waiting on it
        return True

    def force_resume(self, pid: str, now: float) -> bool:
        """A turn of ``pid`` waited ``resume_timeout_s``: resume it on the least loaded
        replica (True if it was still paused)."""
        p = self.programs.get(pid)
        if p is None or p.lifecycle != "paused":
            return False
        usage = self.usage(now)
        self._resume(p, self._least_loaded(usage, now))
        self.forced += 1
        return True

    # ---------------------------------------------------------------- the tick

    def catch_up(self, now: float) -> None:
        """Run the ticks due by ``now`` on the grid ``origin + k * tick_s``."""
        if self.origin is None:
            self.origin = now
            return
        due = math.floor((now - self.origin) / self.cfg.tick_s + 1e-9)
        while self.ticks < due:
            self.ticks += 1
            self.tick(self.origin + self.ticks * self.cfg.tick_s)

    def next_tick(self) -> float:
        """When the next tick is due."""
        origin = 0.0 if self.origin is None else self.origin
        return origin + (self.ticks + 1) * self.cfg.tick_s

    def tick(self, now: float) -> None:
        """One scheduler tick: idle expiry, then resume, then pause (``_scheduler_tick``)."""
        self._expire(now)
        usage = self.usage(now)
        self._resume_greedy(usage, now)
        self._pause_until_safe(usage, now)

    def _expire(self, now: float) -> None:
        ttl = self.cfg.idle_ttl_s
        if ttl <= 0:
            return
        old = [
            p
            for p in self.programs.values()
            if p.status == "acting" and p.acting_since is not None and now - p.acting_since >= ttl
        ]
        for p in old:
            self.end(p.pid)
            self.ended -= 1
            self.expired += 1

    def _pause(self, p: Program, now: float) -> None:
        p.lifecycle = "paused"
        p.paused_from = p.replica
        p.replica = None
        self.paused[p.pid] = None
        self.pauses += 1
        self.peak_paused = max(self.peak_paused, len(self.paused))

    def _pause_acting(self, p: Program, now: float) -> bool:
        if p.lifecycle == "paused" or p.status != "acting":
            return False
        self._pause(p, now)
        return True

    def _pause_until_safe(self, usage: list[_Usage], now: float) -> None:
        cfg = self.cfg
        buf = cfg.buffer_per_program
        for u in usage:
            if u.used <= u.capacity * cfg.pause_threshold:
                continue
            target = u.capacity * min(cfg.pause_target, cfg.pause_threshold)
            acting = sorted((p for p in u.programs if p.status == "acting"), key=lambda p: p.tokens)
            for p in acting:
                if u.used <= target:
                    break
                if p.marked:
                    continue
                freed = self.program_tokens(p, now) + buf
                if not self._pause_acting(p, now):
                    continue
                u.programs.remove(p)
                u.used -= freed
            if u.used > target:
                # Marking frees nothing now; upstream marks every candidate.
                for p in sorted(
                    (p for p in u.programs if p.status == "reasoning"), key=lambda p: p.tokens
                ):
                    if not p.marked and p.lifecycle == "active":
                        p.marked = True
                        self.marks += 1

    def resume_order(self) -> list[Program]:
        """The paused programs in the order resume considers them: a turn waiting first,
        then new programs, then idle ones; smallest first within each."""

        def group(p: Program) -> int:
            if p.steps <= 1:
                return 1
            return 0 if p.status == "reasoning" else 2

        paused = [self.programs[pid] for pid in self.paused if pid in self.programs]
        return sorted(paused, key=lambda p: (group(p), p.tokens))

    def _resume_greedy(self, usage: list[_Usage], now: float) -> None:
        if not self.paused:
            return
        cfg = self.cfg
        buf = cfg.buffer_per_program
        ceiling = max(0.0, cfg.pause_threshold - cfg.resume_hysteresis)
        caps = [(i, int(u.capacity * ceiling) - u.used) for i, u in enumerate(usage)]
        caps = [(i, r) for i, r in caps if r > buf]
        if not caps:
            return
        caps.sort(key=lambda x: -x[1])
        total = sum(r for _, r in caps)
        chosen: list[Program] = []
        cumulative = 0
        for p in self.resume_order():
            required = p.tokens + buf
            if cumulative + required <= total:
                chosen.append(p)
                cumulative += required
        if not chosen:
            return
        chosen.sort(key=lambda p: -p.tokens)
        min_required = min(p.tokens for p in chosen) + buf
        for p in chosen:
            if not caps or min_required > caps[0][1]:
                break
            required = p.tokens + buf
            home = p.paused_from if cfg.resume_home else None
            k = next(
                (
                    k
                    for k, (i, r) in enumerate(caps)
                    if required <= r and (home is None or i == home)
                ),
                None,
            )
            if k is None:
                continue
            replica, remaining = caps[k]
            self._resume(p, replica)
            u = usage[replica]
            u.programs.append(p)
            u.used += self.program_tokens(p, now) + buf
            left = remaining - required
            if left > buf:
                caps[k] = (replica, left)
                caps.sort(key=lambda x: -x[1])
            else:
                caps.pop(k)

    def _resume(self, p: Program, replica: int) -> None:
        if p.lifecycle != "paused":
            return
        p.lifecycle = "active"
        p.replica = replica
        self.paused.pop(p.pid, None)
        self.resumes += 1
        if p.paused_from is not None and p.paused_from != replica:
            self.moved += 1
        p.paused_from = None
        self.on_resume(p.pid)


class _Waiter:
    __slots__ = ("event", "pid", "ticker")

    def __init__(self, pid: str) -> None:
        self.pid = pid
        self.event = anyio.Event()
        self.ticker = False


class ThunderAgent(PeerPolicy):
    """Dynamo's ThunderAgent router in front of its KV router (see the module docstring)."""

    name = "thunderagent"
    source = (
        "ai-dynamo/dynamo components/src/dynamo/thunderagent_router/"
        "{router,program_state,capacity,__main__}.py (08cda654593d)"
    )

    def __init__(self, config: ThunderAgentConfig | None = None, *, seed: int = 0) -> None:
        self.cfg = config or ThunderAgentConfig()
        self.kv = Dynamo(seed=seed)
        self.scheduler: ProgramScheduler | None = None
        self._waiters: dict[str, list[_Waiter]] = {}
        self._ticker: _Waiter | None = None
        self._pins: dict[int, int | None] = {}
        """request seq -> the replica its program was pinned to at admission"""
        self._programs: dict[int, str] = {}
        """request seq -> its program, for the requests the scheduler tracks"""
        self.held = 0
        """Turns that waited for their program's resume."""
        self.hold_s: list[float] = []
        """How long each of them waited."""

    def bind(self, replicas: Sequence[ReplicaView]) -> None:
        super().bind(replicas)
        self.kv.bind(replicas)
        caps = []
        for r in replicas:
            c = r.engine.config
            caps.append(c.block_size * (c.num_gpu_blocks + c.num_host_blocks))
        self.scheduler = ProgramScheduler(caps, self.cfg, self._wake)

    # ---------------------------------------------------------------- waiting

    def _wake(self, pid: str) -> None:
        for w in self._waiters.pop(pid, ()):
            w.event.set()

    def _hand_over(self) -> None:
        """Make one waiting turn the ticker (the one that wakes at each tick)."""
        if self._ticker is not None:
            return
        for ws in self._waiters.values():
            if ws:
                w = ws[0]
                self._ticker = w
                w.ticker = True
                w.event.set()
                return

    def _leave(self, w: _Waiter) -> None:
        ws = self._waiters.get(w.pid)
        if ws is not None and w in ws:
            ws.remove(w)
            if not ws:
                del self._waiters[w.pid]
        if self._ticker is w:
            self._ticker = None
            self._hand_over()

    async def _wait(self, w: _Waiter, sched: ProgramScheduler) -> None:
        deadline = anyio.current_time() + self.cfg.resume_timeout_s
        self._waiters.setdefault(w.pid, []).append(w)
        if self._ticker is None:
            self._ticker = w
            w.ticker = True
        try:
            while True:
                now = anyio.current_time()
                if w.pid not in self._waiters or w not in self._waiters[w.pid]:
                    return  # resumed (or released)
                if now >= deadline:
                    sched.force_resume(w.pid, now)
                    self._wake(w.pid)
                    return
                until = min(deadline, sched.next_tick()) if w.ticker else deadline
                with anyio.move_on_after(max(0.0, until - now)):
                    await w.event.wait()
                if w.event.is_set():
                    w.event = anyio.Event()
                if w.ticker:
                    sched.catch_up(anyio.current_time())
        finally:
            self._leave(w)

    # ---------------------------------------------------------------- policy

    async def admit(self, req: GatewayRequest) -> None:
        sched = self.scheduler
        assert sched is not None, "bind() first"
        pid = req.headers.get(SESSION_HEADER) or None
        if pid is None:
            return  # passthrough: the KV router, no lifecycle
        now = anyio.current_time()
        sched.catch_up(now)
        if req.headers.get(FINAL_HEADER, "").strip().lower() == "true":
            p = sched.programs.get(pid)
            self._pins[req.seq] = p.replica if p is not None else None
            sched.end(pid)
            return
        if sched.admit(pid, req.prompt.num_tokens, now):
            self.held += 1
            await self._wait(_Waiter(pid), sched)
            self.hold_s.append(anyio.current_time() - now)
        p = sched.programs.get(pid)
        self._programs[req.seq] = pid
        self._pins[req.seq] = p.replica if p is not None else None

    def pick(self, req: GatewayRequest, now: float) -> int:
        pin = self._pins.pop(req.seq, None)
        if pin is None:
            return self.kv.pick(req, now)
        self.kv.track(req, pin)
        return pin

    def started(self, req: GatewayRequest, index: int, now: float) -> None:
        pid = self._programs.get(req.seq)
        if pid is not None and self.scheduler is not None:
            self.scheduler.served_by(pid, index)

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        self.kv.done(req, index, now)
        pid = self._programs.pop(req.seq, None)
        sched = self.scheduler
        if pid is None or sched is None:
            return
        sched.catch_up(now)
        sched.served_by(pid, index)
        sched.complete(pid, req.prompt.num_tokens, req.max_tokens, now)

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        holds = sorted(self.hold_s)
        return {
            "programs": s.created if s else 0,
            "held": self.held,
            "hold_p50_s": holds[len(holds) // 2] if holds else 0.0,
            "hold_max_s": holds[-1] if holds else 0.0,
            "pauses": s.pauses if s else 0,
            "resumes": s.resumes if s else 0,
            "resumes_moved": s.moved if s else 0,
            "forced_resumes": s.forced if s else 0,
            "marked": s.marks if s else 0,
            "expired": s.expired if s else 0,
            "peak_paused": s.peak_paused if s else 0,
        }


class ThunderAgentHome(ThunderAgent):
    """:class:`ThunderAgent` that resumes a program only on the replica it was paused from
    (``ThunderAgentConfig.resume_home``; a forced resume still goes anywhere): not
    Dynamo's behaviour but the replication's proposed follow-up, to measure what moving
    on resume costs."""

    name = "thunderagent:home"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(ThunderAgentConfig(resume_home=True), seed=seed)
