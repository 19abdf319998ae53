"""Throughput at SLO (issue 19): for each client configuration, the highest Poisson arrival
rate at which the p90 JCT stretch stays at or below 2.

Stretch is a job's JCT over its JCT alone on an idle cluster of the same engine (the
``alone`` replay of ``agentrt bench``). For each workload and seed the jobs are made once
(at 1 job/s); a replay at rate ``r`` is the same jobs with every arrival time divided by
``r`` (the same Poisson draws, only the gaps scale), so the alone JCTs do not depend on the
rate and are replayed once per workload and seed. Each configuration's rate is searched
on its own: bracketing (the rate doubled or halved from ``--start`` until the p90 stretch
crosses 2), then bisection in log rate until the bracket is narrower than ``--tol``; the
rate reported is the p90 stretch interpolated linearly to 2 between the two ends of the
final bracket (``lo``: the highest rate tried that meets the SLO, below ``hi``: the lowest
that misses it). A job that fails counts as an infinite stretch.

The searches advance in lockstep, one replay per configuration per round, every round's
replays side by side (``--workers``, one process per core by default). Embedded replicas
(``h100-8b``), virtual time: the figures do not depend on this machine's load, only the
wall time does.

    .venv/bin/python benchmarks/slo_rate.py              # results/slo_rate.json
    .venv/bin/python benchmarks/slo_rate.py --quick      # a small run (the test's)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from _harness import write_result

from agentrt.bench import Arrivals, BenchConfig, JobPlan, TraceOptions, make_workload
from agentrt.bench._drivers import ClientSpec
from agentrt.bench._parallel import parse_workers
from agentrt.bench._runner import ALONE, ClientRun, PartResult, run_parts

SLO = 2.0
"""The p90 JCT stretch a configuration must stay at or below."""

CLIENTS: tuple[str, ...] = (
    "plain",
    "agentrt:session",
    "agentrt:least_loaded",
    "agentrt:session+mlfq@auto",
    "agentrt:session+mlfq@engine",
    "agentrt:session+plas@engine",
    "agentrt:session+mlfq,priority=on",
)
"""The configurations searched by default. An ordering policy with no cap
(``agentrt:session+mlfq``) replays exactly as ``agentrt:session`` (nothing waits on the
client, so there is nothing to order; the test checks it), so it is left out."""

WORKLOADS: dict[str, dict[str, Any]] = {
    # name: jobs per replay and the rate each search starts from (jobs/s)
    # Fewer jobs than these arrive faster than one job lasts at the rates where p90
    # stretch nears 2, so the cluster absorbs them whatever the rate (docs/benchmarks.md).
    "mixed-cc": {"jobs": 300, "start": 2.0},
    "claude-code": {"jobs": 150, "start": 0.1},
}


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


def p90_stretch(run: ClientRun, alone: dict[str, float]) -> tuple[float, float]:
    """The p50 and p90 of the jobs' stretch (a failed job: infinite)."""
    ratios = sorted(
        r.jct_s / alone[r.name] if r.status == "ok" and alone.get(r.name) else math.inf
        for r in run.results
    )

    def pct(q: float) -> float:
        return ratios[min(len(ratios) - 1, max(0, math.ceil(q * len(ratios)) - 1))]

    return pct(0.5), pct(0.9)


