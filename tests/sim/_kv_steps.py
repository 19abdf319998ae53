"""Steps on a bare :class:`KVCache` shared by its tests (the KV cache's and retention's)."""

from __future__ import annotations

from agentrt.sim._kv import KVCache, Node
from agentrt.sim._tokenize import Run, slice_runs


def seq(ns: str, start: int, count: int) -> list[Run]:
    return [(("r", ns, 16), start, count)]


def runs_after(runs: list[Run], k: int) -> list[Run]:
    return slice_runs(runs, k, sum(r[2] for r in runs))


def cache_sequence(kv: KVCache, runs: list[Run], session: str, now: float) -> Node:
    """Admit a request for ``runs`` (hits + new blocks), insert them, return its deepest node."""
    n = sum(r[2] for r in runs)
    m = kv.match(runs, n)
    new = n - m.blocks
    assert kv.can_admit(m, new)
    deepest, _ = kv.admit(m, new, session, now)
    if new:
        node = kv.insert(deepest, runs_after(runs, m.blocks), new, session, now)
        assert node is not None
        deepest = node
    return deepest


def try_request(kv: KVCache, who: int, n: int, now: float) -> tuple[Node, int] | None:
    """Session ``s{who}``'s request of a 2-block shared prefix and ``n`` blocks of its own,
    admitted if there is room: what to release later (its node and private blocks), else
    None."""
    runs = seq("sys", 0, 2) + seq(f"s{who}", 0, n)
    total = 2 + n
    m = kv.match(runs, total)
    new = total - m.blocks
    if not kv.can_admit(m, new):
        return None
    deepest, _ = kv.admit(m, new, f"s{who}", now)
    if not new:
        return deepest, 0
    node = kv.insert(deepest, runs_after(runs, m.blocks), new, f"s{who}", now)
    return (deepest, new) if node is None else (node, 0)
