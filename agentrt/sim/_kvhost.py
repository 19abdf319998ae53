"""The KV cache's host tier: blocks moved off the accelerator (evicted with room on the
host, or offloaded by a tool-wait policy), loaded back by an admission that matches them
or by a prefetch, and dropped in the eviction order's host LRU when the host is full.

:class:`HostTier` is a part of ``KVCache`` (a base class of it): it owns the host's
capacity and usage, the host-to-accelerator link's schedule and the transfer and
prefetch counters, and the moves between the tiers. The tree, its accounting and the
eviction order are the cache's (declared below for the type checker only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._kvtree import GPU, HOST, Node, Prefetch
from ._tokenize import Run

if TYPE_CHECKING:
    from ._eviction import EvictionOrder

__all__ = ["HostTier"]


class HostTier:
    """Host capacity and usage, transfers, prefetches (see the module docstring)."""

    if TYPE_CHECKING:  # the cache's, which this part uses
        root: Node
        gpu_tree: int
        evictable: int
        gpu_pins: int
        sessions: dict[Any, set[Node]]
        _track: bool
        _order: EvictionOrder
        on_events: Callable[..., None] | None
        available: Callable[[], int]
        pin_path: Callable[..., None]
        _make_room: Callable[[int], None]
        _drop_subtree: Callable[[Node], int]
        _drop_node: Callable[[Node], None]
        _stored: Callable[[Node, list[Run]], None]
        _removed: Callable[[list[Run]], None]
        _session_candidates: Callable[[Any], list[Node]]

    def _init_host(self, num_host_blocks: int) -> None:
        self.host_capacity = num_host_blocks
        self.host_used = 0
        self.host_pinned = 0
        """Host blocks that are pinned (offloaded by a policy, awaiting their prefetch)."""
        self.link_free = 0.0
        """When the host-to-accelerator link finishes the prefetches already started."""
        self.offloaded_blocks = 0
        """Blocks written to the host tier (evictions and offloads)."""
        self.loaded_blocks = 0
        """Blocks read back from the host tier by admissions (charged to the step)."""
        self.prefetched_blocks = 0
        """Blocks read back from the host tier by prefetches (overlapping the steps)."""
        self.prefetches = 0
        self.prefetches_useful = 0
        self.prefetches_wasted = 0
        self.prefetches_skipped = 0
        """Prefetches not started: no room on the accelerator, or nothing left to load."""

    # ------------------------------------------------------------ policies

    def host_room_for(self, blocks: int) -> bool:
        """Whether the host tier can take ``blocks`` without dropping pinned host blocks."""
        return blocks <= self.host_capacity - self.host_pinned

    def offload_tail(self, deepest: Node, top: Node, until: float) -> int:
        """Pin the own tail ``top``..``deepest`` until ``until`` and move it, with what hangs
        below it on the accelerator, to the host tier. Returns the blocks moved."""
        self.pin_path(deepest, until, top.parent)
        if top.tier != GPU:
            return 0
        return self._offload_subtree(top)

    def prefetch(self, deepest: Node, start: float, block_s: float, until: float) -> int:
        """Load the host blocks on the path to ``deepest`` back to the accelerator and pin
        the whole path until ``until`` (a pinned block's ancestors are pinned too, so that
        every evictable block can become an LRU leaf).

        The transfer starts at ``start`` or when the link is free, whichever is later, and
        takes ``block_s`` per block; the blocks are usable from its end (``ready_at``). Only
        when the accelerator has room without evicting referenced or pinned blocks. Returns
        the blocks loaded: 0 when nothing is left to load (counted as skipped), -1 when the
        accelerator has no room now (not counted: the caller may retry).
        """
        root = self.root
        if not deepest.alive or deepest.tier != HOST:
            self.prefetches_skipped += 1
            return 0
        nodes: list[Node] = []
        n = deepest
        need = 0
        while n is not root and n.tier == HOST:
            nodes.append(n)
            need += n.length
            assert n.parent is not None
            n = n.parent
        reclaim = 0  # evictable accelerator blocks the pin takes
        while n is not root:
            if n.refcount == 0 and not n.pinned:
                reclaim += n.length
            assert n.parent is not None
            n = n.parent
        if self.available() - reclaim < need:
            return -1
        # Pin first (making room must not evict the path), renewing every entry: the tail
        # was pinned alone when it left (see pin_path).
        self.pin_path(deepest, until, renew=True)
        self._make_room(need)
        ready = max(start, self.link_free) + need * block_s
        self.link_free = ready
        p = Prefetch(need)
        for node in reversed(nodes):  # parents before children
            self.host_used -= node.length
            self.gpu_tree += node.length
            self.host_pinned -= node.length  # pinned above
            self.gpu_pins += 1
            node.tier = GPU
            assert node.parent is not None
            node.parent.gpu_children += 1
            node.ready_at = ready
            node.prefetch = p
            if self.on_events is not None:
                self._stored(node, node.ids)
        self.prefetches += 1
        self.prefetched_blocks += need
        return need

    def offload_session(self, session: Any) -> int:
        """Move the unreferenced GPU blocks only ``session`` used to the host tier."""
        moved = 0
        for n in self._session_candidates(session):
            if n.alive and n.tier == GPU:
                moved += self._offload_subtree(n)
        return moved

    # ------------------------------------------------------------ moves between the tiers

    def _load(self, path: list[Node]) -> int:
        """An admission references ``path`` (deepest first): load its host nodes back
        (room was made). Returns the blocks loaded."""
        loaded = 0
        for node in reversed(path):
            if node.tier == HOST:
                self.host_used -= node.length
                if node.pinned:  # its wait is over (its ancestors may not be pinned)
                    self.host_pinned -= node.length
                    node.pinned = False
                    node.pin_until = 0.0
                self.gpu_tree += node.length
                node.tier = GPU
                assert node.parent is not None
                node.parent.gpu_children += 1
                loaded += node.length
                if self.on_events is not None:
                    self._stored(node, node.ids)
        self.loaded_blocks += loaded
        return loaded

    def _tail_to_host(self, n: Node, tail_runs: list[Run], tail_ids: list[Run], k: int) -> None:
        """The last ``k`` blocks evicted from ``n`` (keys ``tail_runs``, ids ``tail_ids``)
        become a host node between ``n`` and n's (host) children."""
        tail = Node(n, tail_runs, k, n.session)
        tail.ids = tail_ids
        tail.tier = HOST
        tail.last_access = n.last_access
        tail.resume_at = n.resume_at
        tail.shared = n.shared
        tail.children = n.children
        for c in tail.children.values():
            c.parent = tail
        n.children = {tail.key(): tail}
        self.host_used += k
        self.offloaded_blocks += k
        if self._track:
            self.sessions.setdefault(n.session, set()).add(tail)
        if not tail.children:
            self._order.push_host(tail)

    def _host_room(self, need: int) -> bool:
        """Make room for ``need`` blocks on the host, dropping its LRU leaves; whether
        there is."""
        if need > self.host_capacity:
            return False
        order = self._order
        while self.host_used + need > self.host_capacity:
            n = order.host_victim()
            if n is None:
                return False
            self._drop_node(n)
        return True

    def _to_host(self, n: Node) -> None:
        self._wasted(n)
        if self.on_events is not None:
            self._removed(n.ids)
        self.gpu_tree -= n.length
        if n.pinned:
            self.host_pinned += n.length
            self.gpu_pins -= 1
        elif n.refcount == 0:
            self.evictable -= n.length
        n.tier = HOST
        self.host_used += n.length
        self.offloaded_blocks += n.length
        parent = n.parent
        assert parent is not None
        parent.gpu_children -= 1
        if parent is not self.root and parent.gpu_children == 0:
            if parent.tier == GPU and parent.refcount == 0 and not parent.pinned:
                self._order.push(parent)
        if not n.children:
            self._order.push_host(n)

    def _offload_subtree(self, top: Node) -> int:
        order: list[Node] = []
        stack = [top]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(c for c in n.children.values() if c.tier == GPU)
        moved = 0
        for n in reversed(order):  # children before parents
            if not n.alive:
                continue
            if self._host_room(n.length):
                self._to_host(n)
                moved += n.length
            else:
                self._drop_subtree(n)
        return moved

    # ------------------------------------------------------------ prefetch outcomes

    def _resolve(self, n: Node, *, useful: bool) -> None:
        """The prefetch that loaded ``n`` is useful (a request uses ``n``) or wasted (``n``
        leaves the accelerator first), unless a sibling node already decided it."""
        p = n.prefetch
        if p is not None:
            n.prefetch = None
            if not p.resolved:
                p.resolved = True
                if useful:
                    self.prefetches_useful += 1
                else:
                    self.prefetches_wasted += 1

    def _wasted(self, n: Node) -> None:
        if n.prefetch is not None:
            self._resolve(n, useful=False)
