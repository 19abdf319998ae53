"""Throughput at SLO: the highest Poisson arrival rate at which a configuration's p90 JCT
stretch stays at or below 2 (``alternatives slo``'s search).

Stretch is a job's JCT over its JCT alone on an idle cluster of the same engine (the
``alone`` replay of ``agentrt bench``). For each workload and seed a replay at rate
``r`` is the same jobs at Poisson arrivals of rate ``r`` (the same draws, only the gaps
scale), so the alone JCTs do not depend on the rate and are replayed once per workload
and seed (beside a ``plain`` replay at 1 job/s, ``agentrt bench``'s stretch). Each
configuration's rate is searched on its own: bracketing (the rate doubled or halved from
its start until the p90 stretch crosses 2), then bisection in log rate until the bracket
is narrower than ``tol``; the rate reported is the p90 stretch interpolated linearly to
2 between the two ends of the final bracket (``lo``: the highest rate tried that meets
the SLO, below ``hi``: the lowest that misses it). A job that fails counts as an
infinite stretch.

The searches advance in lockstep, one replay per configuration per round, every round's
replays side by side (``workers``). Embedded replicas, virtual time: the figures do not
depend on this machine's load, only the wall time does.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrt.bench import BenchConfig, ClientSpec, TraceOptions, run_study

from ._harness import quantile

SLO = 2.0
"""The p90 JCT stretch a configuration must stay at or below."""


@dataclass(slots=True)
class Search:
    """One configuration's search for the highest rate with p90 stretch <= :data:`SLO`:
    bracketing by ``factor``, then bisection in log rate until ``hi / lo <= tol``."""

    start: float
    factor: float = 2.0
    tol: float = 1.1
    max_tries: int = 8
    floor: float = 1e-4
    ceiling: float = 1e4
    tried: dict[float, float] = field(default_factory=dict)
    """Rate tried -> its p90 stretch."""

    def bracket(self) -> tuple[float | None, float | None]:
        """``hi``: the lowest rate tried above the SLO; ``lo``: the highest rate below it
        that meets the SLO (None where there is none)."""
        over = [r for r, s in self.tried.items() if s > SLO]
        hi = min(over) if over else None
        under = [r for r, s in self.tried.items() if s <= SLO and (hi is None or r < hi)]
        return (max(under) if under else None), hi

    def next_rate(self) -> float | None:
        """The next rate to try; None when the search is done."""
        if not self.tried:
            return self.start
        if len(self.tried) >= self.max_tries:
            return None
        lo, hi = self.bracket()
        if hi is None:
            assert lo is not None
            nxt = lo * self.factor
            return nxt if nxt <= self.ceiling else None
        if lo is None:
            nxt = hi / self.factor
            return nxt if nxt >= self.floor else None
        if hi / lo <= self.tol:
            return None
        return math.sqrt(lo * hi)

    def rate(self) -> float:
        """The rate at which the p90 stretch reaches the SLO: linear between the final
        bracket's ends; the highest rate tried where it never crossed, 0 where even the
        lowest missed it."""
        lo, hi = self.bracket()
        if hi is None:
            return lo if lo is not None else math.nan
        if lo is None:
            return 0.0
        s_lo, s_hi = self.tried[lo], self.tried[hi]
        if not math.isfinite(s_hi) or s_hi <= s_lo:
            return lo
        return lo + (SLO - s_lo) * (hi - lo) / (s_hi - s_lo)


def p90_stretch(rows: Sequence[Mapping[str, Any]], alone: dict[str, float]) -> tuple[float, float]:
    """The p50 and p90 of the stretch of the jobs of ``rows`` (a client's
    :attr:`~agentrt.bench.ClientResult.job_rows`; a failed job: infinite)."""
    ratios = [
        r["jct_s"] / alone[r["name"]] if r["status"] == "ok" and alone.get(r["name"]) else math.inf
        for r in rows
    ]
    return quantile(ratios, 0.5), quantile(ratios, 0.9)


@dataclass(slots=True)
class Setup:
    """What one run measures."""

    workloads: dict[str, dict[str, Any]]
    clients: Sequence[str]
    seeds: Sequence[int]
    replicas: int = 8
    preset: str = "h100-8b"
    traces: TraceOptions = field(default_factory=TraceOptions)
    tool_wait_s: float = 2.0
    gpu_blocks: int | None = None
    tol: float = 1.1
    max_tries: int = 8
    workers: Any = "auto"
    fleet: int = 1
    """Each client as a fleet of this many independent members (``agentrt bench
    --fleet``); the alone JCTs stay a lone client's."""

    def config(self, workload: str, seed: int, **kw: Any) -> BenchConfig:
        """A replay of ``workload``'s jobs for ``seed`` on this setup's cluster; ``kw``:
        the rest (``rate``, ``clients``, ``fleet``)."""
        return BenchConfig(
            workload=workload,
            jobs=int(self.workloads[workload]["jobs"]),
            seed=seed,
            replicas=self.replicas,
            preset=self.preset,
            traces=self.traces,
            stretch=False,
            api="http",
            tool_wait_s=self.tool_wait_s,
            gpu_blocks=self.gpu_blocks,
            **kw,
        )


