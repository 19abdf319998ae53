"""vllm-router's program scheduling (``--enable-program-scheduling``, vllm-project/router
0.1.17) in front of an inner request-level policy (``--policy``, consistent_hash by
default, as python -m benchmarks routing router runs it).

Sources: ``docs/program_scheduling.md`` (its configuration table: the defaults below),
``src/program_scheduling/identity.rs`` (who is a program), ``runtime.rs`` and
``request_pool.rs`` (program states, the RequestPool), ``scheduler_admission.rs``
(rank-local admission and resume order), ``scheduler_lifecycle.rs`` (completion, acting
TTL, pause, release), ``scheduler_fairness.rs`` (force-resume deadline, segment yield),
``binding/mod.rs`` (initial placement), ``policy.rs`` (the fitted acting TTL),
``scheduler_state.rs`` (``ProgramSchedulerConfig`` defaults).

- **Who is scheduled.** Only a request whose body carries ``vllm_xargs.agentic_context``
  (an object, or a JSON string of one up to 16 KiB): the default
  ``program_scheduling_enable_key``. Its program is ``program_id``, else
  ``"{task_id}:{agent_id}"`` (agent ``lead`` by default); ``expected_resume`` defaults to
  false for a blocking sub-agent, true otherwise. A request without it (a plain client,
  or agentrt with another dialect) "does not create Program state, enter RequestPool" and
  goes straight to the inner policy, unscheduled.
- **Placement.** A new program generation is bound to a replica by a consistent-hash
  ring of 160 virtual nodes per target (``"{target}:{i}"``, ``fbi_hash``) on its
  placement hash key: the first of the headers ``x-claude-code-session-id``,
  ``session-id``, ``x-session-id`` (as ``"header:NAME:VALUE"``), else the standalone
  policy's key (``hash_key.rs``). With agentrt's ``x-session-id`` this is the replica the
  inner ``consistent_hash`` picks for the same session. The task (``task_id``, the
  router's placement key) only groups programs; it does not move them. Resume is
  rank-local (``global_queue`` false): a program runs only on its bound replica.
- **Admission.** A program is ``paused`` until admitted; then ``active`` on its replica,
  where its requests dispatch at once (one RequestPool FIFO per program: the front
  request goes first). Without ``token_capacity_per_target`` (default null) admission is
  the program-count guard: at most ``max_active_programs_per_target`` (64) active
  programs per replica, and none while the replica's polled vLLM waiting count is at or
  above ``admission_waiting_request_threshold`` (1; polled every
  ``metrics_interval_seconds``, 1 s, and trusted for 3 intervals).
- **Acting TTL.** When a program's last in-flight request ends and none waits, it turns
  ``acting`` and keeps its slot for a TTL: the request's ``kv_retention_ttl_seconds`` when
  it carried one (it *replaces* the computed TTL; the source does not clamp it by
  ``max_acting_ttl_seconds``), else the fitted TTL: 0 until the replica has
  ``stats_window_size`` (100) return-interval samples, then the log-normal utility fit of
  ``policy.rs`` (cache-miss impact from the prefill cost model, capped by
  ``max_acting_ttl_seconds``, 10 s). When the TTL runs out (noticed at the next 1 s tick
  or the next completion) the program is paused and its slot freed; its next request
  waits in the replica's queue.
- **Resume order** (per replica, ``resume_order`` mru): expired force-resume deadline
  first, then larger request ``priority``, then programs not just yielded, then most
  recently finished, then first queued. A queued program is force-resumed (past the
  count and waiting gates) after its request's ``deadline_seconds``, else after
  ``force_resume_timeout_seconds`` (300).
- **Segment yield.** An acting program that has served ``max_segment_rounds`` (14)
  rounds since it was admitted is paused at once when another program waits on its
  replica, and resumes behind the others once.
- **End.** ``expected_resume: false`` on a request ends the program when that request
  is done and nothing else is pending: its slot and binding are freed at once. A paused
  program with nothing pending is dropped after ``paused_retention_ttl_seconds`` (1800).

Simplified: no token-capacity accounting (the default, and the router then uses the
count guard only), so no growth reserve, batch-gain admission or capacity repair; the
force-resume fallback is the static 300 s (the router shortens it by measured throughput
once its request window is mature); the cache-miss impact counts the whole prompt as
uncached (no shared-prefix observations) and every completed round as cache-continuous;
the 1 s tick runs lazily, at the next event or waiter wake-up after it; the waiting
count is read when a tick runs; ``queue_timeout_seconds`` (600) is not enforced (the
force resume at 300 s or the deadline always comes first); a malformed
``agentic_context`` (the router answers 400) passes as a plain request; no
``global_queue``, prediction profiles or PD modes. The replica's target id is its URL.
Unvalidated against the real router.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from ._base import GatewayRequest, PeerPolicy, ReplicaView
from ._fbi import fbi_hash
from ._vllm_router import ConsistentHash, hash_key

__all__ = ["ProgramIdentity", "ProgramScheduling", "program_identity"]

_MAX_CONTEXT_BYTES: Final = 16 * 1024
_PLACEMENT_HEADERS: Final = ("x-claude-code-session-id", "session-id", "x-session-id")

# The prefill cost model's defaults (policy.rs, PrefillCostModel::default).
_PREFILL_INTERCEPT_S: Final = 0.06600061907132926
_PREFILL_LINEAR_S_PER_1K: Final = 0.05702024012166613
_PREFILL_QUADRATIC_S_PER_1K2: Final = 0.0044057347937978475
_DECODE_ALPHA: Final = 0.15


@dataclass(frozen=True)
class ProgramIdentity:
    """What the router reads from one request's ``agentic_context``."""

    program_id: str
    placement_key: str
    """The task (``task_id``, else ``session_id``, else the program)."""
    placement_hash_key: str
    expected_resume: bool
    priority: int = 0
    deadline_s: float | None = None
    kv_retention_ttl_s: float | None = None


