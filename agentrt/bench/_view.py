"""How close the client's view of each replica's KV is to the engine's.

While an agentrt client replays on the embedded engine, :class:`ViewSampler` samples, at
the same virtual times and per replica, what the runtime's router believes
(``scheduling/_workingset.py``'s ``WorkingSet``: the live sessions it placed there, their
contexts, how much of them it thinks is still cached, the weighted working set and the
capacity it assumes) and what the replica's engine holds (its KV blocks, and how much of
those same sessions' contexts is cached on the accelerator). :meth:`ViewSampler.result`
sums the samples up (``ClientResult.kv_view``; docs/benchmarks/steady.md, "How close the
client's view is"):

- ``resident``: the client's estimate of its live sessions' cached context
  (``WorkingSet.resident``, summed over the sessions) against the engine's real figure
  (each session's blocks on its last path still on the accelerator; the whole context
  of a session whose request is running): mean absolute error, the error relative to
  the real mean, correlation over all samples and replicas, and both means.
- ``over``: the share of samples where the client thought a replica over capacity (its
  router's test: weighted working set ``kv_demand`` above ``kv_capacity``) while it
  held its live sessions' contexts (``false_over``), and where it did not think so
  while the replica had evicted part of them (``missed_over``; more than one block per
  session short: the engine caches whole blocks).
- ``capacity``: what the client assumed (mean and lowest over the samples, and where it
  came from) against the replica's real capacity (blocks times block size).

Only for one agentrt client (not a fleet, not behind a gateway) with several endpoints:
the runtime's replicas are then the cluster's, in its order.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from ._clock import every

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ..sim._cluster import Cluster
    from ..sim._engine import Engine

__all__ = ["ViewSampler", "engine_cached", "format_view"]


def engine_cached(engine: Engine, session: str) -> int:
    """Tokens of ``session``'s context the engine holds on its accelerator now: a
    running request's whole context, else the blocks of its last finished path still
    cached there (0 if it has none)."""
    bs = engine.config.block_size
    for req in engine.running:
        if req.session == session:
            return (req.tree_blocks + req.private) * bs
    node = engine.sessions.paths.get(session)  # the bench reads the engine's state
    blocks = 0
    while node is not None and node.parent is not None:
        if node.alive and node.tier == 0:  # GPU
            blocks += node.length
        node = node.parent
    return blocks * bs


class ViewSampler:
    """Samples the runtime's view of each replica's KV against the engine's (module
    docstring) every ``interval_s`` of (virtual) time."""

    def __init__(self, cluster: Cluster, rt: Runtime, interval_s: float) -> None:
        self._engines = [r.engine for r in cluster.replicas]
        self._rt = rt
        self._interval = interval_s
        self._rows: list[tuple[int, int, float | None, float, float, float, bool, bool]] = []
        """(weight, replica, the client's resident estimate, the engine's, the client's
        capacity (nan unknown), the real one, client says over, engine is over)."""
        self._sources: Counter[str] = Counter()

    def _sample(self, n: int = 1) -> None:
        # Read-only: rt.endpoint_loads() would refresh the retention estimates, whose
        # recomputation depends on when they are read, and so move the routing.
        core = self._rt._core  # the router's own working sets
        now = core.clock()
        for i, (engine, e) in enumerate(zip(self._engines, core.endpoints, strict=True)):
            working = e.working_set
            contexts = working.contexts()
            if not contexts:
                continue
            capacity = working.capacity_tokens
            demand = working.demand(now)
            estimate: float | None = None
            if capacity is not None:
                estimate = float(sum(working.resident(s) or 0 for s in contexts))
            real = float(sum(engine_cached(engine, s) for s in contexts))
            bs = engine.config.block_size
            slack = bs * len(contexts)
            evicted = real < sum(contexts.values()) - slack
            says_over = capacity is not None and demand > capacity
            self._rows.append(
                (
                    n,
                    i,
                    estimate,
                    real,
                    math.nan if capacity is None else capacity,
                    float(engine.kv.capacity * bs),
                    says_over,
                    evicted,
                )
            )
            self._sources[working.source or "unknown"] += n

    async def run(self) -> None:
        await every(self._interval, self._sample)

    def result(self) -> dict[str, Any] | None:
        """The samples summed up (module docstring); None if none was taken."""
        self._sample()
        rows = self._rows
        if not rows:
            return None
        total = sum(r[0] for r in rows)
        known = [r for r in rows if r[2] is not None]
        resident: dict[str, float | None] = {
            "samples": float(total),
            "estimated_share": sum(r[0] for r in known) / total,
        }
        if known:
            w = [float(r[0]) for r in known]
            est = [float(r[2]) for r in known if r[2] is not None]
            real = [r[3] for r in known]
            weight = sum(w)
            mean_est = sum(a * b for a, b in zip(w, est, strict=True)) / weight
            mean_real = sum(a * b for a, b in zip(w, real, strict=True)) / weight
            mae = sum(a * abs(e - r) for a, e, r in zip(w, est, real, strict=True)) / weight
            bias = mean_est - mean_real
            resident.update(
                {
                    "estimate_mean": mean_est,
                    "real_mean": mean_real,
                    "mae": mae,
                    "rel_error": mae / mean_real if mean_real > 0 else None,
                    "bias": bias,
                    "correlation": _correlation(w, est, real),
                }
            )
        says = sum(r[0] for r in rows if r[6])
        evicted = sum(r[0] for r in rows if r[7])
        caps = [(r[0], r[4]) for r in rows if not math.isnan(r[4])]
        real_caps = sorted({r[5] for r in rows})
        return {
            "resident": resident,
            "over": {
                "client": says / total,
                "engine": evicted / total,
                "false_over": sum(r[0] for r in rows if r[6] and not r[7]) / total,
                "missed_over": sum(r[0] for r in rows if r[7] and not r[6]) / total,
            },
            "capacity": {
                "assumed_mean": sum(a * c for a, c in caps) / sum(a for a, _ in caps)
                if caps
                else None,
                "assumed_min": min(c for _, c in caps) if caps else None,
                "real": statistics.fmean(real_caps),
                "sources": {k: v / total for k, v in sorted(self._sources.items())},
            },
        }


def _correlation(w: list[float], x: list[float], y: list[float]) -> float | None:
    """Weighted Pearson correlation of ``x`` and ``y`` (None where either is constant)."""
    total = sum(w)
    mx = sum(a * b for a, b in zip(w, x, strict=True)) / total
    my = sum(a * b for a, b in zip(w, y, strict=True)) / total
    sxy = sum(a * (b - mx) * (c - my) for a, b, c in zip(w, x, y, strict=True))
    sxx = sum(a * (b - mx) ** 2 for a, b in zip(w, x, strict=True))
    syy = sum(a * (c - my) ** 2 for a, c in zip(w, y, strict=True))
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def format_view(view: dict[str, Any]) -> str:
    """The client's view of the replicas' KV against the engines', in words: its estimate
    of the context its sessions keep cached against the engines' figure, how often it
    judged a replica full against how often the engines had evicted, and the KV it
    assumed a replica holds against the real size (``k``: thousands of tokens)."""
    r, o, c = view["resident"], view["over"], view["capacity"]
    parts = []
    if r.get("mae") is not None:
        rel = r.get("rel_error")
        corr = r.get("correlation")
        off = f"{r['mae'] / 1e3:.0f}k" + ("" if rel is None else f", {100 * rel:.0f}%")
        parts.append(
            f"estimated its sessions' cached context at {r['estimate_mean'] / 1e3:.0f}k "
            f"tokens per replica on average, against {r['real_mean'] / 1e3:.0f}k really "
            f"cached (off by {off} on average"
            + ("" if corr is None else f"; correlation {corr:.2f}")
            + ")"
        )
    parts.append(
        f"judged a replica full {100 * o['client']:.0f}% of the time, while the engines "
        f"had evicted some of its sessions' context {100 * o['engine']:.0f}% of the time "
        f"(a false alarm {100 * o['false_over']:.0f}%, a miss "
        f"{100 * o['missed_over']:.0f}%)"
    )
    if c["assumed_mean"] is not None:
        parts.append(
            f"assumed a replica holds {c['assumed_mean'] / 1e3:.0f}k tokens of KV (at "
            f"least {c['assumed_min'] / 1e3:.0f}k), where each holds {c['real'] / 1e3:.0f}k"
        )
    return "; ".join(parts)