def measure(
    setup: Setup,
    alone_cache: dict[tuple[str, int], dict[str, float]] | None = None,
    checkpoint: Callable[[dict[str, Any]], object] | None = None,
) -> dict[str, Any]:
    """Every (workload, seed, client) search, run to the end. ``alone_cache``: alone JCTs
    already known, by (workload, seed); updated with those replayed here. ``checkpoint``
    gets the results so far after each round (the brackets are valid, only wider)."""
    for name in setup.clients:
        ClientSpec.parse(name)  # a bad spec fails before anything runs
    cache = alone_cache if alone_cache is not None else {}
    cfgs: dict[tuple[str, int], BenchConfig] = {}
    for wl in setup.workloads:
        for seed in setup.seeds:
            cfgs[wl, seed] = setup.config(wl, seed, rate=1.0, clients=("plain",))
    searches = {
        (wl, seed, c): Search(
            float(setup.workloads[wl]["start"]), tol=setup.tol, max_tries=setup.max_tries
        )
        for (wl, seed) in cfgs
        for c in setup.clients
    }
    detail: dict[tuple[str, int, str], list[dict[str, Any]]] = {k: [] for k in searches}
    rounds = 0
    started = time.perf_counter()

    while True:
        items: list[BenchConfig] = []
        keys: list[tuple[str, int, str | None, float]] = []
        for (wl, seed), cfg in cfgs.items():
            if (wl, seed) not in cache:  # each job alone: agentrt bench's stretch
                items.append(replace(cfg, stretch=True))
                keys.append((wl, seed, None, 0.0))
        for (wl, seed, client), search in searches.items():
            rate = search.next_rate()
            if rate is None:
                continue
            items.append(replace(cfgs[wl, seed], clients=(client,), rate=rate, fleet=setup.fleet))
            keys.append((wl, seed, client, rate))
        if not items:
            break
        rounds += 1
        out = run_study(items, workers=setup.workers)
        for (wl, seed, who, _), bench in zip(keys, out, strict=True):
            if who is None:
                rows = bench.clients[0].job_rows
                cache[wl, seed] = {r["name"]: r["alone_jct_s"] for r in rows}
        for (wl, seed, who, rate), bench in zip(keys, out, strict=True):
            if who is None:
                continue
            run = bench.clients[0]
            p50, p90 = p90_stretch(run.job_rows, cache[wl, seed])
            searches[wl, seed, who].tried[rate] = p90
            detail[wl, seed, who].append(
                {
                    "rate": rate,
                    "p90_stretch": p90,
                    "p50_stretch": p50,
                    "failed": run.failed,
                    "busy": run.utilization,
                    "cache_hit": run.prefix_cache_hit_rate,
                }
            )
        print(
            f"  round {rounds}: {len(items)} replays, {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        if checkpoint is not None:
            checkpoint(_results(searches, detail))
    return _results(searches, detail)


def _results(
    searches: dict[tuple[str, int, str], Search],
    detail: dict[tuple[str, int, str], list[dict[str, Any]]],
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for (wl, seed, client), search in searches.items():
        lo, hi = search.bracket()
        per = result.setdefault(wl, {}).setdefault(str(seed), {})
        per[client] = {
            "rate": search.rate(),
            "lo": lo,
            "hi": hi,
            "tries": sorted(detail[wl, seed, client], key=lambda t: t["rate"]),
        }
    return result
