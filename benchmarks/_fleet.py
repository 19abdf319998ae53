"""Fleets in virtual time: K independent runtimes on one embedded cluster.

Each configuration replays the same jobs with every client as a fleet of K members
(``agentrt bench --fleet K``: each member its own Runtime, jobs dealt round-robin by
arrival; plain members round-robin from a random replica each). Prints one table per
workload and writes every figure to a JSON file.

    python -m benchmarks fleet twin                                  # the full grid
    python -m benchmarks fleet twin --workloads coding --fleets 1 16 --out /tmp/f.json

Workloads: ``coding`` at the demo's setting (32 jobs, 0.2 jobs/s, 8 replicas,
16,384 blocks each), ``coding-0.4`` (the same at 0.4 jobs/s) and ``claude-code`` (150
Claude Code replays, 8 replicas, 0.1 jobs/s; needs ../shared/traces).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict
from typing import Any

from agentrt.bench import BenchConfig, run_study

from ._harness import add_run_args, write_result

CLIENTS = ("plain", "agentrt:defaults", "agentrt:session", "agentrt:hash")
"""The plain fleet, Runtime's defaults, session routing without polls (the fallback
where engines serve no metrics) and bounded-load hashing."""

WORKLOADS: dict[str, dict[str, Any]] = {
    "coding": {"workload": "coding", "jobs": 32, "rate": 0.2, "gpu_blocks": 16384},
    "coding-0.4": {"workload": "coding", "jobs": 32, "rate": 0.4, "gpu_blocks": 16384},
    "claude-code": {"workload": "claude-code", "jobs": 150, "rate": 0.1},
}


def _row(client: dict[str, Any], plain: dict[str, Any] | None) -> dict[str, Any]:
    busy = [r["busy_s"] for r in client["replicas"]]
    calls = [r["calls"] for r in client["replicas"]]
    mean_busy = statistics.fmean(busy) if busy else 0.0
    mean_calls = statistics.fmean(calls) if calls else 0.0
    ratio = None
    if plain is not None and plain["jct"]["mean"] > 0:
        ratio = client["jct"]["mean"] / plain["jct"]["mean"]
    return {
        "client": client["client"],
        "jct_mean": client["jct"]["mean"],
        "jct_p50": client["jct"]["p50"],
        "jct_p90": client["jct"]["p90"],
        "ttft_p50": (client["ttft"] or {}).get("p50"),
        "cache_hit": client["prefix_cache_hit_rate"],
        "busy_imbalance": max(busy) / mean_busy if mean_busy else None,
        "call_imbalance": max(calls) / mean_calls if mean_calls else None,
        "first_turns": [r["first_turns"] for r in client["replicas"]],
        "vs_plain": ratio,
        "failed": client["failed"],
    }


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--workloads",
        nargs="+",
        default=list(WORKLOADS),
        choices=list(WORKLOADS),
        metavar="NAME",
        help=f"of {', '.join(WORKLOADS)} (default: all)",
    )
    ap.add_argument("--fleets", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS))
    add_run_args(ap, out="fleet.json", seed=0, workers="2")


def main(args: argparse.Namespace) -> int:
    configs: list[tuple[str, int, BenchConfig]] = []
    for name in args.workloads:
        for k in args.fleets:
            cfg = BenchConfig(
                **WORKLOADS[name],
                seed=args.seed,
                replicas=8,
                clients=tuple(args.clients),
                stretch=False,
                api="http",
                fleet=k,
            )
            configs.append((name, k, cfg))
    started = time.perf_counter()
    results = run_study([c for _, _, c in configs], workers=args.workers)
    wall = time.perf_counter() - started
    out: dict[str, Any] = {"wall_s": wall, "seed": args.seed, "runs": []}
    for (name, k, _cfg), result in zip(configs, results, strict=True):
        clients = [asdict(c) for c in result.clients]
        plain = next((c for c in clients if c["client"] == "plain"), None)
        rows = [_row(c, plain) for c in clients]
        out["runs"].append({"workload": name, "fleet": k, "config": result.config, "rows": rows})
    for name in args.workloads:
        print(f"\n{name} (seed {args.seed}; JCT in s; x plain: JCT mean over the plain fleet's)")
        print(
            f"{'K':>3} {'client':<17} {'mean':>7} {'p50':>7} {'p90':>7} {'ttft':>6} "
            f"{'hit':>4} {'busy':>5} {'calls':>5} {'x plain':>7}"
        )
        for run in out["runs"]:
            if run["workload"] != name:
                continue
            for r in run["rows"]:
                ttft = "-" if r["ttft_p50"] is None else f"{r['ttft_p50']:.2f}"
                ratio = "-" if r["vs_plain"] is None else f"{r['vs_plain']:.2f}"
                print(
                    f"{run['fleet']:>3} {r['client'][:17]:<17} {r['jct_mean']:>7.1f} "
                    f"{r['jct_p50']:>7.1f} {r['jct_p90']:>7.1f} {ttft:>6} "
                    f"{100 * (r['cache_hit'] or 0):>3.0f}% {r['busy_imbalance'] or 0:>5.2f} "
                    f"{r['call_imbalance'] or 0:>5.2f} {ratio:>7}"
                )
    print(f"\nwall {wall:.0f} s; results: {args.out}")
    write_result(args.out, out, __doc__)
    return 0
