"""The prefix tree's parts: its nodes (runs of cached blocks), a lookup's result and a
prefetch's outcome, and the tiers a node's blocks live on (``_kv`` explains the tree)."""

from __future__ import annotations

import itertools
from typing import Any, Final

from ._tokenize import Run

__all__ = [
    "ENDED",
    "GPU",
    "HOST",
    "QUEUED",
    "Match",
    "Node",
    "Prefetch",
    "append_ids",
    "append_runs",
]

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


def append_runs(dst: list[Run], src: list[Run]) -> None:
    if dst and src:
        t, s, n = dst[-1]
        t2, s2, n2 = src[0]
        if t == t2 and s + n == s2 and t[0] == "r":
            dst[-1] = (t, s, n + n2)
            dst.extend(src[1:])
            return
    dst.extend(src)


def append_ids(dst: list[Run], src: list[Run]) -> None:
    if dst and src:
        t, s, n = dst[-1]
        _, s2, n2 = src[0]
        if s + n == s2:
            dst[-1] = (t, s, n + n2)
            dst.extend(src[1:])
            return
    dst.extend(src)
