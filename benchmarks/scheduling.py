"""Program scheduling: client-side ordering (plas, mlfq) against plain and fcfs, by load.

The ``mixed-cc`` workload (short ReAct jobs and long Claude Code replays, 20% of the jobs)
runs on an embedded cluster of 4 simulated H100-class replicas in virtual time, Poisson
arrivals at rates that keep the cluster about 80% and 95% busy with the plain client (busy:
the replicas' mean busy fraction over the second half of the arrivals), plus an overload
point. Every client replays the identical workload on a fresh cluster, side by side:

- ``plain``: a bare openai client sending every call at once, round-robin;
- ``agentrt:fcfs+round_robin``: agentrt, no client-side queue;
- ``agentrt:{plas,mlfq}+round_robin@LIMIT``: calls beyond LIMIT per endpoint (``auto``: the
  gradient limiter; or a fixed number) wait in agentrt's queue, in the policy's order;
- ``agentrt:{plas,mlfq}+round_robin,priority=on``: no client cap; each call's queue level
  goes to the engine as vLLM's body ``priority`` and the replicas schedule by priority.

``--knee`` instead sweeps the per-endpoint concurrency limit on one replica under a
saturating closed loop (128 users of back-to-back ReAct calls) and prints the throughput.

Every client at every load is an independent replay: they run side by side on
``--workers`` processes (default: one per core; 1: one by one; ray: on Ray), with the
same results.

    .venv/bin/python benchmarks/scheduling.py              # ~5 min; results/scheduling.json
    .venv/bin/python benchmarks/scheduling.py --knee       # ~80 s; results/scheduling_knee.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _harness import write_result

from agentrt.bench import BenchConfig, ClientResult, TraceOptions, run_bench, run_study
from agentrt.bench._parallel import parse_workers

# Arrival rates (jobs/s) from a sweep with the plain client (see docs/benchmarks.md).
RATES = {"80%": 0.25, "95%": 0.5, "overload": 2.0}
LIMITS = ("auto", "4", "16", "64")
KNEE_LIMITS = (1, 2, 4, 8, 16, 32, 64, 128)


def clients() -> list[str]:
    out = ["plain", "agentrt:fcfs+round_robin", "agentrt:fcfs+round_robin@auto"]
    for policy in ("plas", "mlfq"):
        out += [f"agentrt:{policy}+round_robin@{n}" for n in LIMITS]
        out.append(f"agentrt:{policy}+round_robin,priority=on")
    return out


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))]


def row(label: str, rate: float, c: ClientResult, base: ClientResult) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for r in c.job_rows:
        if r["status"] == "ok":
            by_kind.setdefault(r["kind"], []).append(r["jct_s"])
    return {
        "load": label,
        "rate": rate,
        "client": c.client,
        "busy": c.utilization,
        "failed": c.failed,
        "jct_mean": c.jct["mean"],
        "jct_p50": c.jct["p50"],
        "jct_p99": c.jct["p99"],
        "mean_vs_plain": c.jct["mean"] / base.jct["mean"],
        "p99_vs_plain": c.jct["p99"] / base.jct["p99"],
        "stretch_p50": c.stretch["p50"] if c.stretch else None,
        "stretch_p90": c.stretch["p90"] if c.stretch else None,
        "react_jct_mean": _mean(by_kind.get("react", [])),
        "react_jct_p99": _p99(by_kind.get("react", [])),
        "long_jct_mean": _mean(by_kind.get("claude-code", [])),
        "long_jct_p99": _p99(by_kind.get("claude-code", [])),
        "call_p50": c.call_latency["p50"],
        "call_p99": c.call_latency["p99"],
        "ttft_p50": c.ttft["p50"] if c.ttft else None,
        "cache_hit": c.prefix_cache_hit_rate,
    }


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"  {'client':40} {'busy':>5} {'JCT mean':>8} {'x plain':>7} {'JCT p99':>8} "
        f"{'x plain':>7} {'str p50':>7} {'react mean':>10} {'react p99':>9} "
        f"{'long mean':>9} {'long p99':>8} {'call p99':>8}"
    )
    for r in rows:
        print(
            f"  {r['client']:40} {_f(r['busy'], '5.0%')} {r['jct_mean']:8.1f} "
            f"{r['mean_vs_plain']:7.2f} {r['jct_p99']:8.0f} {r['p99_vs_plain']:7.2f} "
            f"{_f(r['stretch_p50'], '7.2f')} {_f(r['react_jct_mean'], '10.1f')} "
            f"{_f(r['react_jct_p99'], '9.1f')} {_f(r['long_jct_mean'], '9.0f')} "
            f"{_f(r['long_jct_p99'], '8.0f')} {r['call_p99']:8.1f}"
        )


def knee(args: argparse.Namespace) -> int:
    names = [f"agentrt:fcfs@{n}" for n in KNEE_LIMITS]
    cfg = BenchConfig(
        workload="react",
        jobs=400,
        users=128,
        tool_wait_s=0.0,
        replicas=1,
        clients=names,
        stretch=False,
        api="http",
    )
    result = run_bench(cfg, workers=args.workers)
    print(f"one replica, 128 closed-loop users, {result.calls} calls, {result.wall_s:.0f} s wall")
    print(f"  {'limit':>6} {'calls/s':>8} {'vs max':>6} {'call p50 (s)':>12}")
    best = max(c.jobs_per_s for c in result.clients)
    rows = []
    for n, c in zip(KNEE_LIMITS, result.clients, strict=True):
        calls_s = c.jobs_per_s * result.calls / c.jobs
        rows.append({"limit": n, "calls_per_s": calls_s, "vs_max": c.jobs_per_s / best})
        print(f"  {n:6d} {calls_s:8.2f} {c.jobs_per_s / best:6.0%} {c.call_latency['p50']:12.2f}")
    out = args.out.with_name("scheduling_knee.json")
    write_result(out, {"rows": rows}, __doc__)
    print(f"wrote {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--long-share", type=float, default=0.2)
    parser.add_argument("--token-scale", type=float, default=0.25)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--loads", nargs="*", default=list(RATES), choices=list(RATES))
    parser.add_argument("--knee", action="store_true", help="sweep the concurrency limit")
    parser.add_argument("--out", type=Path, default=Path("results/scheduling.json"))
    parser.add_argument(
        "--workers",
        type=parse_workers,
        default="auto",
        help="processes for the replays: auto (one per core), N (1: one by one) or ray",
    )
    args = parser.parse_args()
    if args.knee:
        return knee(args)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    configs = [
        BenchConfig(
            workload="mixed-cc",
            jobs=args.jobs,
            rate=RATES[label],
            replicas=args.replicas,
            clients=clients(),
            stretch=True,
            long_share=args.long_share,
            traces=TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait),
            api="http",
        )
        for label in args.loads
    ]
    # Every client at every load replays on its own cluster: all of them side by side.
    results = run_study(configs, workers=args.workers)
    for label, result in zip(args.loads, results, strict=True):
        rate = RATES[label]
        base = result.clients[0]
        these = [row(label, rate, c, base) for c in result.clients]
        rows += these
        print(
            f"{label} (rate {rate}/s), {args.jobs} jobs, {result.calls} calls per client, "
            f"done {result.wall_s:.0f} s into the study"
        )
        print_rows(these)
    write_result(args.out, {"jobs": args.jobs, "rows": rows}, __doc__)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
