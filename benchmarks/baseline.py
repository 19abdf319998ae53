"""Baseline: the plain client against agentrt on the Claude Code replay, by load.

The 710 Claude Code sessions (or the first --jobs of them) replay on an embedded cluster
of 8 simulated H100-class replicas, in virtual time, with Poisson arrivals at rates that
keep the cluster about 50%, 80% and 95% busy (busy: the replicas' mean busy fraction over
the second half of the arrivals). Each client sees the identical workload on a fresh
cluster.

    .venv/bin/python benchmarks/baseline.py --out results/baseline.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agentrt.bench import BenchConfig, TraceOptions, run_bench

# Arrival rates (jobs/s) found by a sweep with the plain client (see docs/benchmarks.md).
RATES = {"50%": 0.035, "80%": 0.065, "95%": 0.2}
CLIENTS = ("plain", "agentrt:round-robin", "agentrt:session")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--token-scale", type=float, default=0.25)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("results/baseline.json"))
    args = parser.parse_args()
    rows = []
    started = time.perf_counter()
    for label, rate in RATES.items():
        cfg = BenchConfig(
            workload="claude-code",
            jobs=args.jobs,
            rate=rate,
            replicas=args.replicas,
            clients=CLIENTS,
            stretch=True,
            traces=TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait),
            api="http",
        )
        result = run_bench(cfg)
        for c in result.clients:
            row = {
                "target": label,
                "rate": rate,
                "client": c.client,
                "busy": c.utilization,
                "jct_mean": c.jct["mean"],
                "jct_p50": c.jct["p50"],
                "jct_p90": c.jct["p90"],
                "jct_p99": c.jct["p99"],
                "stretch_p50": c.stretch["p50"] if c.stretch else None,
                "stretch_p90": c.stretch["p90"] if c.stretch else None,
                "call_p50": c.call_latency["p50"],
                "call_p99": c.call_latency["p99"],
                "ttft_p50": c.ttft["p50"] if c.ttft else None,
                "cache_hit": c.prefix_cache_hit_rate,
                "imbalance": c.load_imbalance,
                "failed": c.failed,
            }
            rows.append(row)
        print(
            f"{label} busy (rate {rate}/s), {result.calls} calls per client, "
            f"{result.wall_s:.0f} s wall"
        )
        print(
            f"  {'client':22} {'busy':>5} {'JCT p50':>8} {'JCT p90':>8} {'stretch p50':>11} "
            f"{'call p50':>8} {'cache hit':>9}"
        )
        for r in rows[-len(CLIENTS) :]:
            print(
                f"  {r['client']:22} {r['busy']:5.0%} {r['jct_p50']:8.0f} {r['jct_p90']:8.0f} "
                f"{r['stretch_p50']:11.2f} {r['call_p50']:8.2f} {r['cache_hit']:9.1%}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"jobs": args.jobs, "rows": rows}, indent=1))
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