def _context(body: dict[str, Any]) -> dict[str, Any] | None:
    xargs = body.get("vllm_xargs")
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        raise ValueError("vllm_xargs must be an object")
    raw = xargs.get("agentic_context")
    if raw is None:
        return None
    if isinstance(raw, str):
        if len(raw.encode()) > _MAX_CONTEXT_BYTES:
            raise ValueError("agentic_context is over 16 KiB")
        raw = json.loads(raw)
    if not isinstance(raw, dict):
        raise ValueError("agentic_context must be an object")
    return raw


def _string(ctx: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = ctx.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"{key} must be a string-compatible identifier")
        text = str(value).strip()
        if not text:
            raise ValueError(f"{key} must not be empty")
        return text
    return None


def _number(ctx: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = ctx.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be seconds as a number")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{key} must be finite and non-negative")
        return float(value)
    return None


def _flag(ctx: dict[str, Any], key: str) -> bool | None:
    value = ctx.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be a boolean")
    return value


def _scoped(task: str, agent: str) -> str:
    return agent if agent.startswith(f"{task}:") else f"{task}:{agent}"


def _placement_hash_key(req: GatewayRequest) -> str:
    for name in _PLACEMENT_HEADERS:
        value = req.headers.get(name, "").strip()
        if value:
            return f"header:{name}:{value}"
    return hash_key(req)


