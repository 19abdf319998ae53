"""What a simulated replica keeps of each session between its calls, and what it does with
the session's KV then.

:class:`Sessions` holds each named session's last path in the KV cache (the deepest node
of its last finished call, for tool-start notices), the notices not yet applied and the
prefetches scheduled for offloaded tails. When a call ends it applies, to the session's
own blocks, what the call declared: ``final`` (``final_policy``), an expected idle (the
tool-wait policy: pin, offload with a prefetch for the expected resume, drop, declare the
resume to eviction, or leave it to LRU) and, with ``retention_directives``, the
directive. The engine's step loop calls it at the points below; it never touches the
batch or the queue.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from ._config import EngineConfig
from ._kv import ENDED, GPU, QUEUED, KVCache, Node
from ._request import SimRequest
from ._waiting import WaitingQueue

__all__ = ["Sessions"]

_PREFETCH_RETRY_S: Final = 0.1
"""How often a prefetch that found no room on the accelerator tries again."""
_MAX_SESSIONS: Final = 1 << 16
"""Sessions whose last path the engine remembers for tool-start notices (LRU)."""


class _PendingPrefetch:
    """A prefetch scheduled for a session's offloaded tail."""

    __slots__ = ("cancelled", "deepest", "session", "start", "until")

    def __init__(self, session: Any, deepest: Node, start: float, until: float) -> None:
        self.session = session
        self.deepest = deepest
        self.start = start
        self.until = until
        self.cancelled = False


class Sessions:
    """One replica's sessions between their calls: last paths, pending notices and
    prefetches, and the policies' counters."""

    def __init__(
        self,
        config: EngineConfig,
        kv: KVCache,
        waiting: WaitingQueue,
        wake: Callable[[], None],
    ) -> None:
        self.config = config
        self.kv = kv
        self._waiting = waiting
        """The queue whose block demand counts in the adaptive policy's pressure."""
        self._wake = wake
        """Wakes the step loop (a notice to apply)."""
        self.hints = config.tool_wait_policy == "resume" or config.retention_directives
        """Whether a session's queued and admitted requests are declared to eviction."""
        self._resume_lane = config.tool_wait_policy != "lru" and config.scheduling == "fcfs"
        self.paths: OrderedDict[Any, Node] = OrderedDict()
        """Each named session's last finished path (its deepest node), for notices."""
        self.notices: list[tuple[Any, float]] = []
        """Tool-start notices the loop applies at its next iteration."""
        self.prefetch_q: list[tuple[float, int, _PendingPrefetch]] = []
        """Scheduled prefetches, the earliest start first."""
        self.prefetch_of: dict[Any, _PendingPrefetch] = {}
        self._seq = itertools.count()
        self.tool_waits = dict.fromkeys(("pin", "offload", "drop", "lru", "fallback", "resume"), 0)
        self.idle_notices = 0
        self.resumed_first = 0
        self.final_calls = 0
        self.final_blocks_dropped = 0
        self.directives_retained = 0
        self.directives_ended = 0

    # ------------------------------------------------------------ the step loop's calls

    def arrived(self, req: SimRequest) -> None:
        """A request of a named session was queued: its prefix is needed next (evicted
        last, when hinting); FCFS admits it in the resumed lane if its KV was kept."""
        session = req.session
        if self.hints:
            self.hint(session, QUEUED)
        if self._resume_lane:
            path = self.paths.get(session)
            req.resumed = path is not None and path.alive and path.pinned
            self.resumed_first += req.resumed

    def hint(self, session: Any, resume_at: float) -> None:
        """Declare ``session``'s own tail next used at ``resume_at`` (``resume``)."""
        path = self.paths.get(session)
        if path is not None and path.alive:
            top, _ = self.kv.own_tail(path, session)
            if top is not None:
                self.kv.hint_resume(path, top, resume_at)

    def notice(self, session: Any, expected_s: float | None) -> bool:
        """A tool-start notice (see :meth:`Engine.notice_tool_wait`); False if the session
        is unknown here."""
        if session not in self.paths:
            return False
        self.idle_notices += 1
        if expected_s is not None and expected_s > 0 and self.config.tool_wait_policy != "lru":
            self.notices.append((session, expected_s))
            self._wake()
        return True

    def call_ended(self, req: SimRequest, deepest: Node, now: float) -> None:
        """``req`` finished with its path at ``deepest`` (the root: nothing cached).
        Remember the path and apply what the call declared."""
        cfg = self.config
        if not req.anonymous:
            paths = self.paths
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

    def process_notices(self, now: float) -> None:
        notices, self.notices = self.notices, []
        for session, expected in notices:
            deepest = self.paths.get(session)
            if deepest is not None:
                self._tool_wait(session, deepest, expected, now)

    def run_prefetches(self, now: float) -> None:
        """Start the prefetches due by ``now``, each as if started at its planned time. One
        that finds no room on the accelerator is retried every ``_PREFETCH_RETRY_S`` until
        its pin deadline."""
        q = self.prefetch_q
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
            if self.prefetch_of.get(p.session) is p:
                del self.prefetch_of[p.session]

    def cancel_prefetch(self, session: Any) -> None:
        p = self.prefetch_of.pop(session, None)
        if p is not None:
            p.cancelled = True

    # ------------------------------------------------------------ policies

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
        if self.prefetch_of:
            self.cancel_prefetch(session)
        self.paths.pop(session, None)
        if deepest is kv.root or not deepest.alive:
            return
        top, _ = kv.own_tail(deepest, session)
        if top is not None:
            self.final_blocks_dropped += kv.drop_tail(top)

    def _schedule_prefetch(self, session: Any, deepest: Node, start: float, until: float) -> None:
        p = _PendingPrefetch(session, deepest, start, until)
        heapq.heappush(self.prefetch_q, (p.start, next(self._seq), p))
        self.prefetch_of[session] = p

    def _tool_wait(self, session: Any, deepest: Node, idle: float, now: float) -> None:
        """Apply the tool-wait policy to ``session``'s KV (its path to ``deepest``) for a
        wait of ``idle`` seconds from ``now``. A new decision replaces a pending prefetch."""
        cfg = self.config
        kv = self.kv
        if self.prefetch_of:
            self.cancel_prefetch(session)
        if deepest is kv.root or not deepest.alive:
            return
        policy = cfg.tool_wait_policy
        until = now + idle + cfg.pin_margin_s
        if policy == "adaptive":
            kv.expire_pins(now)  # as of now, whether or not a leap is under way
            pressure = (kv.used + self._waiting.blocks) / kv.capacity
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
                self._schedule_prefetch(session, deepest, now + idle - transfer, until)
                self.tool_waits["offload"] += 1
                return
        if policy == "resume":
            top, blocks = kv.own_tail(deepest, session)
            if top is not None:
                kv.hint_resume(deepest, top, now + idle)
                if kv.host_capacity:  # bring back what eviction spilled by then
                    start = now + idle - blocks * cfg.block_transfer_s
                    self._schedule_prefetch(session, deepest, start, until)
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