def at_rate(plans: Sequence[JobPlan], rate: float) -> list[JobPlan]:
    """The jobs made at 1 job/s, arriving at ``rate`` instead (the gaps divided)."""
    return [replace(p, arrival_s=p.arrival_s / rate) for p in plans]


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
    base: dict[tuple[str, int], list[JobPlan]] = {}
    cfgs: dict[tuple[str, int], BenchConfig] = {}
    for wl, opts in setup.workloads.items():
        for seed in setup.seeds:
            cfg = BenchConfig(
                workload=wl,
                jobs=int(opts["jobs"]),
                rate=1.0,
                seed=seed,
                clients=("plain",),
                replicas=setup.replicas,
                preset=setup.preset,
                traces=setup.traces,
                stretch=False,
                api="http",
                tool_wait_s=setup.tool_wait_s,
                gpu_blocks=setup.gpu_blocks,
            )
            cfgs[wl, seed] = cfg
            base[wl, seed] = make_workload(
                wl,
                cfg.jobs,
                Arrivals(1.0, seed),
                seed=seed,
                traces=setup.traces,
                tool_wait_s=setup.tool_wait_s,
            )
    searches = {
        (wl, seed, c): Search(
            float(setup.workloads[wl]["start"]), tol=setup.tol, max_tries=setup.max_tries
        )
        for (wl, seed) in base
        for c in setup.clients
    }
    detail: dict[tuple[str, int, str], list[dict[str, Any]]] = {k: [] for k in searches}
    rounds = 0
    started = time.perf_counter()
    out: dict[int, PartResult] = {}

    def done(index: int, result: PartResult | BaseException) -> None:
        if isinstance(result, BaseException):
            raise result
        out[index] = result

    while True:
        items: list[tuple[BenchConfig, list[JobPlan], int]] = []
        keys: list[tuple[str, int, str | None, float]] = []
        for (wl, seed), plans in base.items():
            if (wl, seed) not in cache:
                items.append((cfgs[wl, seed], plans, ALONE))
                keys.append((wl, seed, None, 0.0))
        for (wl, seed, client), search in searches.items():
            rate = search.next_rate()
            if rate is None:
                continue
            cfg = replace(cfgs[wl, seed], clients=(client,), rate=rate, fleet=setup.fleet)
            items.append((cfg, at_rate(base[wl, seed], rate), 0))
            keys.append((wl, seed, client, rate))
        if not items:
            break
        rounds += 1
        out.clear()
        run_parts(items, done, workers=setup.workers)
        for i, (wl, seed, who, _) in enumerate(keys):
            if who is None:
                alone = out[i]
                assert isinstance(alone, dict)
                cache[wl, seed] = alone
        for i, (wl, seed, who, rate) in enumerate(keys):
            if who is None:
                continue
            run = out[i]
            assert isinstance(run, ClientRun)
            p50, p90 = p90_stretch(run, cache[wl, seed])
            searches[wl, seed, who].tried[rate] = p90
            detail[wl, seed, who].append(
                {
                    "rate": rate,
                    "p90_stretch": p90,
                    "p50_stretch": p50,
                    "failed": sum(r.status != "ok" for r in run.results),
                    "busy": run.engine.get("utilization"),
                    "cache_hit": run.engine.get("hit_rate"),
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


def summarize(runs: dict[str, Any], clients: Sequence[str]) -> list[dict[str, Any]]:
    """Per workload and client: the rate (mean over seeds), the ratio to plain's (geometric
    mean over seeds of the per-seed ratios) and the ratios' range."""
    rows = []
    for wl, seeds in runs.items():
        for client in clients:
            rates = [s[client]["rate"] for s in seeds.values() if client in s]
            ratios = [
                s[client]["rate"] / s["plain"]["rate"]
                for s in seeds.values()
                if client in s and "plain" in s and s["plain"]["rate"] > 0
            ]
            if not rates:
                continue
            rows.append(
                {
                    "workload": wl,
                    "client": client,
                    "seeds": len(rates),
                    "rate": statistics.fmean(rates),
                    "rate_min": min(rates),
                    "rate_max": max(rates),
                    "x_plain": math.exp(statistics.fmean(math.log(r) for r in ratios))
                    if ratios and all(r > 0 for r in ratios)
                    else math.nan,
                    "x_plain_min": min(ratios) if ratios else math.nan,
                    "x_plain_max": max(ratios) if ratios else math.nan,
                }
            )
    return rows


def _short(client: str) -> str:
    return client.removeprefix("agentrt:")


def table(rows: list[dict[str, Any]], workloads: Sequence[str]) -> str:
    """The rates per configuration (rows) and workload (columns), under 80 columns."""
    clients = list(dict.fromkeys(r["client"] for r in rows))
    by = {(r["workload"], r["client"]): r for r in rows}
    head1 = f"{'configuration':<31}" + "".join(f"{wl:^24}" for wl in workloads)
    head2 = f"{'':<31}" + f"{'jobs/s':>7} {'x plain':>7} {'range':>8}" * len(workloads)
    lines = [head1.rstrip(), head2, "-" * len(head2)]
    for client in clients:
        cells = []
        for wl in workloads:
            r = by.get((wl, client))
            if r is None:
                cells.append(f"{'-':>7} {'':>7} {'':>8}")
                continue
            spread = (
                f"{r['x_plain_min']:.2f}-{r['x_plain_max']:.2f}"
                if r["seeds"] > 1 and math.isfinite(r["x_plain_min"])
                else ""
            )
            ratio = f"{r['x_plain']:6.2f}x" if math.isfinite(r["x_plain"]) else f"{'-':>7}"
            cells.append(f"{r['rate']:7.3g} {ratio} {spread:>8}")
        lines.append(f"{_short(client)[:30]:<31}" + "".join(cells))
    return "\n".join(lines)


def _quick() -> Setup:
    """A small run: 32 ReAct jobs with short tool waits (0.2 s median) on 2 replicas of
    1,200 KV blocks each, so that a few dozen jobs load them."""
    return Setup(
        workloads={"react": {"jobs": 32, "start": 1.0}},
        clients=("plain", "agentrt:session", "agentrt:session+mlfq"),
        seeds=(0,),
        replicas=2,
        tool_wait_s=0.2,
        gpu_blocks=1200,
        tol=1.3,
        max_tries=5,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small run (the test's)")
    ap.add_argument("--client", action="append", help="a configuration (repeatable)")
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--jobs", type=int, help="jobs per replay (default: per workload)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    ap.add_argument("--tol", type=float, default=1.2, help="stop at hi / lo <= TOL")
    ap.add_argument("--max-tries", type=int, default=6)
    ap.add_argument("--token-scale", type=float, default=0.25)
    ap.add_argument("--max-wait", type=float, default=30.0)
    ap.add_argument("--workers", type=parse_workers, default="auto")
    ap.add_argument("--fleet", type=int, default=1, help="each client as K processes")
    ap.add_argument(
        "--append",
        action="store_true",
        help="merge into --out's existing runs (same setup), reusing its alone JCTs",
    )
    ap.add_argument("--out", type=Path, default=Path("results/slo_rate.json"))
    args = ap.parse_args(argv)
    if args.quick:
        setup = _quick()
    else:
        wls = args.workload or list(WORKLOADS)
        setup = Setup(
            workloads={
                wl: {**WORKLOADS[wl], **({"jobs": args.jobs} if args.jobs else {})} for wl in wls
            },
            clients=tuple(args.client or CLIENTS),
            seeds=tuple(range(args.seeds)),
            traces=TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait),
            tol=args.tol,
            max_tries=args.max_tries,
        )
    if args.client and args.quick:
        setup.clients = tuple(args.client)
    setup.workers = args.workers
    if args.fleet < 1:
        sys.exit("--fleet must be >= 1")
    setup.fleet = args.fleet
    described = {
        "workloads": setup.workloads,
        "replicas": setup.replicas,
        "preset": setup.preset,
        "token_scale": setup.traces.token_scale,
        "max_wait_s": setup.traces.max_wait_s,
        "tool_wait_s": setup.tool_wait_s,
        "gpu_blocks": setup.gpu_blocks,
        "slo_p90_stretch": SLO,
        "tol": setup.tol,
        "max_tries": setup.max_tries,
        **({"fleet": setup.fleet} if setup.fleet != 1 else {}),
    }
    old: dict[str, Any] = {}
    cache: dict[tuple[str, int], dict[str, float]] = {}
    if args.append and args.out.exists():
        old = json.loads(args.out.read_text())
        if old.get("setup") != json.loads(json.dumps(described)):
            sys.exit(f"--append: {args.out} was measured with another setup; use another --out")
        for key, jcts in old.get("alone", {}).items():
            wl, _, seed = key.rpartition("/")
            cache[wl, int(seed)] = jcts
    started = time.perf_counter()
    order = list(dict.fromkeys([*old.get("clients", []), *setup.clients]))

    def save(runs: dict[str, Any], partial: bool) -> dict[str, Any]:
        merged: dict[str, Any] = json.loads(json.dumps(old.get("runs", {})))
        for wl, seeds in runs.items():
            for seed, clients in seeds.items():
                merged.setdefault(wl, {}).setdefault(seed, {}).update(clients)
        out = {
            "setup": described,
            "command": "benchmarks/slo_rate.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "partial": partial,
            "clients": order,
            "wall_s": round(time.perf_counter() - started + old.get("wall_s", 0.0), 1),
            "summary": summarize(merged, order),
            "runs": merged,
            "alone": {f"{wl}/{seed}": jcts for (wl, seed), jcts in cache.items()},
        }
        write_result(args.out, out, __doc__)
        return out

    out = save(measure(setup, cache, lambda runs: save(runs, True)), False)
    print(table(out["summary"], list(out["runs"])))
    print(
        f"p90 JCT stretch <= {SLO:g}; {setup.replicas} x {setup.preset}, virtual time; "
        f"wall {time.perf_counter() - started:.0f} s"
    )
    return out


if __name__ == "__main__":
    main()
