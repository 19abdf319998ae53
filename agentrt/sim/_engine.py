"""The engine loop: iteration-level scheduling of one simulated replica.

Each step the scheduler (vLLM V1 semantics) gives every running request its next tokens
within the step's token budget (1 for a decode, a chunk for a prefill), preempting the
lowest-priority running request (recompute) when KV blocks run out, then admits waiting
requests in FCFS or priority order while the budget, ``max_num_seqs`` and KV allow. The step
then lasts ``CostModel.step_seconds(...)`` of simulated time.

Time only advances through ``anyio.sleep`` and is only read through
``anyio.current_time()``: the loop runs in wall-clock time on asyncio, and in virtual time
under trio's ``MockClock(autojump_threshold=0)``. When nothing changes for a while (only
decodes run, nothing can be admitted) the loop sleeps through many steps at once (planned
by ``_runahead``); an arrival or an abort interrupts that sleep, and the step in progress
completes first.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

from ..scheduling._kvevents import KvEvent
from ._blockevents import KvSubscribers
from ._config import EngineConfig
from ._kv import KVCache, Node
from ._metrics import ReplicaStats, Scraper, snapshot
from ._request import ABORTED, FINISHED, RUNNING, WAITING, RequestRejected, SimRequest
from ._runahead import Step, decode_leap, leap_seconds, leap_steps_done, run_ahead
from ._sessions import Sessions
from ._tokenize import Prompt, Tokenizer, slice_runs
from ._waiting import waiting_queue

__all__ = [
    "ABORTED",
    "FINISHED",
    "RUNNING",
    "WAITING",
    "Engine",
    "ReplicaStats",
    "RequestRejected",
    "SimRequest",
]


class Engine:
    """One replica's step loop: the running batch, its steps and their counters.

    What it works with is held by its parts: the KV cache (``_kv``), the waiting queue and
    its order (``_waiting``), the sessions between their calls and the KV policies applied
    to them (``_sessions``), the published metrics (``_metrics``) and the KV-event
    subscribers (``_blockevents``); the steps it can sleep through at once are planned by
    ``_runahead``."""

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
        self.waiting = waiting_queue(config.scheduling, config.block_size)
        self.sessions = Sessions(config, self.kv, self.waiting, self._poke)
        self.scrape = Scraper(self.live_metrics)
        self._kv_events = KvSubscribers(self.kv)
        self.running: list[SimRequest] = []
        self._seq = 0
        """The next request's arrival number."""
        self._wake: anyio.Event | None = None
        self._interrupt: anyio.CancelScope | None = None
        self._aborts: list[SimRequest] = []
        self._preempted = False
        self._pending = False
        self.exact_steps = False
        """Testing switch: run every step on its own (no leaps, no run-ahead)."""
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
        scrape = self.scrape
        if scrape.next <= anyio.current_time():
            scrape.observe()
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
            seq=self._seq,
            final=final,
        )
        self._seq += 1
        req.anonymous = session is None
        if session is not None:
            self.sessions.arrived(req)
        self.received += 1
        self.waiting.push(req, front=False)
        self._poke()
        return req

    def abort(self, req: SimRequest) -> None:
        """Cancel a request (client gone). Its KV is freed at the next step boundary."""
        self.scrape.observe()
        if req.status >= FINISHED:
            return
        if req.status == WAITING:
            if self.sessions.hints and not req.anonymous:
                self.sessions.hint(req.session, 0.0)
            req.status = ABORTED
            self.waiting.discard(req)
            self.aborted += 1
            req._notify()
            return
        self._aborts.append(req)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()
        if self._interrupt is not None:
            self._interrupt.cancel()

    def notice_tool_wait(self, session: Any, expected_s: float | None) -> bool:
        """A tool-start notice: ``session`` waits on a tool from now for about
        ``expected_s`` seconds (None: unknown). The loop applies the tool-wait policy to the
        session's last path at its next iteration. False if the session is unknown here."""
        return self.sessions.notice(session, expected_s)

    @property
    def _paths(self) -> dict[Any, Node]:
        """Each named session's last finished path (its deepest node)."""
        return self.sessions.paths

    @property
    def _waiting_blocks(self) -> int:
        """Blocks the queued requests need: the queued demand."""
        return self.waiting.blocks

    # ------------------------------------------------------------ KV-cache events

    def subscribe_kv(self, sink: Callable[[list[KvEvent]], None]) -> Callable[[], None]:
        """Hand the KV cache's events (vLLM's ``BlockStored`` / ``BlockRemoved``, see
        ``_kv``) to ``sink`` as they happen, until the returned function is called."""
        return self._kv_events.subscribe(sink)

    @property
    def _kv_sinks(self) -> list[Callable[[list[KvEvent]], None]]:
        """The KV events' subscribers."""
        return self._kv_events.sinks

    # ------------------------------------------------------------ scraped metrics

    def scrape_every(self, interval_s: float) -> None:
        """From now on :meth:`scraped` answers what a scraper polling ``/metrics`` every
        ``interval_s`` seconds (at whole multiples of it) last read: the state at the last
        poll, not now. Exact and free of timers: before anything changes the queue, the
        batch or the KV, the engine keeps its state if a poll time has passed since the
        last change (``Scraper.observe``), so no poll needs to run."""
        self.scrape.every(interval_s)

    def live_metrics(self) -> tuple[int, int, float]:
        """``(waiting, running, kv_usage)`` now."""
        kv = self.kv
        return self.waiting.count, len(self.running), kv.used / kv.capacity if kv.capacity else 0.0

    def scraped(self) -> tuple[int, int, float]:
        """``(waiting, running, kv_usage)`` as the last poll saw them (see
        :meth:`scrape_every`); without it, the live values."""
        return self.scrape.read()

    # ------------------------------------------------------------ stats

    @property
    def num_waiting(self) -> int:
        return self.waiting.count

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
        return snapshot(self)

    # ------------------------------------------------------------ the loop

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run steps forever (until cancelled); sleeps on an event while idle."""
        self.started = True
        task_status.started()
        cost = self.config.cost
        kv = self.kv
        waiting = self.waiting
        sessions = self.sessions
        scrape = self.scrape
        q = sessions.prefetch_q
        try:
            while True:
                now = anyio.current_time()
                if scrape.next <= now:
                    scrape.observe()
                kv.expire_pins(now)
                if sessions.notices:
                    sessions.process_notices(now)
                if q and q[0][0] <= now:
                    sessions.run_prefetches(now)
                if self._aborts:
                    self._process_aborts(now)
                if not self.running and not waiting.count:
                    await self._idle(None)
                    continue
                self._preempted = False
                plan = self._schedule(now)
                # The next timed event that changes what the coming steps can do: a pin
                # expiry (it matters to waiting requests only) or a prefetch.
                next_event = kv.next_pin() if waiting.count else None
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
                    slope = cost.decode_context_token_s * n_decode
                    k = decode_leap(
                        self.config, self.running, now, first, slope, next_event, kv.available()
                    )
                    if k > 1:
                        steps, total = await self._leap(now, first, slope, k)
                        scrape.observe()
                        self.steps += steps
                        self.busy_s += total
                        self._finish_decodes(steps, anyio.current_time())
                        continue
                elif quiet and n_prefill and not self.exact_steps:
                    ahead = run_ahead(
                        self.config,
                        self.running,
                        sched,
                        first,
                        now,
                        next_event,
                        kv.available(),
                        self._pending,
                    )
                    if len(ahead) > 1:
                        await self._run_steps(now, ahead)
                        continue
                await anyio.sleep(first)
                scrape.observe()
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

    def _schedule(self, now: float) -> tuple[Step, int, int, int, float, float, bool, bool] | None:
        cfg = self.config
        kv = self.kv
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        running = self.running
        waiting = self.waiting
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
                    victim = waiting.victim(running)
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
                head = waiting.peek()
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
                waiting.pop()
                sessions = self.sessions
                if sessions.hints and not req.anonymous:
                    sessions.hint(req.session, 0.0)  # what the request does not match ages
                if sessions.prefetch_of:
                    sessions.cancel_prefetch(req.session)
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
        self._pending = bool(waiting.count) and not blocked
        leap = quiet and not self._pending and n_prefill == 0 and len(sched) == len(running)
        return list(sched.items()), n_prefill, n_decode, ctx, pairs, transfer_s, leap, quiet

    def _preempt(self, req: SimRequest, now: float) -> None:
        self.kv.release(req.deepest, req.private, now)
        req.deepest = None
        req.tree_blocks = req.private = req.num_computed = 0
        req.insert_blocked = False
        self.running.remove(req)
        self.preemptions += 1
        self._preempted = True
        self.waiting.push(req, front=True)

    # ------------------------------------------------------------ applying steps

    def _finish_step(self, sched: Step, now: float) -> None:
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

    async def _run_steps(self, t0: float, steps: list[tuple[Step, float]]) -> None:
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
        self.scrape.observe()
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

    async def _leap(self, t0: float, first: float, slope: float, k: int) -> tuple[int, float]:
        """Sleep through ``k`` decode steps unless interrupted; the steps done and their time."""
        total = leap_seconds(first, slope, k)
        if not await self._sleep_interruptible(total):
            return k, total
        steps = leap_steps_done(first, slope, k, anyio.current_time() - t0)
        total = leap_seconds(first, slope, steps)
        await anyio.sleep_until(t0 + total)
        return steps, total

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
        if extra and not kv.allocate(extra):  # pragma: no cover - guarded by decode_leap
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
        self.sessions.call_ended(req, deepest, now)
        req._notify()

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