def program_identity(req: GatewayRequest) -> ProgramIdentity | None:
    """The program ``req`` belongs to (``identity.rs``, ``canonical_identity``), or None
    for a request without ``vllm_xargs.agentic_context``; a :class:`ValueError` for a
    malformed one."""
    ctx = _context(req.body)
    if ctx is None:
        return None
    explicit = _string(ctx, "program_id")
    body_task = _string(ctx, "task_id")
    session = _string(ctx, "session_id") or req.headers.get("x-session-id", "").strip() or None
    task = body_task if body_task is not None or (explicit and "task_id" in ctx) else session
    agent = _string(ctx, "agent_id")
    if agent is None and task is not None:
        agent = "lead"
    if agent is not None and task is not None and agent.startswith(f"{task}:"):
        agent = agent[len(task) + 1 :]
    role = _string(ctx, "agent_role")
    if role is None and agent is not None:
        role = "lead" if agent == "lead" else "subagent"
    program = explicit or (_scoped(task, agent) if task and agent else None)
    if program is None:
        return None
    parent = _string(ctx, "parent_program_id", "parent_id")
    if parent is None and role == "subagent" and task is not None:
        parent = _scoped(task, "lead")
    blocks = _flag(ctx, "blocks_parent")
    if blocks is None:
        blocks = _flag(ctx, "blocking_parent")
    if blocks is None:
        blocks = role == "subagent"
    if parent == program:
        raise ValueError("parent_program_id must differ from program_id")
    if blocks and parent is None:
        raise ValueError("blocks_parent requires parent_program_id")
    resume = _flag(ctx, "expected_resume")
    if resume is None:
        resume = not (blocks and role == "subagent")
    priority = ctx.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")
    return ProgramIdentity(
        program_id=program,
        placement_key=task or session or program,
        placement_hash_key=_placement_hash_key(req),
        expected_resume=resume,
        priority=priority,
        deadline_s=_number(ctx, "deadline", "deadline_seconds"),
        kv_retention_ttl_s=_number(ctx, "kv_retention_ttl", "kv_retention_ttl_seconds"),
    )


def cache_miss_impact_s(uncached_tokens: int) -> float:
    """``cache_miss_impact_seconds``: the prefill cost model's cold prefill, with its
    decode interference (``policy.rs``)."""
    if uncached_tokens <= 0:
        return 0.0
    x = uncached_tokens / 1000.0
    prefill = (
        _PREFILL_INTERCEPT_S + _PREFILL_LINEAR_S_PER_1K * x + _PREFILL_QUADRATIC_S_PER_1K2 * x * x
    )
    return prefill * (2.0 - _DECODE_ALPHA)


def _normal_cdf(value: float) -> float:
    return 0.5 * (1.0 + math.erf(value / math.sqrt(2.0)))


def fitted_acting_ttl(intervals: Sequence[float], impact_s: float, max_ttl_s: float) -> float:
    """``fitted_acting_ttl``: the TTL among 0, 50 ms, the cap and 32 log-spaced values
    between that maximises ``P(T<d) C - E[T; T<d] - d P(T>=d)`` for a log-normal fit of
    the return intervals ``T`` (``C``: the cache-miss impact); 0 if none gains."""
    xs = [x for x in intervals if math.isfinite(x) and x > 0]
    if not xs:
        return 0.0
    logs = [math.log(x) for x in xs]
    mu = sum(logs) / len(logs)
    sigma = max(math.sqrt(sum((v - mu) ** 2 for v in logs) / len(logs)), 1e-6)
    cap = min(max_ttl_s, impact_s)
    if cap <= 0 or impact_s <= 0:
        return 0.0
    low = min(0.05, cap)
    candidates = [0.0, low, cap]
    if cap > low:
        a, b = math.log(low), math.log(cap)
        candidates += [math.exp(a + (b - a) * i / 31) for i in range(32)]
    mean = math.exp(mu + sigma * sigma / 2)
    best, best_utility = 0.0, -math.inf
    for ttl in candidates:
        if ttl <= 0:
            utility = 0.0
        else:
            hit = _normal_cdf((math.log(ttl) - mu) / sigma)
            truncated = mean * _normal_cdf((math.log(ttl) - mu - sigma * sigma) / sigma)
            utility = impact_s * hit - truncated - ttl * (1 - hit)
        if utility >= best_utility:
            best, best_utility = ttl, utility
    return 0.0 if best_utility < 0 else best


class _Waiter:
    __slots__ = ("event", "ident", "req")

    def __init__(self, req: GatewayRequest, ident: ProgramIdentity) -> None:
        self.req = req
        self.ident = ident
        self.event = anyio.Event()


