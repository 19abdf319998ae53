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
part of the tree is reported as vLLM reports it (``agentrt.scheduling._kvevents``):
``BlockStored`` when blocks enter it (computed and cached, or loaded back from the host
tier), with the hash of the block before them and the session that stored them;
``BlockRemoved`` when they leave it (evicted, offloaded or dropped). A block's hash is an
id given when it is first cached (:attr:`Node.ids`, run-length encoded as the keys are):
unique for as long as the block exists, as vLLM's chained hashes identify a block and its
prefix. Without a sink nothing is built.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Final

from ..scheduling._kvevents import BlockRemoved, BlockStored, KvEvent
from ._tokenize import Run, runs_length, slice_runs

__all__ = ["ENDED", "GPU", "HOST", "QUEUED", "KVCache", "Match", "Node", "Prefetch"]

GPU: Final = 0
HOST: Final = 1
QUEUED: Final = float("inf")
"""A resume time meaning a request of the session is queued: evicted last."""
ENDED: Final = -1.0
"""A resume time meaning the session ended (a retention directive's release): with
``directives`` its blocks are evicted before any other."""


class Node:
    """A run of cached blocks in the radix tree."""

    __slots__ = (
        "alive",
        "children",
        "far_seq",
        "gpu_children",
        "heap_seq",
        "ids",
        "last_access",
        "length",
        "parent",
        "pin_seq",
        "pin_until",
        "pinned",
        "prefetch",
        "ready_at",
        "refcount",
        "resume_at",
        "runs",
        "session",
        "shared",
        "tier",
        "uid",
    )

    _uids = itertools.count()

    def __init__(self, parent: Node | None, runs: list[Run], length: int, session: Any) -> None:
        self.uid = next(Node._uids)
        """Creation order: breaks LRU ties the same way however evictions are grouped."""
        self.parent = parent
        self.runs = runs
        self.length = length
        self.ids: list[Run] = []
        """Its blocks' ids (the hashes its KV-cache events carry), as runs
        ``(None, first, count)`` parallel to ``runs``."""
        self.children: dict[tuple[Any, int], Node] = {}
        self.gpu_children = 0
        self.refcount = 0
        self.tier = GPU
        self.pinned = False
        self.pin_until = 0.0
        self.pin_seq = -1
        """The sequence number of this node's current entry in the pin heap."""
        self.last_access = 0.0
        self.heap_seq = -1
        self.resume_at = 0.0
        """When this node's session declared it resumes (0: no declaration pending)."""
        self.far_seq = -1
        """The sequence number of this node's current entry in the resume heap."""
        self.session = session
        self.shared = False
        self.alive = True
        self.ready_at = 0.0
        """When a prefetch of this node to the accelerator completes (0: no prefetch)."""
        self.prefetch: Prefetch | None = None
        """The prefetch that loaded this node, until a request uses it or it is evicted."""

    def key(self) -> tuple[Any, int]:
        tag, start, _ = self.runs[0]
        return (tag, start)


class Prefetch:
    """One prefetch: ``useful`` once a request used its blocks, ``wasted`` if they were
    evicted first."""

    __slots__ = ("blocks", "resolved")

    def __init__(self, blocks: int) -> None:
        self.blocks = blocks
        self.resolved = False


class Match:
    """The result of a prefix lookup (nothing is changed until :meth:`KVCache.admit`)."""

    __slots__ = (
        "blocks",
        "gpu_blocks",
        "host_blocks",
        "node",
        "partial",
        "partial_blocks",
        "ready_at",
        "reclaim",
    )

    def __init__(self) -> None:
        self.node: Node | None = None
        self.partial: Node | None = None
        self.partial_blocks = 0
        self.blocks = 0
        self.gpu_blocks = 0
        self.host_blocks = 0
        self.reclaim = 0
        """Evictable GPU blocks the match would reference (no longer evictable then)."""
        self.ready_at = 0.0
        """When the last prefetch of a matched GPU block completes."""


