"""The engine loop: iteration-level scheduling of one simulated replica.

Each step the scheduler (vLLM V1 semantics) gives every running request its next tokens
within the step's token budget (1 for a decode, a chunk for a prefill), preempting the
lowest-priority running request (recompute) when KV blocks run out, then admits waiting
requests in FCFS or priority order while the budget, ``max_num_seqs`` and KV allow. The step
then lasts ``CostModel.step_seconds(...)`` of simulated time.

Time only advances through ``anyio.sleep`` and is only read through
``anyio.current_time()``: the loop runs in wall-clock time on asyncio, and in virtual time
under trio's ``MockClock(autojump_threshold=0)``. When nothing changes for a while (only
decodes run, nothing can be admitted) the loop sleeps through many decode steps at once; an
arrival or an abort interrupts that sleep, and the step in progress completes first.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from ..scheduling._kvevents import KvEvent
from ._config import EngineConfig
from ._kv import ENDED, GPU, QUEUED, KVCache, Node
from ._tokenize import Prompt, Tokenizer, slice_runs

__all__ = ["Engine", "ReplicaStats", "RequestRejected", "SimRequest"]

WAITING: Final = 0
RUNNING: Final = 1
_RUN_AHEAD_STEPS: Final = 256
"""Most prefill steps computed ahead in one go."""
FINISHED: Final = 2
ABORTED: Final = 3
_PREFETCH_RETRY_S: Final = 0.1
"""How often a prefetch that found no room on the accelerator tries again."""
_MAX_SESSIONS: Final = 1 << 16
"""Sessions whose last path the engine remembers for tool-start notices (LRU)."""


class RequestRejected(ValueError):
    """The engine refuses a request (too long for the model or the KV cache)."""


class SimRequest:
    """One request inside the engine; the HTTP layer waits on it."""

    __slots__ = (
        "_event",
        "anonymous",
        "arrival",
        "cached_tokens",
        "deepest",
        "final",
        "finish_time",
        "first_token_time",
        "host_cached_tokens",
        "idle_expected",
        "insert_blocked",
        "max_tokens",
        "notified",
        "notify_every",
        "num_computed",
        "num_output",
        "priority",
        "private",
        "prompt",
        "prompt_blocks",
        "prompt_len",
        "queued_blocks",
        "request_id",
        "resumed",
        "scheduled",
        "seq",
        "session",
        "status",
        "stream",
        "tree_blocks",
    )

    def __init__(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        request_id: str,
        priority: int,
        session: Any,
        idle_expected: float | None,
        stream: bool,
        stream_interval: int,
        arrival: float,
        seq: int,
        final: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_len = prompt.num_tokens
        self.prompt_blocks = prompt.num_full_blocks
        self.max_tokens = max_tokens
        self.priority = priority
        self.session = session
        self.anonymous = False
        """No session was given: the request is its own session, never remembered."""
        self.queued_blocks = 0
        """Blocks this request counts for in the queued demand while it waits."""
        self.resumed = False
        """Its session's KV was kept (pinned) for it: FCFS admits it ahead of the queue."""
        self.idle_expected = idle_expected
        self.final = final
        """The caller declared this its session's last call (``final`` in ``x-agentrt``)."""
        self.stream = stream
        self.notify_every = stream_interval if stream else max_tokens
        self.arrival = arrival
        self.seq = seq
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.notified = 0
        self.deepest: Node | None = None
        self.tree_blocks = 0
        self.private = 0
        self.insert_blocked = False
        self.scheduled = False
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self._event: anyio.Event | None = None

    @property
    def done(self) -> bool:
        """Finished or aborted."""
        return self.status >= FINISHED

    async def wait_output(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens are out (or the request ended); the count."""
        while self.num_output <= seen and self.status < FINISHED:
            ev = self._event
            if ev is None:
                ev = self._event = anyio.Event()
            await ev.wait()
        return self.num_output

    def _notify(self) -> None:
        self.notified = self.num_output
        ev = self._event
        if ev is not None:
            self._event = None
            ev.set()


class _PendingPrefetch:
    """A prefetch scheduled for a session's offloaded tail."""

    __slots__ = ("cancelled", "deepest", "session", "start", "until")

    def __init__(self, session: Any, deepest: Node, start: float, until: float) -> None:
        self.session = session
        self.deepest = deepest
        self.start = start
        self.until = until
        self.cancelled = False


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """A snapshot of one replica's engine (:meth:`Replica.stats`)."""

    name: str
    time_s: float
    """The engine clock (``anyio.current_time()``) when the snapshot was taken."""
    running: int
    waiting: int
    kv_usage: float
    """Fraction of KV blocks referenced or pinned (vLLM's ``kv_cache_usage_perc``)."""
    gpu_blocks: int
    gpu_blocks_cached: int
    host_blocks: int
    host_blocks_used: int
    steps: int
    busy_s: float
    """Simulated seconds spent running steps."""
    requests_received: int
    requests_finished: int
    requests_aborted: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache (once per admission), like vLLM."""
    prefix_cache_hits: int
    """Of those, tokens found in the accelerator's cache."""
    host_cache_hits: int
    """Tokens found in the host tier (loaded back, not recomputed)."""
    evicted_blocks: int
    offloaded_blocks: int
    """Blocks written to the host tier (by eviction or by a tool-wait offload)."""
    loaded_blocks: int
    """Blocks read back from the host tier when a request was admitted (the step waits)."""
    prefetched_blocks: int = 0
    """Blocks read back from the host tier by prefetches (overlapping the steps)."""
    host_bytes_out: int = 0
    """Bytes written to the host tier (``offloaded_blocks`` in bytes)."""
    host_bytes_in: int = 0
    """Bytes read back from the host tier (loaded and prefetched blocks)."""
    prefetches: int = 0
    """Prefetches started."""
    prefetches_useful: int = 0
    """Prefetches whose blocks a request used."""
    prefetches_wasted: int = 0
    """Prefetches whose blocks were evicted before any request used them."""
    prefetches_skipped: int = 0
    """Prefetches not started (no room on the accelerator before the pin deadline, or
    nothing left on the host)."""
    pins_yielded_blocks: int = 0
    """Pinned blocks unpinned early so that a running request could grow (not preempted)."""
    resumed_first: int = 0
    """Requests queued ahead of the FCFS queue (the resumed lane) because their session's
    KV was kept for them."""
    tool_waits_pinned: int = 0
    """Tool waits whose KV was pinned (``keep``/``pin``, short waits, low pressure)."""
    tool_waits_offloaded: int = 0
    """Tool waits whose KV went to the host tier with a prefetch scheduled."""
    tool_waits_dropped: int = 0
    """Tool waits whose KV was freed at once."""
    tool_waits_lru: int = 0
    """Tool waits left to LRU by the policy (``adaptive`` with a very long wait at low
    pressure, or no host tier) or by a fallback."""
    tool_waits_resume: int = 0
    """Tool waits whose expected resume was declared to eviction (``resume``)."""
    tool_wait_fallbacks: int = 0
    """Offloads not done because the host tier had no room (left to LRU)."""
    final_calls: int = 0
    """Finished calls their session declared its last (``final``)."""
    final_blocks_dropped: int = 0
    """KV blocks freed at the end of those calls (``final_policy='drop'``): the sessions'
    own blocks, on either tier."""
    idle_notices: int = 0
    """Tool-start notices accepted (``POST /v1/agentrt/idle``)."""
    directives_retained: int = 0
    """Finished calls whose retention directive (an expected idle) this replica applied
    to its session's own blocks (``retention_directives``)."""
    directives_ended: int = 0
    """Finished calls whose directive said the session ended (``final``): its own blocks
    are evicted first (``retention_directives``)."""


class Engine:
    """One replica's scheduler, KV cache and clock-driven step loop."""

    def __init__(self, config: EngineConfig, name: str = "replica-0") -> None:
        self.config = config
        self.name = name
        self.tokenizer = Tokenizer(config.block_size)
        track = (
            config.tool_wait_policy in ("drop", "offload", "adaptive")
            or config.final_policy == "drop"
        )
        self.kv = KVCache(
            config.num_gpu_blocks,
            config.num_host_blocks,
            track,
            directives=config.retention_directives,
        )
        self.kv.block_size = config.block_size
        self._kv_sinks: list[Callable[[list[KvEvent]], None]] = []
        """Who reads the KV cache's events (:meth:`subscribe_kv`)."""
        self._paths: OrderedDict[Any, Node] = OrderedDict()
        """Each named session's last finished path (its deepest node), for notices."""
        self._notices: list[tuple[Any, float]] = []
        self._prefetch_q: list[tuple[float, int, _PendingPrefetch]] = []
        self._prefetch_of: dict[Any, _PendingPrefetch] = {}
        self._waiting_blocks = 0
        """Blocks the queued requests need (their whole context): the queued demand."""
        self.running: list[SimRequest] = []
        self._fcfs: deque[SimRequest] = deque()
        self._resumed: deque[SimRequest] = deque()
        """FCFS lane ahead of ``_fcfs``: turns whose session's KV was kept for them."""
        self._lane = self._fcfs
        self._heap: list[tuple[int, float, int, SimRequest]] = []
        self._num_waiting = 0
        self._seq = itertools.count()
        self._wake: anyio.Event | None = None
        self._interrupt: anyio.CancelScope | None = None
        self._aborts: list[SimRequest] = []
        self._preempted = False
        self._pending = False
        self.exact_steps = False
        """Testing switch: run every step on its own (no leaps, no run-ahead)."""
        self._scrape_s = 0.0
        self._scrape_next = math.inf
        self._scraped: tuple[int, int, float] = (0, 0, 0.0)
        self.started = False
        # counters
        self.steps = 0
        self.iterations = 0
        """Loop iterations; fewer than ``steps`` when decodes leap several steps at once."""
        self.busy_s = 0.0
        self.received = 0
        self.finished = 0
        self.aborted = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.host_hits = 0
        self.tool_waits = dict.fromkeys(("pin", "offload", "drop", "lru", "fallback", "resume"), 0)
        self.idle_notices = 0
        self.resumed_first = 0
        self.final_calls = 0
        self.final_blocks_dropped = 0
        self.directives_retained = 0
        self.directives_ended = 0

    # ------------------------------------------------------------ requests

    def submit(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        request_id: str,
        priority: int = 0,
        session: Any = None,
        idle_expected: float | None = None,
        stream: bool = False,
        final: bool = False,
    ) -> SimRequest:
        """Queue a request (raises :class:`RequestRejected` when it can never run).

        ``final``: the caller declared it its session's last call; ``final_policy`` applies
        when it finishes."""
        if self._scrape_next <= anyio.current_time():
            self._observe()
        cfg = self.config
        total = prompt.num_tokens + max_tokens
        if prompt.num_tokens <= 0:
            raise RequestRejected("the prompt is empty")
        if max_tokens <= 0:
            raise RequestRejected("max_tokens must be at least 1")
        if cfg.max_model_len is not None and total > cfg.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {total} tokens ({prompt.num_tokens} in the messages, "
                f"{max_tokens} in the completion)."
            )
        if -(-total // cfg.block_size) > cfg.num_gpu_blocks:
            raise RequestRejected(
                f"the request needs {total} tokens of KV cache; this replica holds "
                f"{cfg.num_gpu_blocks * cfg.block_size}"
            )
        req = SimRequest(
            prompt,
            max_tokens,
            request_id=request_id,
            priority=priority,
            session=session if session is not None else ("request", request_id),
            idle_expected=idle_expected,
            stream=stream,
            stream_interval=cfg.stream_interval,
            arrival=anyio.current_time(),
            seq=next(self._seq),
            final=final,
        )
        req.anonymous = session is None
        if (cfg.tool_wait_policy == "resume" or cfg.retention_directives) and session is not None:
            self._hint(session, QUEUED)  # its prefix is needed next: evicted last
        if cfg.tool_wait_policy != "lru" and cfg.scheduling == "fcfs" and session is not None:
            path = self._paths.get(session)
            req.resumed = path is not None and path.alive and path.pinned
            self.resumed_first += req.resumed
        self.received += 1
        self._push_waiting(req, front=False)
        self._poke()
        return req

    def abort(self, req: SimRequest) -> None:
        """Cancel a request (client gone). Its KV is freed at the next step boundary."""
        self._observe()
        if req.status >= FINISHED:
            return
        if req.status == WAITING:
            cfg = self.config
            if (cfg.tool_wait_policy == "resume" or cfg.retention_directives) and not req.anonymous:
                self._hint(req.session, 0.0)
            req.status = ABORTED
            self._num_waiting -= 1
            self._waiting_blocks -= req.queued_blocks
            self.aborted += 1
            req._notify()
            return
        self._aborts.append(req)
        self._poke()

    def _hint(self, session: Any, resume_at: float) -> None:
        """Declare ``session``'s own tail next used at ``resume_at`` (``resume``)."""
        path = self._paths.get(session)
        if path is not None and path.alive:
            top, _ = self.kv.own_tail(path, session)
            if top is not None:
                self.kv.hint_resume(path, top, resume_at)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()
        if self._interrupt is not None:
            self._interrupt.cancel()

    def notice_tool_wait(self, session: Any, expected_s: float | None) -> bool:
        """A tool-start notice: ``session`` waits on a tool from now for about
        ``expected_s`` seconds (None: unknown). The loop applies the tool-wait policy to the
        session's last path at its next iteration. False if the session is unknown here."""
        if session not in self._paths:
            return False
        self.idle_notices += 1
        if expected_s is not None and expected_s > 0 and self.config.tool_wait_policy != "lru":
            self._notices.append((session, expected_s))
            self._poke()
        return True

    def _push_waiting(self, req: SimRequest, *, front: bool) -> None:
        req.status = WAITING
        self._num_waiting += 1
        req.queued_blocks = -(-(req.prompt_len + req.num_output) // self.config.block_size)
        self._waiting_blocks += req.queued_blocks
        if self.config.scheduling == "priority":
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))
            return
        q = self._resumed if req.resumed else self._fcfs
        if front:
            q.appendleft(req)
        else:
            q.append(req)

    def _peek_waiting(self) -> SimRequest | None:
        if self.config.scheduling == "priority":
            heap = self._heap
            while heap and heap[0][3].status != WAITING:
                heapq.heappop(heap)
            return heap[0][3] if heap else None
        for q in (self._resumed, self._fcfs):
            while q and q[0].status != WAITING:
                q.popleft()
            if q:
                self._lane = q
                return q[0]
        return None

    def _pop_waiting(self) -> None:
        if self.config.scheduling == "priority":
            req = heapq.heappop(self._heap)[3]
        else:
            req = self._lane.popleft()
        self._num_waiting -= 1
        self._waiting_blocks -= req.queued_blocks

    # ------------------------------------------------------------ KV-cache events

    def subscribe_kv(self, sink: Callable[[list[KvEvent]], None]) -> Callable[[], None]:
        """Hand the KV cache's events (vLLM's ``BlockStored`` / ``BlockRemoved``, see
        ``_kv``) to ``sink`` as they happen, until the returned function is called."""
        sinks = self._kv_sinks
        sinks.append(sink)
        self._route_kv_events()

        def unsubscribe() -> None:
            if sink in sinks:
                sinks.remove(sink)
                self._route_kv_events()

        return unsubscribe

    def _route_kv_events(self) -> None:
        sinks = self._kv_sinks
        if not sinks:
            self.kv.on_events = None
        elif len(sinks) == 1:
            self.kv.on_events = sinks[0]
        else:

            def fan_out(events: list[KvEvent]) -> None:
                for sink in list(sinks):
                    sink(events)

            self.kv.on_events = fan_out

    # ------------------------------------------------------------ scraped metrics

    def scrape_every(self, interval_s: float) -> None:
        """From now on :meth:`scraped` answers what a scraper polling ``/metrics`` every
        ``interval_s`` seconds (at whole multiples of it) last read: the state at the last
        poll, not now. Exact and free of timers: before anything changes the queue, the
        batch or the KV, the engine keeps its state if a poll time has passed since the
        last change (:meth:`_observe`), so no poll needs to run."""
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._scrape_s = interval_s
        self._scrape_next = 0.0
        self._observe()

    def _live_metrics(self) -> tuple[int, int, float]:
        kv = self.kv
        return self._num_waiting, len(self.running), kv.used / kv.capacity if kv.capacity else 0.0

    def _observe(self) -> None:
        """Called before the state changes: the first change after a poll time keeps the
        state as it was then (nothing changed between that poll and now)."""
        if not self._scrape_s:
            return
        now = anyio.current_time()
        if now >= self._scrape_next:
            self._scraped = self._live_metrics()
            s = self._scrape_s
            self._scrape_next = (math.floor(now / s) + 1) * s

    def scraped(self) -> tuple[int, int, float]:
        """``(waiting, running, kv_usage)`` as the last poll saw them (see
        :meth:`scrape_every`); without it, the live values."""
        if not self._scrape_s:
            return self._live_metrics()
        self._observe()
        return self._scraped

    # ------------------------------------------------------------ stats

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    def kv_occupancy(self) -> tuple[float, float]:
        """The used and the cached fractions of the accelerator's KV blocks: ``stats()``'s
        ``kv_usage`` and ``gpu_blocks_cached / gpu_blocks``, without the snapshot."""
        kv = self.kv
        cap = kv.capacity
        if not cap:
            return 0.0, 0.0
        return kv.used / cap, kv.gpu_tree / cap

    def stats(self) -> ReplicaStats:
        """A frozen snapshot of the counters."""
        kv = self.kv
        cap = kv.capacity
        block_bytes = self.config.block_size * self.config.kv_bytes_per_token
        tw = self.tool_waits
        return ReplicaStats(
            name=self.name,
            time_s=anyio.current_time(),
            running=len(self.running),
            waiting=self._num_waiting,
            kv_usage=kv.used / cap if cap else 0.0,
            gpu_blocks=cap,
            gpu_blocks_cached=kv.gpu_tree,
            host_blocks=kv.host_capacity,
            host_blocks_used=kv.host_used,
            steps=self.steps,
            busy_s=self.busy_s,
            requests_received=self.received,
            requests_finished=self.finished,
            requests_aborted=self.aborted,
            preemptions=self.preemptions,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            prefix_cache_queries=self.prefix_queries,
            prefix_cache_hits=self.prefix_hits,
            host_cache_hits=self.host_hits,
            evicted_blocks=kv.evicted_blocks,
            offloaded_blocks=kv.offloaded_blocks,
            loaded_blocks=kv.loaded_blocks,
            prefetched_blocks=kv.prefetched_blocks,
            host_bytes_out=kv.offloaded_blocks * block_bytes,
            host_bytes_in=(kv.loaded_blocks + kv.prefetched_blocks) * block_bytes,
            prefetches=kv.prefetches,
            prefetches_useful=kv.prefetches_useful,
            prefetches_wasted=kv.prefetches_wasted,
            prefetches_skipped=kv.prefetches_skipped,
            pins_yielded_blocks=kv.yielded_blocks,
            resumed_first=self.resumed_first,
            tool_waits_pinned=tw["pin"],
            tool_waits_offloaded=tw["offload"],
            tool_waits_dropped=tw["drop"],
            tool_waits_lru=tw["lru"],
            tool_waits_resume=tw["resume"],
            tool_wait_fallbacks=tw["fallback"],
            final_calls=self.final_calls,
            final_blocks_dropped=self.final_blocks_dropped,
            directives_retained=self.directives_retained,
            directives_ended=self.directives_ended,
            idle_notices=self.idle_notices,
        )

    # ------------------------------------------------------------ the loop

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run steps forever (until cancelled); sleeps on an event while idle."""
        self.started = True
        task_status.started()
        cost = self.config.cost
        kv = self.kv
        try:
            while True:
                now = anyio.current_time()
                if self._scrape_next <= now:
                    self._observe()
                kv.expire_pins(now)
                if self._notices:
                    self._process_notices(now)
                q = self._prefetch_q
                if q and q[0][0] <= now:
                    self._run_prefetches(now)
                if self._aborts:
                    self._process_aborts(now)
                if not self.running and not self._num_waiting:
                    await self._idle(None)
                    continue
                self._preempted = False
                plan = self._schedule(now)
                # The next timed event that changes what the coming steps can do: a pin
                # expiry (it matters to waiting requests only) or a prefetch.
                next_event = kv.next_pin() if self._num_waiting else None
                if q and (next_event is None or q[0][0] < next_event):
                    next_event = q[0][0]
                if plan is None:
                    if not self._preempted:  # else retry admission at once
                        await self._idle(next_event)
                    continue
                sched, n_prefill, n_decode, ctx, pairs, transfer_s, leap, quiet = plan
                first = (
                    cost.step_seconds(
                        prefill_tokens=n_prefill,
                        decode_seqs=n_decode,
                        decode_context_tokens=ctx,
                        prefill_pairs=pairs,
                    )
                    + transfer_s
                )
                self.iterations += 1
                if leap and not self.exact_steps:
                    k = self._macro_steps(now, n_decode, first, next_event)
                    if k > 1:
                        steps, total = await self._macro_sleep(now, first, n_decode, k)
                        self._observe()
                        self.steps += steps
                        self.busy_s += total
                        self._finish_decodes(steps, anyio.current_time())
                        continue
                elif quiet and n_prefill and not self.exact_steps:
                    ahead = self._run_ahead(sched, first, now, next_event)
                    if len(ahead) > 1:
                        await self._run_steps(now, ahead)
                        continue
                await anyio.sleep(first)
                self._observe()
                self.steps += 1
                self.busy_s += first
                self._finish_step(sched, anyio.current_time())
        finally:
            self.started = False

    async def _idle(self, until: float | None) -> None:
        ev = self._wake = anyio.Event()
        try:
            if until is None:
                await ev.wait()
            else:
                with anyio.move_on_after(max(until - anyio.current_time(), 0.0)):
                    await ev.wait()
        finally:
            self._wake = None

    def _schedule(
        self, now: float
    ) -> tuple[list[tuple[SimRequest, int]], int, int, int, float, float, bool, bool] | None:
        cfg = self.config
        kv = self.kv
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        running = self.running
        sched: dict[SimRequest, int] = {}
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.prompt_len + req.num_output - req.num_computed
            if n > budget:
                n = budget
            if thr and n > thr:
                n = thr
            need = -(-(req.num_computed + n) // bs) - req.tree_blocks - req.private
            if need > 0:
                while not kv.allocate(need):
                    if kv.yield_pins(need):
                        continue
                    victim = self._victim()
                    if victim in sched:
                        budget += sched.pop(victim)
                    vi = running.index(victim)
                    self._preempt(victim, now)
                    preempted = True
                    if victim is req:
                        break
                    if vi < i:
                        i -= 1
                if req.status != RUNNING:
                    break
                req.private += need
            sched[req] = n
            budget -= n
            i += 1
        transfer_s = 0.0
        blocked = False
        if not preempted:
            while budget > 0:
                head = self._peek_waiting()
                if head is None:
                    break
                req = head
                if len(running) >= cfg.max_num_seqs:
                    blocked = True
                    break
                total = req.prompt_len + req.num_output
                match = kv.match(req.prompt.runs, (total - 1) // bs)
                hit = match.blocks * bs
                n = total - hit
                if n > budget:
                    n = budget
                if thr and n > thr:
                    n = thr
                new_blocks = -(-(hit + n) // bs) - match.blocks
                if not kv.can_admit(match, new_blocks):
                    blocked = True
                    break
                self._pop_waiting()
                if (
                    cfg.tool_wait_policy == "resume" or cfg.retention_directives
                ) and not req.anonymous:
                    self._hint(req.session, 0.0)  # what the request does not match ages
                if self._prefetch_of:
                    self._cancel_prefetch(req.session)
                if match.ready_at > now:  # a prefetch still in flight: wait for its end
                    transfer_s = max(transfer_s, match.ready_at - now)
                deepest, loaded = kv.admit(match, new_blocks, req.session, now)
                req.deepest = deepest
                req.tree_blocks = match.blocks
                req.private = new_blocks
                req.num_computed = hit
                req.status = RUNNING
                if loaded:
                    transfer_s += loaded * cfg.block_transfer_s
                self.prefix_queries += total
                self.prefix_hits += match.gpu_blocks * bs
                self.host_hits += match.host_blocks * bs
                if not req.scheduled:
                    req.scheduled = True
                    req.cached_tokens = hit
                    req.host_cached_tokens = match.host_blocks * bs
                running.append(req)
                sched[req] = n
                budget -= n
        if not sched:
            return None
        n_prefill = n_decode = ctx = 0
        pairs = 0.0
        for req, n in sched.items():
            c = req.num_computed
            if n == 1 and req.num_output and c + 1 == req.prompt_len + req.num_output:
                n_decode += 1
                ctx += c + 1
            else:
                n_prefill += n
                pairs += n * c + n * (n + 1) / 2
        # Nothing but an arrival, an abort or a pin expiry can change the coming steps
        # (no preemption now, and whatever waits cannot be admitted without a finish).
        quiet = not preempted and transfer_s == 0.0
        # Waiting requests the budget alone kept out: a later step with budget left admits.
        self._pending = bool(self._num_waiting) and not blocked
        leap = quiet and not self._pending and n_prefill == 0 and len(sched) == len(running)
        return list(sched.items()), n_prefill, n_decode, ctx, pairs, transfer_s, leap, quiet

    def _victim(self) -> SimRequest:
        if self.config.scheduling == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, req: SimRequest, now: float) -> None:
        self.kv.release(req.deepest, req.private, now)
        req.deepest = None
        req.tree_blocks = req.private = req.num_computed = 0
        req.insert_blocked = False
        self.running.remove(req)
        self.preemptions += 1
        self._preempted = True
        self._push_waiting(req, front=True)

    # ------------------------------------------------------------ applying steps

    def _finish_step(self, sched: list[tuple[SimRequest, int]], now: float) -> None:
        kv = self.kv
        bs = self.config.block_size
        done = False
        produced = 0
        for req, n in sched:
            if req.status != RUNNING:
                continue
            req.num_computed += n
            if req.tree_blocks < req.prompt_blocks and not req.insert_blocked:
                full = min(req.num_computed, req.prompt_len) // bs
                if full > req.tree_blocks:
                    runs = slice_runs(req.prompt.runs, req.tree_blocks, full)
                    count = full - req.tree_blocks
                    node = kv.insert(req.deepest or kv.root, runs, count, req.session, now)
                    if node is None:
                        req.insert_blocked = True
                    else:
                        req.deepest = node
                        req.tree_blocks = full
                        req.private -= count
            if req.num_computed == req.prompt_len + req.num_output:
                req.num_output += 1
                produced += 1
                if req.num_output == 1:
                    req.first_token_time = now
                    self.prompt_tokens += req.prompt_len
                if req.num_output >= req.max_tokens:
                    self._finish(req, now)
                    done = True
                elif req.num_output - req.notified >= req.notify_every or (
                    req.stream and req.num_output == 1
                ):
                    req._notify()
        self.generation_tokens += produced
        if done:
            self.running = [r for r in self.running if r.status == RUNNING]

    def _run_ahead(
        self,
        sched: list[tuple[SimRequest, int]],
        first: float,
        now: float,
        next_event: float | None,
    ) -> list[tuple[list[tuple[SimRequest, int]], float]]:
        """The steps that follow ``sched`` while prefills run and nothing can change: each
        step's batch and duration, computed as :meth:`_schedule` would, up to the first step
        with a visible outcome (a finish, a streamed chunk), a step needing a preemption, or
        a step with no prefill left (the decode leap takes over)."""
        cfg = self.config
        cost = cfg.cost
        bs = cfg.block_size
        running = self.running
        comp = {r: r.num_computed for r in running}
        out = {r: r.num_output for r in running}
        held = {r: r.tree_blocks + r.private for r in running}
        steps = [(sched, first)]
        if self._visible(sched, comp, out):
            return steps
        avail = self.kv.available()
        limit = next_event - now if next_event is not None else math.inf
        total = first
        budget0 = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        while len(steps) < _RUN_AHEAD_STEPS:
            budget = budget0
            step: list[tuple[SimRequest, int]] = []
            grow: list[tuple[SimRequest, int]] = []
            n_prefill = n_decode = ctx = need = 0
            pairs = 0.0
            for r in running:
                if budget <= 0:
                    break
                c = comp[r]
                t = r.prompt_len + out[r]
                n = t - c
                if n > budget:
                    n = budget
                if thr and n > thr:
                    n = thr
                nb = -(-(c + n) // bs) - held[r]
                if nb > 0:
                    need += nb
                    grow.append((r, nb))
                step.append((r, n))
                budget -= n
                if n == 1 and out[r] and c + 1 == t:
                    n_decode += 1
                    ctx += c + 1
                else:
                    n_prefill += n
                    pairs += n * c + n * (n + 1) / 2
            if not n_prefill or need > avail:
                break
            if self._pending and budget > 0 and len(running) < cfg.max_num_seqs:
                break  # the scheduler would admit a waiting request in this step
            d = cost.step_seconds(
                prefill_tokens=n_prefill,
                decode_seqs=n_decode,
                decode_context_tokens=ctx,
                prefill_pairs=pairs,
            )
            if total + d > limit:
                break
            avail -= need
            for r, nb in grow:
                held[r] += nb
            steps.append((step, d))
            total += d
            if self._visible(step, comp, out):
                break
        return steps

    @staticmethod
    def _visible(
        step: list[tuple[SimRequest, int]], comp: dict[SimRequest, int], out: dict[SimRequest, int]
    ) -> bool:
        """Advance the local counters by one step; whether the step ends with something a
        client sees (a finish or a streamed chunk)."""
        seen = False
        for r, n in step:
            c = comp[r] = comp[r] + n
            if c == r.prompt_len + out[r]:
                o = out[r] = out[r] + 1
                if o >= r.max_tokens or (r.stream and (o == 1 or o - r.notified >= r.notify_every)):
                    seen = True
        return seen

    async def _run_steps(
        self, t0: float, steps: list[tuple[list[tuple[SimRequest, int]], float]]
    ) -> None:
        """Sleep through precomputed steps (an arrival or abort cuts them short after the
        step in progress), then apply the steps that ran."""
        ends: list[float] = []
        total = 0.0
        for _, d in steps:
            total += d
            ends.append(total)
        if await self._sleep_interruptible(total):
            elapsed = anyio.current_time() - t0
            done = min(bisect.bisect_right(ends, elapsed) + 1, len(steps))
            await anyio.sleep_until(t0 + ends[done - 1])
        else:
            done = len(steps)
        self._observe()
        kv = self.kv
        bs = self.config.block_size
        for i in range(done):
            sched = steps[i][0]
            if i:
                need = 0
                for r, n in sched:
                    nb = -(-(r.num_computed + n) // bs) - r.tree_blocks - r.private
                    if nb > 0:
                        r.private += nb
                        need += nb
                if need and not kv.allocate(need):  # pragma: no cover - checked ahead
                    raise RuntimeError("KV accounting error in a run-ahead step")
            self._finish_step(sched, t0 + ends[i])
        self.steps += done
        self.busy_s += ends[done - 1]

    async def _sleep_interruptible(self, seconds: float) -> bool:
        """Sleep; True if an arrival or an abort interrupted the sleep."""
        scope = anyio.CancelScope()
        self._interrupt = scope
        try:
            with scope:
                await anyio.sleep(seconds)
        finally:
            self._interrupt = None
        return scope.cancelled_caught

    def _macro_steps(
        self, now: float, n_decode: int, first: float, next_event: float | None
    ) -> int:
        """How many decode steps can run before anything can change."""
        k = min(r.max_tokens - r.num_output for r in self.running)
        if k <= 1:
            return 1
        for r in self.running:
            if r.stream:
                k = min(k, max(1, r.notify_every - (r.num_output - r.notified)))
        if k <= 1:
            return 1
        # KV: blocks the later steps need beyond this step's allocation.
        bs = self.config.block_size
        avail = self.kv.available()

        def extra(steps: int) -> int:
            total = 0
            for r in self.running:
                c = r.num_computed
                total += -(-(c + steps) // bs) - -(-(c + 1) // bs)
            return total

        if extra(k) > avail:
            lo, hi = 1, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if extra(mid) <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if k > 1 and next_event is not None:
            b = self.config.cost.decode_context_token_s * n_decode
            limit = next_event - now
            while k > 1 and k * first + b * k * (k - 1) / 2 > limit:
                k = max(1, min(k - 1, int(limit / first) if first > 0 else 1))
        return k

    async def _macro_sleep(
        self, t0: float, first: float, n_decode: int, k: int
    ) -> tuple[int, float]:
        """Sleep through ``k`` decode steps unless interrupted; the steps done and their time."""
        b = self.config.cost.decode_context_token_s * n_decode

        def t_of(s: int) -> float:
            return s * first + b * s * (s - 1) / 2

        total = t_of(k)
        if not await self._sleep_interruptible(total):
            return k, total
        elapsed = anyio.current_time() - t0
        # steps completed by now: largest s with t_of(s) <= elapsed
        if b > 0:
            a = first - b / 2
            s = int((-a + math.sqrt(a * a + 2 * b * elapsed)) / b) if elapsed > 0 else 0
        else:
            s = int(elapsed / first) if first > 0 else k
        s = max(0, min(s, k))
        while s > 0 and t_of(s) > elapsed:
            s -= 1
        while s < k and t_of(s + 1) <= elapsed:
            s += 1
        steps = min(k, s + 1)  # the step in progress completes
        await anyio.sleep_until(t0 + t_of(steps))
        return steps, t_of(steps)

    def _finish_decodes(self, steps: int, now: float) -> None:
        """Apply ``steps`` decode steps to every running request (all decoding)."""
        kv = self.kv
        bs = self.config.block_size
        extra = 0
        done = False
        for req in self.running:
            if req.status != RUNNING:
                continue
            c = req.num_computed + steps
            req.num_computed = c
            req.num_output += steps
            need = -(-c // bs) - req.tree_blocks - req.private
            if need > 0:
                extra += need
                req.private += need
            if req.num_output >= req.max_tokens:
                done = True
        if extra and not kv.allocate(extra):  # pragma: no cover - guarded by _macro_steps
            raise RuntimeError("KV accounting error in a multi-step decode")
        self.generation_tokens += steps * len(self.running)
        for req in self.running:
            if req.num_output >= req.max_tokens:
                self._finish(req, now)
            elif req.num_output - req.notified >= req.notify_every:
                req._notify()
        if done:
            self.running = [r for r in self.running if r.status == RUNNING]

    def _finish(self, req: SimRequest, now: float) -> None:
        cfg = self.config
        kv = self.kv
        req.status = FINISHED
        req.finish_time = now
        self.finished += 1
        deepest = req.deepest
        if (
            cfg.cache_output_blocks
            and not req.insert_blocked
            and req.tree_blocks == req.prompt_blocks
            and req.num_output > 1
        ):
            runs = req.prompt.continuation_runs(req.num_output - 1)
            if runs:
                count = sum(r[2] for r in runs)
                node = kv.insert(deepest or kv.root, runs, count, req.session, now)
                if node is not None:
                    deepest = node
                    req.private -= count
        kv.release(deepest, req.private, now)
        req.deepest = None
        req.private = 0
        if deepest is None:
            deepest = kv.root  # nothing cached (a prompt shorter than a block)
        if not req.anonymous:
            paths = self._paths
            paths[req.session] = deepest
            paths.move_to_end(req.session)
            if len(paths) > _MAX_SESSIONS:
                paths.popitem(last=False)
        self.final_calls += req.final
        idle = req.idle_expected
        if cfg.retention_directives and not req.anonymous:
            self._retention(req, deepest, idle, now)
        if req.final and cfg.final_policy == "drop" and not req.anonymous:
            self._end_session(req.session, deepest)
        elif idle is not None and idle > 0 and cfg.tool_wait_policy != "lru":
            self._tool_wait(req.session, deepest, idle, now)
        req._notify()

    def _retention(self, req: SimRequest, deepest: Node, idle: float | None, now: float) -> None:
        """``retention_directives``: apply what the finished request said about its
        session's own blocks (``final``: ended; an expected idle: retained until the
        wake-up plus ``pin_margin_s``; neither: nothing, LRU)."""
        if deepest is self.kv.root or not deepest.alive:
            return
        if req.final:
            until = ENDED
        elif idle is not None and idle > 0:
            until = now + idle + self.config.pin_margin_s
        else:
            return
        top, _ = self.kv.own_tail(deepest, req.session)
        if top is None:  # nothing of its own cached (all shared): nothing to mark
            return
        self.kv.hint_resume(deepest, top, until)
        if req.final:
            self.directives_ended += 1
        else:
            self.directives_retained += 1

    def _end_session(self, session: Any, deepest: Node) -> None:
        """``final_policy='drop'``: ``session`` ended with its call to ``deepest``. Free its
        own tail (pinned, offloaded or not; shared ancestors stay cached, with any pins
        other sessions put on them), cancel a pending prefetch and forget the session, so
        a later tool-start notice for it is refused."""
        kv = self.kv
        if self._prefetch_of:
            self._cancel_prefetch(session)
        self._paths.pop(session, None)
        if deepest is kv.root or not deepest.alive:
            return
        top, _ = kv.own_tail(deepest, session)
        if top is not None:
            self.final_blocks_dropped += kv.drop_tail(top)

    # ------------------------------------------------------------ tool waits

    def _tool_wait(self, session: Any, deepest: Node, idle: float, now: float) -> None:
        """Apply the tool-wait policy to ``session``'s KV (its path to ``deepest``) for a
        wait of ``idle`` seconds from ``now``. A new decision replaces a pending prefetch."""
        cfg = self.config
        kv = self.kv
        if self._prefetch_of:
            self._cancel_prefetch(session)
        if deepest is kv.root or not deepest.alive:
            return
        policy = cfg.tool_wait_policy
        until = now + idle + cfg.pin_margin_s
        if policy == "adaptive":
            kv.expire_pins(now)  # as of now, whether or not a leap is under way
            pressure = (kv.used + self._waiting_blocks) / kv.capacity
            if idle > cfg.adaptive_max_wait_s:
                policy = "lru" if pressure < cfg.adaptive_pressure else "drop"
            elif pressure < cfg.adaptive_pressure and idle <= cfg.adaptive_pin_max_s:
                policy = "pin"
            else:  # offload past the break-even (pin below it; lru if the host is full)
                policy = "offload"
        if policy == "offload":
            top, blocks = kv.own_tail(deepest, session)
            breakeven = 2 * blocks * cfg.block_transfer_s + cfg.offload_margin_s
            if top is None or idle <= breakeven:
                policy = "pin"
            elif top.tier == GPU and not kv.host_room_for(blocks):
                self.tool_waits["fallback"] += 1
                policy = "lru"
            else:
                kv.offload_tail(deepest, top, until)
                transfer = blocks * cfg.block_transfer_s
                p = _PendingPrefetch(session, deepest, now + idle - transfer, until)
                heapq.heappush(self._prefetch_q, (p.start, next(self._seq), p))
                self._prefetch_of[session] = p
                self.tool_waits["offload"] += 1
                return
        if policy == "resume":
            top, blocks = kv.own_tail(deepest, session)
            if top is not None:
                kv.hint_resume(deepest, top, now + idle)
                if kv.host_capacity:  # bring back what eviction spilled by then
                    start = now + idle - blocks * cfg.block_transfer_s
                    p = _PendingPrefetch(session, deepest, start, until)
                    heapq.heappush(self._prefetch_q, (p.start, next(self._seq), p))
                    self._prefetch_of[session] = p
            self.tool_waits["resume"] += 1
            return
        if policy in ("keep", "pin"):
            kv.pin_path(deepest, until)
            self.tool_waits["pin"] += 1
        elif policy == "drop":
            top, _ = kv.own_tail(deepest, session)
            if top is not None:
                kv.drop_tail(top)
            self.tool_waits["drop"] += 1
        else:
            self.tool_waits["lru"] += 1

    def _process_notices(self, now: float) -> None:
        notices, self._notices = self._notices, []
        for session, expected in notices:
            deepest = self._paths.get(session)
            if deepest is not None:
                self._tool_wait(session, deepest, expected, now)

    def _run_prefetches(self, now: float) -> None:
        """Start the prefetches due by ``now``, each as if started at its planned time. One
        that finds no room on the accelerator is retried every ``_PREFETCH_RETRY_S`` until
        its pin deadline."""
        q = self._prefetch_q
        kv = self.kv
        block_s = self.config.block_transfer_s
        while q and q[0][0] <= now:
            p = heapq.heappop(q)[2]
            if p.cancelled:
                continue
            if kv.prefetch(p.deepest, p.start, block_s, p.until) < 0:
                retry = max(p.start, now) + _PREFETCH_RETRY_S
                if retry < p.until:
                    p.start = retry
                    heapq.heappush(q, (retry, next(self._seq), p))
                    continue
                kv.prefetches_skipped += 1
            if self._prefetch_of.get(p.session) is p:
                del self._prefetch_of[p.session]

    def _cancel_prefetch(self, session: Any) -> None:
        p = self._prefetch_of.pop(session, None)
        if p is not None:
            p.cancelled = True

    def _process_aborts(self, now: float) -> None:
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.status != RUNNING:
                continue
            req.status = ABORTED
            self.aborted += 1
            self.kv.release(req.deepest, req.private, now)
            req.deepest = None
            req.private = 0
            req._notify()
        self.running = [r for r in self.running if r.status == RUNNING]
