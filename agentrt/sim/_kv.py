"""Paged KV cache with a prefix cache, an optional host tier, pins and session policies.

The cached blocks form a radix tree: a node holds a run-length encoded list of block keys
(see ``_tokenize``), and a block is identified by its key *and its path from the root*, which
is what vLLM's chained block hashes express. A request references every node on its path
(reference counts per node). Blocks a request holds outside the tree (the partial last block,
blocks not yet computed, duplicates) are *private* and only counted.

Eviction is LRU over unreferenced, unpinned leaves of the accelerator (GPU) part of the tree,
tail-first: a leaf is trimmed from its end. With a host tier, evicted blocks move there (their
own LRU); a prefix hit on host blocks loads them back. Along any root path the tiers are
GPU* then host*, so a GPU node never hangs below a host node.

With declared resume times (:meth:`KVCache.hint_resume`, the ``resume`` policy), eviction
approximates Belady's MIN instead (evict what is used again furthest ahead). Leaves with no
declaration go first, in LRU order. Then a declared leaf's next use is its resume time while
that is ahead, else it is estimated by its age since that resume time; the victim is the
leaf resuming last (a max-heap on resume time) or the LRU head (where a declared leaf is
keyed by its resume time), whichever is further. Leaves marked :data:`QUEUED` (a request
of the session waits) go last. The host tier drops in LRU order with the same keys.

With ``directives`` (a replica that honours retention directives, the engine's
``retention_directives``), :meth:`KVCache.hint_resume` carries what a request's directive
said about its session's own blocks instead: :data:`ENDED` (the session ended) or the time
its retention runs out (the expected wake-up plus a margin). Eviction then takes, in
order: ended sessions' leaves (LRU among them); leaves with no directive or whose
retention ran out (plain LRU); retained leaves, the one retained longest first (the
session that wakes latest); last, leaves of sessions whose next request is queued
(:data:`QUEUED`: they woke). Five heaps (ended, LRU, retained by end, queued, and
retained by expiry, lazily moved to LRU as their retention runs out): O(log n) per
eviction, no scan.

Pins protect blocks on either tier: a pinned GPU block is not evicted, a pinned host block is
not dropped to make room on the host. The tool-wait policies work on a session's *own tail*
(the unshared, unreferenced end of its last request's path): pin it, drop it, or offload it
to the host and later :meth:`KVCache.prefetch` it back, a transfer that completes at the
blocks' ``ready_at``.

KV-cache events: with a sink (:attr:`KVCache.on_events`), every change of the accelerator
part of the tree is reported as vLLM reports it (built in ``_blockevents``). A block's
hash is an id given when it is first cached (:attr:`Node.ids`). Without a sink nothing
is built.

The parts: the tree's nodes are ``_kvtree``'s; which leaf goes next, ``_eviction``'s
:class:`EvictionOrder`; the host tier and its transfers, ``_kvhost``'s :class:`HostTier`.
This class holds the tree, the block accounting and the pins.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from ..scheduling._kvevents import KvEvent
from ._blockevents import removed_event, stored_event
from ._eviction import EvictionOrder
from ._kvhost import HostTier
from ._kvtree import ENDED, GPU, HOST, QUEUED, Match, Node, Prefetch, append_ids, append_runs
from ._tokenize import Run, runs_length, slice_runs

__all__ = ["ENDED", "GPU", "HOST", "QUEUED", "KVCache", "Match", "Node", "Prefetch"]


class KVCache(HostTier):
    """Block accounting, the prefix-cache tree and the pins of one replica; the host tier
    is :class:`HostTier`'s, the order of eviction :class:`EvictionOrder`'s."""

    def __init__(
        self,
        num_gpu_blocks: int,
        num_host_blocks: int,
        track_sessions: bool,
        *,
        directives: bool = False,
    ) -> None:
        self.capacity = num_gpu_blocks
        self._init_host(num_host_blocks)
        self.root = Node(None, [], 0, None)
        self.root.refcount = 1 << 60
        self.gpu_tree = 0
        """Blocks held by GPU nodes of the tree."""
        self.private = 0
        """Blocks held by requests outside the tree."""
        self.evictable = 0
        """GPU tree blocks with no reference and no pin."""
        self.gpu_pins = 0
        """Pinned accelerator nodes (what :meth:`yield_pins` could unpin)."""
        self._order = EvictionOrder(directives)
        self._pins: list[tuple[float, int, Node]] = []
        self._seq = itertools.count()
        """Sequence numbers of the pin heap's entries."""
        self._track = track_sessions
        self.sessions: dict[Any, set[Node]] = {}
        self.evicted_blocks = 0
        self.yielded_blocks = 0
        """Pinned blocks unpinned early because a running request needed the room."""
        self.on_events: Callable[[list[KvEvent]], None] | None = None
        """Where the KV-cache events go (module docstring); None: none are built."""
        self._next_id = 1
        self.block_size = 0
        """Tokens per block (the events' ``block_size``; set by the engine)."""

    # ------------------------------------------------------------ events

    def _fresh_ids(self, n: int) -> list[Run]:
        first = self._next_id
        self._next_id = first + n
        return [(None, first, n)]

    def _stored(self, node: Node, ids: list[Run]) -> None:
        """``ids`` (blocks of ``node``) entered the accelerator's cache."""
        sink = self.on_events
        if sink is not None:
            sink([stored_event(node, ids, self.root, self.block_size)])

    def _removed(self, ids: list[Run]) -> None:
        """``ids`` left the accelerator's cache."""
        sink = self.on_events
        if sink is not None and ids:
            sink([removed_event(ids)])

    # ------------------------------------------------------------ accounting

    @property
    def free(self) -> int:
        """GPU blocks held by nothing at all."""
        return self.capacity - self.gpu_tree - self.private

    @property
    def used(self) -> int:
        """GPU blocks in use (referenced or pinned): what vLLM reports as KV usage."""
        return self.capacity - self.free - self.evictable

    def available(self) -> int:
        """Blocks an allocation could get now (free + evictable)."""
        return self.capacity - self.gpu_tree - self.private + self.evictable

    # ------------------------------------------------------------ lookup

    def match(self, runs: list[Run], max_blocks: int) -> Match:
        """Longest cached prefix of ``runs`` (at most ``max_blocks`` blocks)."""
        res = Match()
        node = self.root
        res.node = node
        nq = len(runs)
        qi = qo = 0
        remaining = max_blocks
        while remaining > 0 and qi < nq:
            tag, start, _ = runs[qi]
            child = node.children.get((tag, start + qo))
            if child is None:
                break
            m = 0
            ci = co = 0
            cruns = child.runs
            nc = len(cruns)
            while ci < nc and qi < nq and m < remaining:
                ct, cs, cn = cruns[ci]
                qt, qs, qn = runs[qi]
                if cs + co != qs + qo or ct != qt:
                    break
                step = min(cn - co, qn - qo, remaining - m)
                m += step
                co += step
                qo += step
                if co == cn:
                    ci += 1
                    co = 0
                if qo == qn:
                    qi += 1
                    qo = 0
            res.blocks += m
            remaining -= m
            if child.tier == GPU:
                res.gpu_blocks += m
                if child.refcount == 0 and not child.pinned:
                    res.reclaim += m
                if child.ready_at > res.ready_at:
                    res.ready_at = child.ready_at
            else:
                res.host_blocks += m
            if m < child.length:
                res.partial = child
                res.partial_blocks = m
                return res
            node = child
            res.node = node
        return res

    def can_admit(self, match: Match, new_blocks: int) -> bool:
        """Whether :meth:`admit` would find room for the match's host blocks and
        ``new_blocks`` private ones."""
        return self.available() - match.reclaim >= match.host_blocks + new_blocks

    def admit(self, match: Match, new_blocks: int, session: Any, now: float) -> tuple[Node, int]:
        """Reference the matched path, load its host blocks, allocate ``new_blocks``.

        Returns the deepest referenced node and the number of blocks loaded from the host
        tier. The caller checked :meth:`can_admit`.
        """
        self._order.now = now
        if match.partial is not None:
            deepest = self._split(match.partial, match.partial_blocks)
        else:
            assert match.node is not None
            deepest = match.node
        path: list[Node] = []
        n = deepest
        root = self.root
        while n is not root:
            path.append(n)
            assert n.parent is not None
            n = n.parent
        for node in path:
            if node.refcount == 0 and node.tier == GPU and not node.pinned:
                self.evictable -= node.length
            node.refcount += 1
            node.last_access = now
            node.resume_at = 0.0
            if node.session != session:
                node.shared = True
            if node.prefetch is not None:
                self._resolve(node, useful=True)
        need = match.host_blocks + new_blocks
        if need:
            self._make_room(need)
        loaded = self._load(path) if match.host_blocks else 0
        self.private += new_blocks
        return deepest, loaded

    def allocate(self, n: int) -> bool:
        """``n`` more private blocks, evicting cached ones if needed."""
        if self.available() < n:
            return False
        self._make_room(n)
        self.private += n
        return True

    def insert(
        self, deepest: Node, runs: list[Run], n: int, session: Any, now: float
    ) -> Node | None:
        """Move ``n`` computed private blocks (keys ``runs``) into the tree below ``deepest``,
        which the caller references. Returns the new deepest node, or None when another
        request cached the same blocks first (the caller keeps them private)."""
        if (
            deepest is not self.root
            and deepest.refcount == 1
            and not deepest.children
            and deepest.tier == GPU
            and (not self._track or (deepest.session == session and not deepest.shared))
        ):
            append_runs(deepest.runs, runs)
            deepest.length += n
            deepest.last_access = now
            self.gpu_tree += n
            self.private -= n
            new = self._fresh_ids(n)
            append_ids(deepest.ids, new)
            if self.on_events is not None:
                self._stored(deepest, new)
            return deepest
        tag, start, _ = runs[0]
        if (tag, start) in deepest.children:
            return None
        node = Node(deepest, list(runs), n, session)
        node.ids = self._fresh_ids(n)
        node.refcount = 1
        node.last_access = now
        deepest.children[(tag, start)] = node
        deepest.gpu_children += 1
        self.gpu_tree += n
        self.private -= n
        if self._track:
            self.sessions.setdefault(session, set()).add(node)
        if self.on_events is not None:
            self._stored(node, node.ids)
        return node

    def release(self, deepest: Node | None, private: int, now: float) -> None:
        """Drop a request's references (its path from ``deepest``) and free its private
        blocks. Unreferenced blocks stay cached (evictable)."""
        self._order.now = now
        self.private -= private
        n = deepest
        root = self.root
        while n is not None and n is not root:
            n.refcount -= 1
            n.last_access = now
            if n.refcount == 0 and n.tier == GPU and not n.pinned:
                self.evictable += n.length
                if n.gpu_children == 0:
                    self._order.push(n)
            n = n.parent

    # ------------------------------------------------------------ pins and policies

    def pin_path(
        self, deepest: Node | None, until: float, stop: Node | None = None, *, renew: bool = False
    ) -> None:
        """Pin every node from ``deepest`` up to the root (or up to ``stop``, excluded: only
        for a tail about to leave the accelerator) until ``until``; a pin is extended, never
        shortened. ``renew`` pushes fresh heap entries for the whole path (a tail pinned with
        ``stop`` that comes back to the accelerator).

        A parent's pin lasts at least as long as its children's, and above a node whose
        heap entry is pushed its ancestors' are pushed too, so a parent's current entry
        always comes after its pinned children's: expiry and :meth:`yield_pins` never
        leave a pinned block below an unpinned one.
        """
        n = deepest
        root = self.root
        pushed = renew
        while n is not None and n is not root and n is not stop:
            fresh = not n.pinned
            if fresh:
                if n.tier == GPU:
                    self.gpu_pins += 1
                    if n.refcount == 0:
                        self.evictable -= n.length
                else:
                    self.host_pinned += n.length
                n.pinned = True
            if fresh or pushed or until > n.pin_until:
                if until > n.pin_until:
                    n.pin_until = until
                n.pin_seq = seq = next(self._seq)
                heapq.heappush(self._pins, (n.pin_until, seq, n))
                pushed = True
            if n.pin_until > until:
                until = n.pin_until
            n = n.parent

    def expire_pins(self, now: float) -> float | None:
        """Unpin what expired by ``now``; the next expiry time, if any."""
        self._order.now = now
        pins = self._pins
        while pins and pins[0][0] <= now:
            _, _, n = heapq.heappop(pins)
            if n.alive and n.pinned and n.pin_until <= now:
                n.pinned = False
                if n.tier == GPU:
                    self.gpu_pins -= 1
                    if n.refcount == 0:
                        self.evictable += n.length
                        if n.gpu_children == 0:
                            self._order.push(n)
                else:
                    self.host_pinned -= n.length
                    if not n.children:
                        self._order.push_host(n)
        return pins[0][0] if pins else None

    def yield_pins(self, need: int) -> bool:
        """Unpin accelerator blocks, those whose pins end first, until ``need`` blocks are
        available (a running request needs them: better than preempting it). Whether they
        are. Host pins stay."""
        pins = self._pins
        kept: list[tuple[float, int, Node]] = []
        while pins and self.gpu_pins and self.available() < need:
            entry = heapq.heappop(pins)
            _, seq, n = entry
            if not (n.alive and n.pinned and seq == n.pin_seq):
                continue  # stale: expired, unpinned, or superseded by a later entry
            if n.tier != GPU:
                kept.append(entry)
                continue
            # Pinned children's entries came first (pin_path), so no pinned block is left
            # below an unpinned one.
            n.pinned = False
            n.pin_until = 0.0
            self.gpu_pins -= 1
            self.yielded_blocks += n.length
            if n.refcount == 0:
                self.evictable += n.length
                if n.gpu_children == 0:
                    self._order.push(n)
        for entry in kept:
            heapq.heappush(pins, entry)
        return self.available() >= need

    def next_pin(self) -> float | None:
        """When the next pin may expire (a stale heap entry gives an early answer)."""
        return self._pins[0][0] if self._pins else None

    def own_tail(self, deepest: Node | None, session: Any) -> tuple[Node | None, int]:
        """The highest node of ``session``'s own tail on the path to ``deepest``: the nodes
        only this session used and no request references. Returns it (None: no such node)
        and the tail's blocks on either tier."""
        top = None
        blocks = 0
        n = deepest
        root = self.root
        while (
            n is not None
            and n is not root
            and n.alive
            and n.refcount == 0
            and not n.shared
            and n.session == session
        ):
            top = n
            blocks += n.length
            n = n.parent
        return top, blocks

    def hint_resume(self, deepest: Node, top: Node, resume_at: float) -> None:
        """Declare that the own tail ``top``..``deepest`` (see :meth:`own_tail`) is next used
        at ``resume_at``: eviction keeps it ahead of leaves expected back later. With
        ``directives``: :data:`ENDED`, :data:`QUEUED`, 0 (no directive) or the time its
        retention runs out (see the module docstring)."""
        n: Node | None = deepest
        stop = top.parent
        while n is not None and n is not stop:
            n.resume_at = resume_at
            if n.refcount == 0 and not n.pinned and not n.gpu_children:
                if n.tier == GPU:
                    self._order.push(n)
                elif not n.children:
                    self._order.push_host(n)
            n = n.parent

    def drop_tail(self, top: Node) -> int:
        """Free the own tail from ``top`` down (both tiers). Returns the blocks freed."""
        return self._drop_subtree(top) if top.alive else 0

    def _session_candidates(self, session: Any) -> list[Node]:
        return [
            n
            for n in self.sessions.get(session, ())
            if n.alive and n.refcount == 0 and not n.pinned and not n.shared
        ]

    def drop_session(self, session: Any) -> int:
        """Free the unreferenced blocks only ``session`` used (and what extends them)."""
        dropped = 0
        for n in self._session_candidates(session):
            if n.alive:
                dropped += self._drop_subtree(n)
        return dropped

    # ------------------------------------------------------------ internals

    def _split(self, node: Node, m: int) -> Node:
        """Split ``node`` after its first ``m`` blocks; returns the new top part (the
        existing object keeps the bottom part, so references to it stay valid)."""
        top = Node(node.parent, slice_runs(node.runs, 0, m), m, node.session)
        top.ids = slice_runs(node.ids, 0, m)
        node.ids = slice_runs(node.ids, m, node.length)
        node.runs = slice_runs(node.runs, m, node.length)
        node.length -= m
        parent = node.parent
        assert parent is not None
        parent.children[top.key()] = top
        node.parent = top
        top.children[node.key()] = node
        top.tier = node.tier
        top.gpu_children = 1 if node.tier == GPU else 0
        top.refcount = node.refcount
        top.pinned = node.pinned
        if top.pinned and top.tier == GPU:
            self.gpu_pins += 1
        top.pin_until = node.pin_until
        top.last_access = node.last_access
        top.resume_at = node.resume_at
        top.shared = node.shared
        top.ready_at = node.ready_at
        top.prefetch = node.prefetch
        # ``top`` is pinned as ``node`` is: its entry must come after node's and before its
        # pinned ancestors', so theirs are renewed too (see pin_path).
        n: Node | None = top
        while n is not None and n is not self.root and n.pinned:
            n.pin_seq = seq = next(self._seq)
            heapq.heappush(self._pins, (n.pin_until, seq, n))
            n = n.parent
        if self._track:
            self.sessions.setdefault(node.session, set()).add(top)
        return top

    def _make_room(self, need: int) -> None:
        while self.capacity - self.gpu_tree - self.private < need:
            if not self._evict_one(need - (self.capacity - self.gpu_tree - self.private)):
                raise RuntimeError("KV accounting error: no evictable block left")

    def _evict_one(self, want: int) -> bool:
        victim = self._order.victim()
        if victim is None:
            return False
        if victim.length > want:
            self._evict_tail(victim, want)
            self._order.push(victim)  # what is left is still an evictable leaf
        else:
            self._evict_node(victim)
        return True

    def _evict_tail(self, n: Node, k: int) -> None:
        """Evict the last ``k`` blocks of an unreferenced GPU leaf (``k < n.length``)."""
        self.evicted_blocks += k
        self._wasted(n)
        keep = n.length - k
        tail_runs = slice_runs(n.runs, keep, n.length)
        tail_ids = slice_runs(n.ids, keep, n.length)
        n.runs = slice_runs(n.runs, 0, keep)
        n.ids = slice_runs(n.ids, 0, keep)
        n.length = keep
        if self.on_events is not None:
            self._removed(tail_ids)
        self.gpu_tree -= k
        self.evictable -= k
        if self.host_capacity and self._host_room(k):
            self._tail_to_host(n, tail_runs, tail_ids, k)
        elif n.children:
            # No room on the host: what hung below the tail goes with it.
            for c in list(n.children.values()):
                self._drop_subtree(c)

    def _evict_node(self, n: Node) -> None:
        """Evict an unreferenced GPU leaf: to the host tier if it has room, else drop it."""
        self.evicted_blocks += n.length
        if self.host_capacity and self._host_room(n.length):
            self._to_host(n)
        else:
            self._drop_subtree(n)

    def _drop_subtree(self, top: Node) -> int:
        order: list[Node] = []
        stack = [top]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        dropped = 0
        for n in reversed(order):
            dropped += n.length
            self._drop_node(n)
        return dropped

    def _drop_node(self, n: Node) -> None:
        """Remove a childless node from the tree."""
        parent = n.parent
        assert parent is not None
        del parent.children[n.key()]
        if n.tier == GPU:
            self._wasted(n)
            if self.on_events is not None:
                self._removed(n.ids)
            self.gpu_tree -= n.length
            if n.pinned:
                self.gpu_pins -= 1
            elif n.refcount == 0:
                self.evictable -= n.length
            parent.gpu_children -= 1
            if (
                parent is not self.root
                and parent.gpu_children == 0
                and parent.tier == GPU
                and parent.refcount == 0
                and not parent.pinned
            ):
                self._order.push(parent)
        else:
            self.host_used -= n.length
            if n.pinned:
                self.host_pinned -= n.length
            if parent is not self.root and parent.tier == HOST and not parent.children:
                self._order.push_host(parent)
        n.alive = False
        if self._track:
            nodes = self.sessions.get(n.session)
            if nodes is not None:
                nodes.discard(n)
                if not nodes:
                    del self.sessions[n.session]

    # ------------------------------------------------------------ checks (tests)

    def check(self, now: float | None = None) -> None:
        """Recompute every counter from the tree and compare (for tests)."""
        gpu = host = evictable = host_pinned = gpu_pins = 0
        stack = [self.root]
        while stack:
            n = stack.pop()
            gpu_children = 0
            for k, c in n.children.items():
                assert c.parent is n and c.alive and k == c.key()
                assert runs_length(c.runs) == c.length > 0
                if c.tier == GPU:
                    gpu_children += 1
                    assert n is self.root or n.tier == GPU, "GPU node below a host node"
                stack.append(c)
            if n is self.root:
                continue
            assert gpu_children == n.gpu_children, "gpu_children out of date"
            assert n.refcount >= 0
            if n.tier == GPU:
                gpu += n.length
                gpu_pins += n.pinned
                if n.refcount == 0 and not n.pinned:
                    evictable += n.length
                    for c in n.children.values():
                        held = c.tier == GPU and (c.refcount or c.pinned)
                        assert not held, "a held block below an evictable one"
            else:
                host += n.length
                assert n.refcount == 0, "a host block is referenced"
                if n.pinned:
                    host_pinned += n.length
        assert gpu == self.gpu_tree, (gpu, self.gpu_tree)
        assert host_pinned == self.host_pinned, (host_pinned, self.host_pinned)
        assert gpu_pins == self.gpu_pins, (gpu_pins, self.gpu_pins)
        assert host == self.host_used, (host, self.host_used)
        assert evictable == self.evictable, (evictable, self.evictable)
        assert 0 <= self.free <= self.capacity, self.free
        assert self.host_used <= self.host_capacity
