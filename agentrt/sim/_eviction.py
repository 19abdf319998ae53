"""The eviction order of a replica's KV cache: which unreferenced, unpinned leaf goes next,
on the accelerator and on the host tier.

The cache queues a leaf here whenever it may have become evictable (:meth:`push`,
:meth:`push_host`), again whenever its keys change: entries are lazy, an entry whose
sequence number is not its node's current one, or whose node is no longer an evictable
leaf, is dropped when it comes up. :meth:`victim` and :meth:`host_victim` pop the next
leaf; what eviction does with it (trim, move to the host, drop) is the cache's.

Plain LRU; with declared resume times (``hint_resume``), Belady's MIN approximated; with
``directives``, the retention directives' order (the ``_kv`` module docstring has both).
"""

from __future__ import annotations

import heapq
import itertools

from ._kvtree import GPU, HOST, QUEUED, Node

__all__ = ["EvictionOrder"]

_Entry = tuple[float, int, int, Node]
"""(key, node uid, sequence number, node): the key first, then creation order."""


class EvictionOrder:
    """The heaps of evictable leaves, and the clock eviction compares resume times with."""

    __slots__ = ("_ended", "_expiry", "_far", "_host_lru", "_lru", "_queued", "_seq", "now")

    def __init__(self, directives: bool) -> None:
        self._lru: list[_Entry] = []
        self._far: list[_Entry] = []
        """Hinted evictable leaves, the latest resume first (negated resume times)."""
        self._ended: list[_Entry] | None = [] if directives else None
        """``directives``: ended sessions' evictable leaves, LRU first (None: no
        directives)."""
        self._queued: list[_Entry] = []
        """``directives``: leaves of sessions whose next request waits (:data:`QUEUED`):
        they wake now, so they go last of all (LRU among them)."""
        self._expiry: list[_Entry] = []
        """``directives``: retained evictable leaves, the retention ending first (moved to
        ``_lru`` once it has)."""
        self._host_lru: list[_Entry] = []
        self._seq = itertools.count()
        self.now = 0.0
        """The clock as of the cache's last call that gave one."""

    def push(self, n: Node) -> None:
        """Queue an evictable accelerator leaf (again: older entries go stale)."""
        n.heap_seq = seq = next(self._seq)
        r = n.resume_at
        if self._ended is not None:
            if r < 0.0:
                heapq.heappush(self._ended, (n.last_access, n.uid, seq, n))
            elif r == QUEUED:
                heapq.heappush(self._queued, (n.last_access, n.uid, seq, n))
            elif r > self.now:
                heapq.heappush(self._far, (-r, n.uid, seq, n))
                heapq.heappush(self._expiry, (r, n.uid, seq, n))
            else:
                heapq.heappush(self._lru, (n.last_access, n.uid, seq, n))
            return
        heapq.heappush(self._lru, (max(n.last_access, r), n.uid, seq, n))
        if self.now < r < QUEUED:
            n.far_seq = seq
            heapq.heappush(self._far, (-r, n.uid, seq, n))

    def push_host(self, n: Node) -> None:
        """Queue a host leaf that may be dropped."""
        n.heap_seq = seq = next(self._seq)
        heapq.heappush(self._host_lru, (max(n.last_access, n.resume_at), n.uid, seq, n))

    def victim(self) -> Node | None:
        """Pop the accelerator leaf to evict next (None: none is evictable)."""
        if self._ended is not None:
            return self._directed_victim(self._ended)
        lru = self._lru
        while lru:
            _, _, seq, n = lru[0]
            if (
                seq != n.heap_seq
                or not n.alive
                or n.tier != GPU
                or n.refcount
                or n.pinned
                or n.gpu_children
            ):
                heapq.heappop(lru)
                continue
            if self._far and n.resume_at:
                far = self._far_leaf()
                # A head with no declaration goes first (no resume was declared: the job
                # ended or waits on a person). A declared head's next use is its resume time
                # if ahead (then every leaf is declared, and ``far`` resumes last), else
                # estimated by its age since that resume time.
                if far is not None and (
                    lru[0][0] > self.now or far.resume_at - self.now > self.now - lru[0][0]
                ):
                    heapq.heappop(self._far)
                    return far
            heapq.heappop(lru)
            return n
        return None

    def host_victim(self) -> Node | None:
        """Pop the host leaf to drop next (None: none may be dropped)."""
        lru = self._host_lru
        while lru:
            _, _, seq, n = heapq.heappop(lru)
            if (
                seq != n.heap_seq
                or not n.alive
                or n.tier != HOST
                or n.refcount
                or n.children
                or n.pinned  # pushed again when unpinned
            ):
                continue
            return n
        return None

    def _directed_victim(self, ended: list[_Entry]) -> Node | None:
        """``directives``: the next leaf to evict, popped from its heap: an ended
        session's (LRU first), else one with no retention in force (LRU first), else the
        retained one whose retention ends last, else one whose session's next request
        waits (LRU first)."""
        self._expire_retention()
        for heap in (ended, self._lru, self._far, self._queued):
            while heap:
                _, _, seq, n = heapq.heappop(heap)
                if seq == n.heap_seq and _evictable_leaf(n):
                    return n
        return None

    def _expire_retention(self) -> None:
        """Move the retained leaves whose retention ran out by ``now`` to the LRU heap (a
        fresh entry: their ``_far`` entries go stale), aged from the end of their
        retention: a session late for its expected wake-up counts as used then."""
        expiry = self._expiry
        now = self.now
        lru = self._lru
        while expiry and expiry[0][0] <= now:
            _, uid, seq, n = heapq.heappop(expiry)
            if seq == n.heap_seq and _evictable_leaf(n):
                n.heap_seq = fresh = next(self._seq)
                heapq.heappush(lru, (max(n.last_access, n.resume_at), uid, fresh, n))

    def _far_leaf(self) -> Node | None:
        """The evictable leaf that resumes last, if one resumes after ``now`` (lazy: stale
        entries are dropped; a leaf pushed again has a fresh one)."""
        far = self._far
        now = self.now
        while far:
            neg, _, seq, n = far[0]
            if (
                seq == n.far_seq
                and now < -neg < QUEUED
                and n.alive
                and n.tier == GPU
                and not (n.refcount or n.pinned or n.gpu_children)
                and n.resume_at == -neg
            ):
                return n
            heapq.heappop(far)
        return None


def _evictable_leaf(n: Node) -> bool:
    return n.alive and n.tier == GPU and not (n.refcount or n.pinned or n.gpu_children)
