"""An approximate prefix tree per worker, as vllm-router's and SGLang's ``cache_aware``
keep (``src/tree.rs``): what each worker was *sent*, not what it holds.

The real tree stores request text by character; here a prompt is the embedded engine's key runs
(``Prompt.runs``: its full blocks, run-length encoded), so a match is counted in blocks and
the match rate is matched tokens over the prompt's tokens (the embedded engine's tokens are
4-byte pieces of text, so the ratio is the character ratio up to the last partial block).
Each node records, per tenant (worker index), when it last touched it; a tenant over its
budget loses its least recently used leaves (``evict``), as the real tree's periodic
``evict_tenant_by_size``.
"""

from __future__ import annotations

import heapq
from typing import Any

from .._tokenize import Run

__all__ = ["PrefixTree"]


class _Node:
    __slots__ = ("children", "count", "parent", "start", "tag", "tenants")

    def __init__(self, tag: Any, start: int, count: int, parent: _Node | None) -> None:
        self.tag = tag
        self.start = start
        self.count = count
        self.parent = parent
        self.children: dict[tuple[Any, int], _Node] = {}
        self.tenants: dict[int, float] = {}


class PrefixTree:
    """Prefix tree of block-key runs with per-tenant last-access times and sizes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = _Node(None, 0, 0, None)
        self.size: dict[int, int] = {}
        """Blocks per tenant."""

    def _split(self, node: _Node, keep: int) -> None:
        """Cut ``node``'s run after ``keep`` blocks; the rest becomes its only child."""
        rest = _Node(node.tag, node.start + keep, node.count - keep, node)
        rest.children = node.children
        for c in rest.children.values():
            c.parent = rest
        rest.tenants = dict(node.tenants)
        node.count = keep
        node.children = {(rest.tag, rest.start): rest}

    def insert(self, runs: list[Run], tenant: int, now: float) -> None:
        node = self.root
        node.tenants[tenant] = now
        size = self.size
        for tag, start, count in runs:
            while count > 0:
                child = node.children.get((tag, start))
                if child is None:
                    child = _Node(tag, start, count, node)
                    node.children[(tag, start)] = child
                elif child.count > count:
                    self._split(child, count)
                if tenant not in child.tenants:
                    size[tenant] = size.get(tenant, 0) + child.count
                child.tenants[tenant] = now
                start += child.count
                count -= child.count
                node = child

    def match(self, runs: list[Run]) -> tuple[int, int | None]:
        """The blocks of ``runs``' longest prefix in the tree, and the tenant that touched
        the deepest node of it last (None: no match)."""
        node = self.root
        matched = 0
        best: _Node | None = None
        for tag, start, count in runs:
            while count > 0:
                child = node.children.get((tag, start))
                if child is None or not child.tenants:
                    return matched, _last(best)
                step = min(child.count, count)
                matched += step
                best = child
                if step < child.count:
                    return matched, _last(best)
                start += step
                count -= step
                node = child
        return matched, _last(best)

    def evict(self, tenant: int, budget_blocks: int) -> None:
        """Remove ``tenant`` from its least recently used leaves until it holds at most
        ``budget_blocks`` blocks."""
        if self.size.get(tenant, 0) <= budget_blocks:
            return
        leaves: list[tuple[float, int, _Node]] = []
        stack = [self.root]
        n = 0
        while stack:
            node = stack.pop()
            inner = False
            for c in node.children.values():
                if tenant in c.tenants:
                    inner = True
                    stack.append(c)
            if not inner and node is not self.root:
                leaves.append((node.tenants[tenant], n, node))
                n += 1
        heapq.heapify(leaves)
        while leaves and self.size[tenant] > budget_blocks:
            _, _, node = heapq.heappop(leaves)
            del node.tenants[tenant]
            self.size[tenant] -= node.count
            parent = node.parent
            if not node.tenants and parent is not None:
                del parent.children[(node.tag, node.start)]
            if (
                parent is not None
                and parent is not self.root
                and tenant in parent.tenants
                and not any(tenant in c.tenants for c in parent.children.values())
            ):
                n += 1
                heapq.heappush(leaves, (parent.tenants[tenant], n, parent))


def _last(node: _Node | None) -> int | None:
    if node is None or not node.tenants:
        return None
    return max(node.tenants.items(), key=lambda kv: (kv[1], -kv[0]))[0]
