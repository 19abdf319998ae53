"""What a simulated replica publishes about itself: its counters as a frozen snapshot
(:class:`ReplicaStats`, ``Replica.stats()``), and the queue, batch and KV usage as a
scraper polling ``/metrics`` every few seconds last read them (:class:`Scraper`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from ._config import EngineConfig
from ._kv import KVCache
from ._request import SimRequest
from ._sessions import Sessions
from ._waiting import WaitingQueue

__all__ = ["ReplicaStats", "Scraper", "snapshot"]


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


class Scraper:
    """The ``(waiting, running, kv_usage)`` a scraper polling every ``interval`` seconds
    (at whole multiples of it) last read: exact and free of timers. Before anything
    changes the queue, the batch or the KV, the engine calls :meth:`observe`, which keeps
    the state if a poll time has passed since the last change, so no poll needs to run.
    Until :meth:`every` is called it answers the live values."""

    __slots__ = ("_last", "_live", "interval", "next")

    def __init__(self, live: Callable[[], tuple[int, int, float]]) -> None:
        self._live = live
        self.interval = 0.0
        self.next = math.inf
        """The next poll time (infinite while no poll is emulated)."""
        self._last: tuple[int, int, float] = (0, 0, 0.0)

    def every(self, interval_s: float) -> None:
        """Emulate polls every ``interval_s`` seconds from now on."""
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval = interval_s
        self.next = 0.0
        self.observe()

    def observe(self) -> None:
        """Called before the state changes: the first change after a poll time keeps the
        state as it was then (nothing changed between that poll and now)."""
        if not self.interval:
            return
        now = anyio.current_time()
        if now >= self.next:
            self._last = self._live()
            s = self.interval
            self.next = (math.floor(now / s) + 1) * s

    def read(self) -> tuple[int, int, float]:
        """What the last poll saw (the live values when no poll is emulated)."""
        if not self.interval:
            return self._live()
        self.observe()
        return self._last


class _Replica(Protocol):
    """What :func:`snapshot` reads (the engine)."""

    name: str
    config: EngineConfig
    kv: KVCache
    waiting: WaitingQueue
    sessions: Sessions
    running: list[SimRequest]
    steps: int
    busy_s: float
    received: int
    finished: int
    aborted: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_queries: int
    prefix_hits: int
    host_hits: int


def snapshot(engine: _Replica) -> ReplicaStats:
    """A frozen snapshot of ``engine``'s counters, its sessions' and its KV cache's."""
    kv = engine.kv
    cap = kv.capacity
    config = engine.config
    block_bytes = config.block_size * config.kv_bytes_per_token
    sessions = engine.sessions
    tw = sessions.tool_waits
    return ReplicaStats(
        name=engine.name,
        time_s=anyio.current_time(),
        running=len(engine.running),
        waiting=engine.waiting.count,
        kv_usage=kv.used / cap if cap else 0.0,
        gpu_blocks=cap,
        gpu_blocks_cached=kv.gpu_tree,
        host_blocks=kv.host_capacity,
        host_blocks_used=kv.host_used,
        steps=engine.steps,
        busy_s=engine.busy_s,
        requests_received=engine.received,
        requests_finished=engine.finished,
        requests_aborted=engine.aborted,
        preemptions=engine.preemptions,
        prompt_tokens=engine.prompt_tokens,
        generation_tokens=engine.generation_tokens,
        prefix_cache_queries=engine.prefix_queries,
        prefix_cache_hits=engine.prefix_hits,
        host_cache_hits=engine.host_hits,
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
        resumed_first=sessions.resumed_first,
        tool_waits_pinned=tw["pin"],
        tool_waits_offloaded=tw["offload"],
        tool_waits_dropped=tw["drop"],
        tool_waits_lru=tw["lru"],
        tool_waits_resume=tw["resume"],
        tool_wait_fallbacks=tw["fallback"],
        final_calls=sessions.final_calls,
        final_blocks_dropped=sessions.final_blocks_dropped,
        directives_retained=sessions.directives_retained,
        directives_ended=sessions.directives_ended,
        idle_notices=sessions.idle_notices,
    )