class KVCache:
    """Block accounting and the prefix-cache tree of one replica."""

    def __init__(
        self,
        num_gpu_blocks: int,
        num_host_blocks: int,
        track_sessions: bool,
        *,
        directives: bool = False,
    ) -> None:
        self.capacity = num_gpu_blocks
        self.host_capacity = num_host_blocks
        self.root = Node(None, [], 0, None)
        self.root.refcount = 1 << 60
        self.gpu_tree = 0
        """Blocks held by GPU nodes of the tree."""
        self.private = 0
        """Blocks held by requests outside the tree."""
        self.evictable = 0
        """GPU tree blocks with no reference and no pin."""
        self.host_used = 0
        self.host_pinned = 0
        """Host blocks that are pinned (offloaded by a policy, awaiting their prefetch)."""
        self.gpu_pins = 0
        """Pinned accelerator nodes (what :meth:`yield_pins` could unpin)."""
        self.link_free = 0.0
        """When the host-to-accelerator link finishes the prefetches already started."""
        self._lru: list[tuple[float, int, int, Node]] = []
        self._far: list[tuple[float, int, int, Node]] = []
        """Hinted evictable leaves, the latest resume first (negated resume times)."""
        self._directives = directives
        self._ended: list[tuple[float, int, int, Node]] = []
        """``directives``: ended sessions' evictable leaves, LRU first."""
        self._queued: list[tuple[float, int, int, Node]] = []
        """``directives``: leaves of sessions whose next request waits (:data:`QUEUED`):
        they wake now, so they go last of all (LRU among them)."""
        self._expiry: list[tuple[float, int, int, Node]] = []
        """``directives``: retained evictable leaves, the retention ending first (moved to
        ``_lru`` once it has)."""
        self.now = 0.0
        """The clock as of the last call that gave one (hinted eviction compares with it)."""
        self._host_lru: list[tuple[float, int, int, Node]] = []
        self._pins: list[tuple[float, int, Node]] = []
        self._seq = itertools.count()
        self._track = track_sessions
        self.sessions: dict[Any, set[Node]] = {}
        self.evicted_blocks = 0
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
        if sink is None:
            return
        parent = node.parent
        if ids is not node.ids:  # blocks appended at its end: below its earlier ones
            first = ids[0][1]
            before = _id_before(node.ids, first)
        else:
            before = None
        if before is None and parent is not None and parent is not self.root:
            before = _last_id(parent.ids)
        session = node.session
        sink(
            [
                BlockStored(
                    _expand(ids),
                    before,
                    self.block_size,
                    session if isinstance(session, str) else None,
                )
            ]
        )

    def _removed(self, ids: list[Run]) -> None:
        """``ids`` left the accelerator's cache."""
        sink = self.on_events
        if sink is not None and ids:
            sink([BlockRemoved(_expand(ids))])

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
        self.now = now
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
        loaded = 0
        if match.host_blocks:
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
            _append_runs(deepest.runs, runs)
            deepest.length += n
            deepest.last_access = now
            self.gpu_tree += n
            self.private -= n
            new = self._fresh_ids(n)
            _append_ids(deepest.ids, new)
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
        self.now = now
        self.private -= private
        n = deepest
        root = self.root
        while n is not None and n is not root:
            n.refcount -= 1
            n.last_access = now
            if n.refcount == 0 and n.tier == GPU and not n.pinned:
                self.evictable += n.length
                if n.gpu_children == 0:
                    self._push(n)
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
        self.now = now
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
                            self._push(n)
                else:
                    self.host_pinned -= n.length
                    if not n.children:
                        self._push_host(n)
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
                    self._push(n)
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
                    self._push(n)
                elif not n.children:
                    self._push_host(n)
            n = n.parent

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

    def drop_tail(self, top: Node) -> int:
        """Free the own tail from ``top`` down (both tiers). Returns the blocks freed."""
        return self._drop_subtree(top) if top.alive else 0

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

    def offload_session(self, session: Any) -> int:
        """Move the unreferenced GPU blocks only ``session`` used to the host tier."""
        moved = 0
        for n in self._session_candidates(session):
            if n.alive and n.tier == GPU:
                moved += self._offload_subtree(n)
        return moved

    # ------------------------------------------------------------ internals

    def _push(self, n: Node) -> None:
        """Queue an evictable accelerator leaf (again: older entries go stale)."""
        n.heap_seq = seq = next(self._seq)
        r = n.resume_at
        if self._directives:
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

    def _push_host(self, n: Node) -> None:
        n.heap_seq = seq = next(self._seq)
        heapq.heappush(self._host_lru, (max(n.last_access, n.resume_at), n.uid, seq, n))

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
        if self._directives:
            victim = self._directed_victim()
            if victim is None:
                return False
            if victim.length > want:
                self._evict_tail(victim, want)
                self._push(victim)  # what is left is still an evictable leaf
            else:
                self._evict_node(victim)
            return True
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
                    n = far
                else:
                    heapq.heappop(lru)
            else:
                heapq.heappop(lru)
            if n.length > want:
                self._evict_tail(n, want)
                self._push(n)  # what is left is still an evictable leaf
            else:
                self._evict_node(n)
            return True
        return False

    def _directed_victim(self) -> Node | None:
        """``directives``: the next leaf to evict, popped from its heap: an ended
        session's (LRU first), else one with no retention in force (LRU first), else the
        retained one whose retention ends last, else one whose session's next request
        waits (LRU first)."""
        self._expire_retention()
        for heap in (self._ended, self._lru, self._far, self._queued):
            while heap:
                _, _, seq, n = heapq.heappop(heap)
                if seq == n.heap_seq and self._evictable_leaf(n):
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
            if seq == n.heap_seq and self._evictable_leaf(n):
                n.heap_seq = fresh = next(self._seq)
                heapq.heappush(lru, (max(n.last_access, n.resume_at), uid, fresh, n))

    @staticmethod
    def _evictable_leaf(n: Node) -> bool:
        return n.alive and n.tier == GPU and not (n.refcount or n.pinned or n.gpu_children)

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
            # The tail becomes a host node between ``n`` and n's (host) children.
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
                self._push_host(tail)
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

    def _host_room(self, need: int) -> bool:
        if need > self.host_capacity:
            return False
        lru = self._host_lru
        while self.host_used + need > self.host_capacity:
            if not lru:
                return False
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
                self._push(parent)
        if not n.children:
            self._push_host(n)

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
                self._push(parent)
        else:
            self.host_used -= n.length
            if n.pinned:
                self.host_pinned -= n.length
            if parent is not self.root and parent.tier == HOST and not parent.children:
                self._push_host(parent)
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


