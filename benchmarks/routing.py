"""Session routing: round_robin, least_loaded, hash and session_affinity on the Claude Code
replay, against the plain client.

The first --jobs Claude Code sessions replay as jobs on an embedded cluster of 8 simulated
H100-class replicas in virtual time (tokens scaled by 0.25 so the longest contexts fit the
modelled KV cache, think and tool waits capped at 30 s), Poisson arrivals at the rates that
keep the plain client's cluster about 80% and 95% busy (docs/benchmarks.md, baseline).
Every client replays the identical workload on a fresh cluster, side by side, with no
client-side cap (fcfs): only the routing differs.

The prefix-cache hit rate is compared with what the traces allow: the share of prompt
tokens that the previous turn of the same session already had as a prefix (whole 64-token
blocks, at most ``prompt - 1`` tokens per call, as the engine counts), computed exactly from
the replayed plans; and, for reference, the unscaled traces' share of prompt blocks shared
with the previous turn.

    .venv/bin/python benchmarks/routing.py        # ~6 min; writes results/routing.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _harness import write_result

from agentrt.bench import (
    Arrivals,
    BenchConfig,
    Call,
    JobPlan,
    SessionPlan,
    TraceOptions,
    make_workload,
    run_bench,
)

RATES = {"80%": 0.065, "95%": 0.2}
CLIENTS = (
    "plain",
    "agentrt:round_robin",
    "agentrt:least_loaded",
    "agentrt:hash",
    "agentrt:session_affinity",
)


def _sessions(plan: SessionPlan) -> Iterator[list[Call]]:
    """Each session's calls in order (sub-agents are sessions of their own)."""
    own: list[Call] = []
    for step in plan.steps:
        if isinstance(step, Call):
            own.append(step)
        else:
            for sub in step.sessions:
                yield from _sessions(sub)
    yield own


def _keys(call: Call) -> list[tuple[str, int]]:
    ns = call.namespace.replace("/", "_")
    return [("shared" if i < call.shared_blocks else ns, b) for i, b in enumerate(call.blocks)]


def _common(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def allowed_hit_rate(plans: list[JobPlan], block: int = 64) -> dict[str, float]:
    """Prompt tokens that hit if every turn finds its session's previous turn cached (and
    nothing else), over all prompt tokens; and the share of prompt blocks shared with the
    previous turn."""
    hit = total = shared_blocks = blocks = 0
    for plan in plans:
        for calls in _sessions(plan.root):
            prev: list[tuple[str, int]] = []
            for call in calls:
                keys = _keys(call)
                common = _common(prev, keys)
                hit += min(common * block, call.prompt_tokens - 1)
                total += call.prompt_tokens
                shared_blocks += common
                blocks += len(keys)
                prev = keys
    return {"token_hit_rate": hit / total, "block_share": shared_blocks / blocks}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--token-scale", type=float, default=0.25)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--loads", nargs="*", default=list(RATES), choices=list(RATES))
    parser.add_argument("--out", type=Path, default=Path("results/routing.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    traces = TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait)
    plans = make_workload("claude-code", args.jobs, Arrivals(), traces=traces)
    bound = allowed_hit_rate(plans)
    raw = allowed_hit_rate(make_workload("claude-code", 710, Arrivals()))
    print(
        f"allowed by the traces: replayed plans ({args.jobs} sessions, tokens x"
        f"{args.token_scale}) {bound['token_hit_rate']:.1%} of prompt tokens "
        f"({bound['block_share']:.1%} of blocks); all 710 unscaled traces "
        f"{raw['token_hit_rate']:.1%} of tokens ({raw['block_share']:.1%} of blocks)"
    )
    rows: list[dict[str, Any]] = []
    for label in args.loads:
        rate = RATES[label]
        cfg = BenchConfig(
            workload="claude-code",
            jobs=args.jobs,
            rate=rate,
            replicas=args.replicas,
            clients=CLIENTS,
            stretch=True,
            traces=traces,
            api="http",
        )
        result = run_bench(cfg)
        base = result.clients[0]
        these = []
        for c in result.clients:
            hit = c.prefix_cache_hit_rate
            these.append(
                {
                    "load": label,
                    "rate": rate,
                    "client": c.client,
                    "busy": c.utilization,
                    "failed": c.failed,
                    "cache_hit": hit,
                    "hit_vs_allowed": hit / bound["token_hit_rate"] if hit is not None else None,
                    "imbalance": c.load_imbalance,
                    "jct_p50": c.jct["p50"],
                    "jct_p99": c.jct["p99"],
                    "jct_p50_vs_plain": c.jct["p50"] / base.jct["p50"],
                    "jct_p99_vs_plain": c.jct["p99"] / base.jct["p99"],
                    "stretch_p50": c.stretch["p50"] if c.stretch else None,
                    "ttft_p50": c.ttft["p50"] if c.ttft else None,
                    "ttft_p99": c.ttft["p99"] if c.ttft else None,
                    "ttft_p50_vs_plain": (c.ttft["p50"] / base.ttft["p50"])
                    if c.ttft and base.ttft
                    else None,
                    "call_p50": c.call_latency["p50"],
                }
            )
        rows += these
        print(
            f"{label} (rate {rate}/s), {result.calls} calls per client, {result.wall_s:.0f} s wall"
        )
        print(
            f"  {'client':26} {'busy':>5} {'hit':>6} {'/allow':>6} {'imbal':>5} "
            f"{'JCT p50':>7} {'x':>5} {'JCT p99':>7} {'x':>5} {'TTFT p50':>8} {'x':>5} "
            f"{'TTFT p99':>8}"
        )
        for r in these:
            print(
                f"  {r['client']:26} {r['busy']:5.0%} {r['cache_hit']:6.1%} "
                f"{r['hit_vs_allowed']:6.1%} {r['imbalance']:5.2f} {r['jct_p50']:7.0f} "
                f"{r['jct_p50_vs_plain']:5.2f} {r['jct_p99']:7.0f} {r['jct_p99_vs_plain']:5.2f} "
                f"{r['ttft_p50']:8.3f} {r['ttft_p50_vs_plain']:5.2f} {r['ttft_p99']:8.2f}"
            )
    write_result(
        args.out,
        {"jobs": args.jobs, "allowed": bound, "raw": raw, "rows": rows},
        __doc__,
        indent=None,
    )
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