@dataclass(eq=False)
class _Program:
    id: str
    target: int
    placement_key: str
    active: bool = False
    acting: bool = False
    inflight: int = 0
    waiting: deque[_Waiter] = field(default_factory=deque)
    completed: int = 0
    rounds: int = 0
    """Rounds served since the program was last admitted."""
    yielded: bool = False
    terminate: bool = False
    last_finished: float | None = None
    last_impact_s: float = 0.0
    queued_at: float | None = None
    force_deadline: float | None = None
    ttl_deadline: float | None = None
    paused_at: float | None = None


class ProgramScheduling(PeerPolicy):
    """vllm-router's program scheduling over an inner request-level policy (see the
    module docstring). Keyword arguments are the router's ``program_scheduling`` fields,
    at its defaults; ``inner`` routes requests without program identity."""

    name = "vllm-router:programs"
    source = (
        "vllm-project/router docs/program_scheduling.md, src/program_scheduling/"
        "(identity.rs, runtime.rs, scheduler_admission.rs, scheduler_lifecycle.rs, "
        "scheduler_fairness.rs, binding/mod.rs, policy.rs)"
    )

    def __init__(
        self,
        inner: PeerPolicy | None = None,
        *,
        max_active_programs_per_target: int = 64,
        admission_waiting_request_threshold: int = 1,
        metrics_interval_s: float = 1.0,
        force_resume_timeout_s: float = 300.0,
        paused_retention_ttl_s: float = 1800.0,
        max_acting_ttl_s: float = 10.0,
        max_segment_rounds: int = 14,
        stats_window_size: int = 100,
        hash_virtual_nodes: int = 160,
    ) -> None:
        if max_active_programs_per_target < 1:
            raise ValueError("max_active_programs_per_target must be at least 1")
        if metrics_interval_s <= 0:
            raise ValueError("metrics_interval_s must be positive")
        self.inner = inner if inner is not None else ConsistentHash()
        self.max_active = max_active_programs_per_target
        self.waiting_threshold = admission_waiting_request_threshold
        self.interval_s = metrics_interval_s
        self.force_resume_timeout_s = force_resume_timeout_s
        self.paused_retention_ttl_s = paused_retention_ttl_s
        self.max_acting_ttl_s = max_acting_ttl_s
        self.max_segment_rounds = max_segment_rounds
        self.window = stats_window_size
        self.virtual_nodes = hash_virtual_nodes
        self.programs: dict[str, _Program] = {}
        self.counts: dict[str, int] = {
            "admit": 0,
            "force_resume": 0,
            "ttl_expired": 0,
            "max_segment_yield": 0,
            "terminate": 0,
            "released_paused": 0,
            "plain": 0,
            "invalid": 0,
        }
        """Transitions so far, by the router's metric reasons (``program_admit``, ...)."""
        self._bindings: dict[str, int] = {}
        self._queues: list[list[_Program]] = []
        self._active: list[int] = []
        self._intervals: list[deque[float]] = []
        self._observed: list[tuple[float, int] | None] = []
        self._dispatched: dict[int, tuple[_Program, ProgramIdentity]] = {}
        self._last_tick = -math.inf

    def bind(self, replicas: Sequence[ReplicaView]) -> None:
        super().bind(replicas)
        self.inner.bind(replicas)
        n = len(replicas)
        self._queues = [[] for _ in range(n)]
        self._active = [0] * n
        self._intervals = [deque(maxlen=self.window) for _ in range(n)]
        self._observed = [None] * n
        ring = sorted(
            (fbi_hash(f"{r.url}:{i}"), r.index)
            for r in sorted(replicas, key=lambda r: r.url)
            for i in range(self.virtual_nodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [o for _, o in ring]

    # -- state ---------------------------------------------------------------------

    def active_on(self, index: int) -> int:
        """Active programs (reasoning or acting) on replica ``index``."""
        return self._active[index]

    def state(self, program_id: str) -> str | None:
        """``"reasoning"``, ``"acting"``, ``"paused"``, or None (no live program)."""
        p = self.programs.get(program_id)
        if p is None:
            return None
        if not p.active:
            return "paused"
        return "acting" if p.acting else "reasoning"

    def _bind_target(self, ident: ProgramIdentity) -> int:
        target = self._bindings.get(ident.program_id)
        if target is None:
            h = fbi_hash(ident.placement_hash_key)
            i = bisect_left(self._points, h)
            target = self._owners[i if i < len(self._owners) else 0]
            self._bindings[ident.program_id] = target
        return target

    # -- the router's lifecycle ------------------------------------------------------

    def _next_tick(self, now: float) -> float:
        return (math.floor(now / self.interval_s + 1e-9) + 1) * self.interval_s

    def _catch_up(self, now: float) -> None:
        """Run the periodic tick that the router's 1 s ticker ran since the last event."""
        tick = math.floor(now / self.interval_s + 1e-9) * self.interval_s
        if tick > self._last_tick:
            self._last_tick = tick
            for r in self.replicas:
                self._observed[r.index] = (now, r.queued)
            self._periodic(tick)

    def _periodic(self, now: float) -> None:
        for p in list(self.programs.values()):
            if (
                p.active
                and p.acting
                and p.inflight == 0
                and p.ttl_deadline is not None
                and p.ttl_deadline <= now
            ):
                self._pause(p, now)
                self.counts["ttl_expired"] += 1
            elif (
                not p.active
                and p.inflight == 0
                and not p.waiting
                and p.paused_at is not None
                and now - p.paused_at >= self.paused_retention_ttl_s
            ):
                self._release(p)
                self.counts["released_paused"] += 1
        self._schedule(now)

    def _pause(self, p: _Program, now: float) -> None:
        if p.active:
            self._active[p.target] -= 1
        p.active = False
        p.paused_at = now
        p.rounds = 0
        p.ttl_deadline = None

    def _release(self, p: _Program) -> None:
        if p.active:
            self._active[p.target] -= 1
            p.active = False
        self.programs.pop(p.id, None)
        self._bindings.pop(p.id, None)
        queue = self._queues[p.target]
        if p in queue:
            queue.remove(p)

    def _gate_closed(self, index: int, now: float) -> bool:
        seen = self._observed[index]
        return (
            self.waiting_threshold > 0
            and seen is not None
            and now - seen[0] <= 3 * self.interval_s
            and seen[1] >= self.waiting_threshold
        )

    def _resume_key(self, p: _Program, now: float) -> tuple[Any, ...]:
        forced = p.force_deadline is not None and p.force_deadline <= now
        priority = p.waiting[0].ident.priority if p.waiting else 0
        last = p.last_finished
        return (
            not forced,
            -priority,
            p.yielded,
            last is None,
            -(last or 0.0),
            p.queued_at if p.queued_at is not None else math.inf,
            p.id,
        )

    def _schedule(self, now: float) -> None:
        for index, queue in enumerate(self._queues):
            if not queue:
                continue
            gate = self._gate_closed(index, now)
            active = self.active_on(index)
            for p in sorted(
                (p for p in queue if not p.active and p.waiting),
                key=lambda p: self._resume_key(p, now),
            ):
                forced = p.force_deadline is not None and p.force_deadline <= now
                if not forced and (gate or active >= self.max_active):
                    continue
                self._admit(p, forced)
                active += 1

    def _admit(self, p: _Program, forced: bool) -> None:
        self._active[p.target] += 1
        p.active = True
        p.acting = False
        p.rounds = 0
        p.ttl_deadline = None
        p.paused_at = None
        p.queued_at = None
        p.force_deadline = None
        p.yielded = False
        queue = self._queues[p.target]
        if p in queue:
            queue.remove(p)
        self.counts["force_resume" if forced else "admit"] += 1
        p.waiting[0].event.set()

    # -- the gateway's calls ---------------------------------------------------------

    async def admit(self, req: GatewayRequest) -> None:
        try:
            ident = program_identity(req)
        except ValueError:
            self.counts["invalid"] += 1
            ident = None
        if ident is None:
            self.counts["plain"] += 1
            await self.inner.admit(req)
            return
        now = anyio.current_time()
        self._catch_up(now)
        p = self.programs.get(ident.program_id)
        if p is None:
            p = _Program(
                ident.program_id, self._bind_target(ident), ident.placement_key, paused_at=now
            )
            self.programs[p.id] = p
        elif p.inflight == 0 and not p.waiting and p.last_finished is not None:
            self._intervals[p.target].append(now - p.last_finished)
        p.acting = False
        waiter = _Waiter(req, ident)
        p.waiting.append(waiter)
        if not p.active:
            queue = self._queues[p.target]
            if p not in queue:
                queue.append(p)
            if p.queued_at is None:
                p.queued_at = now
            wait = self.force_resume_timeout_s if ident.deadline_s is None else ident.deadline_s
            p.force_deadline = now + wait
            self._schedule(now)
        try:
            while not (p.active and p.waiting[0] is waiter):
                wake = self._next_tick(now)
                if p.force_deadline is not None:
                    wake = min(wake, p.force_deadline)
                with anyio.move_on_after(max(0.0, wake - now)):
                    await waiter.event.wait()
                now = anyio.current_time()
                if not waiter.event.is_set():
                    self._catch_up(now)
                    self._schedule(now)
                waiter.event = anyio.Event()
        except BaseException:
            self._cancel(p, waiter, anyio.current_time())
            raise
        p.waiting.popleft()
        p.inflight += 1
        self._dispatched[req.seq] = (p, ident)
        if p.waiting and p.active:
            p.waiting[0].event.set()

    def _cancel(self, p: _Program, waiter: _Waiter, now: float) -> None:
        if waiter in p.waiting:
            was_front = p.waiting[0] is waiter
            p.waiting.remove(waiter)
            if was_front and p.waiting and p.active:
                p.waiting[0].event.set()
        if not p.waiting:
            queue = self._queues[p.target]
            if p in queue:
                queue.remove(p)
            if p.inflight == 0:
                if p.completed == 0 and self.programs.get(p.id) is p:
                    self._release(p)
                elif p.active:
                    p.acting = True
        self._schedule(now)

    def pick(self, req: GatewayRequest, now: float) -> int:
        entry = self._dispatched.get(req.seq)
        if entry is None:
            return self.inner.pick(req, now)
        return entry[0].target

    def reply_headers(self, req: GatewayRequest, index: int) -> list[tuple[bytes, bytes]]:
        if req.seq in self._dispatched:
            return []
        return self.inner.reply_headers(req, index)

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        entry = self._dispatched.pop(req.seq, None)
        if entry is None:
            self.inner.done(req, index, now)
            return
        p, ident = entry
        if self.programs.get(p.id) is not p or p.inflight == 0:
            return
        p.inflight -= 1
        p.completed += 1
        p.rounds += 1
        p.last_finished = now
        impact = cache_miss_impact_s(req.prompt.num_tokens)
        p.last_impact_s = impact
        p.terminate |= not ident.expected_resume
        if p.inflight == 0 and not p.waiting:
            if p.terminate:
                self._release(p)
                self.counts["terminate"] += 1
            else:
                if ident.kv_retention_ttl_s is not None:
                    ttl = ident.kv_retention_ttl_s
                else:
                    intervals = self._intervals[p.target]
                    ttl = (
                        fitted_acting_ttl(intervals, impact, self.max_acting_ttl_s)
                        if len(intervals) >= self.window
                        else 0.0
                    )
                p.acting = True
                p.ttl_deadline = now + ttl
                if p.rounds >= self.max_segment_rounds and any(
                    q is not p for q in self._queues[p.target]
                ):
                    self._pause(p, now)
                    p.yielded = True
                    self.counts["max_segment_yield"] += 1
        self._catch_up(now)
        self._periodic(now)

    def control(
        self, path: str, params: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        return self.inner.control(path, params, body)