def _append_runs(dst: list[Run], src: list[Run]) -> None:
    if dst and src:
        t, s, n = dst[-1]
        t2, s2, n2 = src[0]
        if t == t2 and s + n == s2 and t[0] == "r":
            dst[-1] = (t, s, n + n2)
            dst.extend(src[1:])
            return
    dst.extend(src)


def _append_ids(dst: list[Run], src: list[Run]) -> None:
    if dst and src:
        t, s, n = dst[-1]
        _, s2, n2 = src[0]
        if s + n == s2:
            dst[-1] = (t, s, n + n2)
            dst.extend(src[1:])
            return
    dst.extend(src)


def _expand(ids: list[Run]) -> list[int]:
    if len(ids) == 1:
        _, first, count = ids[0]
        return list(range(first, first + count))
    return [i for _, first, count in ids for i in range(first, first + count)]


def _last_id(ids: list[Run]) -> int | None:
    if not ids:
        return None
    _, first, count = ids[-1]
    return first + count - 1


def _id_before(ids: list[Run], first: int) -> int | None:
    """The id before ``first`` in ``ids`` (None: ``first`` is the node's first block)."""
    prev: int | None = None
    for _, start, count in ids:
        if start <= first < start + count:
            return first - 1 if first > start else prev
        prev = start + count - 1
    return prev
