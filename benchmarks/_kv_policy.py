"""KV policies for tool waits: what the engine does with a waiting session's KV.

Two workloads on an embedded cluster of 2 simulated H100-class replicas (``h100-8b`` cost
model) whose KV capacity is cut so that memory is the bottleneck, in virtual time:

- ``react-longtail``: ReAct loops of 6-20 turns over five tools with their own lognormal
  waits (read_file 0.5 s ... web_research 150 s median), large tool results;
- ``claude-code``: the first N Claude Code traces (one tool name: the traces carry none),
  tokens scaled by ``--token-scale``, waits capped at ``--max-wait``.

Each engine policy (``EngineConfig.tool_wait_policy``) replays the identical seeded jobs
and arrivals through agentrt with session routing:

- ``lru``, no declarations (``declare=none``): the baseline (today's engines), with the
  same host tier, plus ``lru`` without a host tier for reference;
- ``pin``, ``offload``, ``drop``, ``adaptive`` and ``resume`` (where the engine has them),
  each with ``declare=learned`` (the runtime's per-tool learned waits) and
  ``declare=oracle`` (the exact next tool wait, declared before the call it follows);
  ``resume`` also with ``declare=none`` (what it does without declarations: LRU, with the
  prefixes of queued requests evicted last).

With ``--final-drop``, also ``EngineConfig.final_policy="drop"`` (free a session's own KV
when its declared last call ends; the oracle declares it): ``lru`` and each policy with
``declare=oracle`` again under it (labelled ``+final``), beside ``lru`` with
``declare=oracle`` under the default ``final_policy="lru"``. ``--policies`` runs a subset.

Per configuration: JCT mean/p50/p99 and their ratio to the baseline, the hit rate of calls
that resume a session after a tool wait, host-tier traffic, KV occupancy, and the gap
between learned and oracle declarations.

Every configuration is an independent replay: they run side by side on ``--workers``
processes (default: one per core; 1: one by one; ray: on Ray), with the same results.

    python -m benchmarks kv              # ~4 min; results/kv_policy.json
    python -m benchmarks kv --workloads react-longtail --loads base
    python -m benchmarks kv --workloads react-longtail --loads heavy \
        --policies pin --final-drop
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from agentrt.bench import (
    Arrivals,
    BenchConfig,
    BenchResult,
    Call,
    ClientResult,
    SessionPlan,
    TraceOptions,
    make_workload,
    run_study,
)
from agentrt.sim import EngineConfig

from ._harness import add_run_args, write_result

# Arrival rates (jobs/s) per workload: "base" keeps the lru baseline memory-bound without
# collapsing, "heavy" is the load where pinning loses (see docs/benchmarks.md).
RATES = {
    "react-longtail": {"base": 0.4, "heavy": 1.6},
    "claude-code": {"base": 0.05, "heavy": 0.2},
}
JOBS = {"react-longtail": 200, "claude-code": 100}
GPU_BLOCKS = 8192
"""KV blocks per replica (16 tokens each: 131k tokens, about a third of what an 80 GB
H100 holds for Llama-3.1-8B)."""
HOST_BLOCKS = 4 * GPU_BLOCKS
POLICIES = ("pin", "offload", "drop", "adaptive", "resume")
BASELINE = "agentrt:session,declare=none"
ORACLE = "agentrt:session,declare=oracle"
NO_HOST = "lru, no host tier"


def has_policy(name: str, host: int) -> bool:
    """The engine knows policy ``name`` and accepts it with ``host`` host-tier blocks."""
    try:
        EngineConfig(tool_wait_policy=name, num_host_blocks=host)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class KVBenchConfig(BenchConfig):
    """A bench run whose embedded replicas also get ``final_policy``."""

    final_policy: str = "lru"

    def engine_config(self) -> EngineConfig:
        return BenchConfig.engine_config(self).replace(final_policy=self.final_policy)


def configs(
    host: int, policies: tuple[str, ...] = POLICIES, final_drop: bool = False
) -> list[tuple[str, str, int, list[str], str]]:
    """(label, engine policy, host blocks, clients, final policy) per run."""
    both = [f"agentrt:session,declare={d}" for d in ("learned", "oracle")]
    known = [p for p in policies if has_policy(p, host)]
    out = [("lru", "lru", host, [BASELINE, ORACLE] if final_drop else [BASELINE], "lru")]
    if host:
        out.append((NO_HOST, "lru", 0, [BASELINE], "lru"))
    out += [(p, p, host, both, "lru") for p in known]
    if "resume" in known:  # without declarations: LRU, queued prefixes last
        out[-1] = ("resume", "resume", host, [BASELINE, *both], "lru")
    if final_drop:
        out += [(f"{p} +final", p, host, [ORACLE], "drop") for p in ("lru", *known)]
    return out


def _waits(session: SessionPlan) -> float:
    """A session's waits on its critical path (a fan-out waits for its longest branch)."""
    return sum(
        s.wait_s if isinstance(s, Call) else max(_waits(x) for x in s.sessions)
        for s in session.steps
    )


def wait_floor(workload: str, rate: float, args: argparse.Namespace) -> float:
    """Mean over the jobs of their tool and think waits: no KV policy gets JCT below it."""
    plans = make_workload(
        workload,
        args.jobs or JOBS[workload],
        Arrivals(rate, args.seed),
        seed=args.seed,
        traces=TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait),
    )
    return sum(_waits(p.root) for p in plans) / len(plans)


def bench_config(
    workload: str,
    rate: float,
    args: argparse.Namespace,
    policy: str,
    host: int,
    clients: list[str],
    final: str = "lru",
) -> BenchConfig:
    return KVBenchConfig(
        workload=workload,
        jobs=args.jobs or JOBS[workload],
        rate=rate,
        seed=args.seed,
        replicas=2,
        clients=clients,
        stretch=False,
        api="http",
        traces=TraceOptions(token_scale=args.token_scale, max_wait_s=args.max_wait),
        tool_wait_policy=policy,
        gpu_blocks=args.gpu_blocks,
        host_blocks=host,
        final_policy=final,
    )


def row(workload: str, load: str, rate: float, label: str, c: ClientResult) -> dict[str, Any]:
    kv = c.kv or {}
    waits = c.waits or {}
    return {
        "workload": workload,
        "load": load,
        "rate": rate,
        "policy": label,
        "declare": c.client.rpartition("declare=")[2],
        "failed": c.failed,
        "busy": c.utilization,
        "jct_mean": c.jct["mean"],
        "jct_p50": c.jct["p50"],
        "jct_p99": c.jct["p99"],
        "hit_rate": c.prefix_cache_hit_rate,
        "resumed_hit_rate": c.resumed_hit_rate,
        "kv_used_mean": kv.get("occupancy_mean"),
        "kv_used_peak": kv.get("occupancy_peak"),
        "kv_cached_mean": kv.get("cached_mean"),
        "preemptions": kv.get("preemptions"),
        "evicted_blocks": kv.get("evicted_blocks"),
        "host_out_blocks": kv.get("offloaded_blocks"),
        "host_in_blocks": kv.get("loaded_blocks"),
        "host_hit_tokens": kv.get("host_cache_hits"),
        "prefetches": kv.get("prefetches"),
        "prefetched_blocks": kv.get("prefetched_blocks"),
        "kv_counters": kv,
        "wait_expected_share": waits.get("expected_share"),
        "wait_rel_error_median": waits.get("rel_error_median"),
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = next(r for r in rows if r["policy"] == "lru" and r["declare"] == "none")
    nohost = next((r for r in rows if r["policy"] == NO_HOST), base)
    oracle = {r["policy"]: r for r in rows if r["declare"] == "oracle"}
    for r in rows:
        r["mean_vs_base"] = r["jct_mean"] / base["jct_mean"]
        r["p99_vs_base"] = r["jct_p99"] / base["jct_p99"]
        r["goal_met"] = r["mean_vs_base"] <= 0.75 and r["p99_vs_base"] <= 1.0
        r["mean_vs_no_host"] = r["jct_mean"] / nohost["jct_mean"]
        r["p99_vs_no_host"] = r["jct_p99"] / nohost["jct_p99"]
        o = oracle.get(r["policy"])
        r["learned_vs_oracle"] = (
            r["jct_mean"] / o["jct_mean"] if r["declare"] == "learned" and o else None
        )


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"  {'policy':18} {'declare':8} {'JCT mean':>8} {'x base':>6} {'p50':>7} {'p99':>7} "
        f"{'x base':>6} {'hit':>5} {'resumed':>7} {'KV used':>7} {'peak':>5} {'host out':>9} "
        f"{'host in':>8} {'cached':>6} {'preempt':>7} {'l/o':>5} {'x nohost':>8}"
    )
    for r in rows:
        print(
            f"  {r['policy']:18} {r['declare']:8} {r['jct_mean']:8.1f} {r['mean_vs_base']:6.2f} "
            f"{r['jct_p50']:7.1f} {r['jct_p99']:7.1f} {r['p99_vs_base']:6.2f} "
            f"{_f(r['hit_rate'], '5.0%')} {_f(r['resumed_hit_rate'], '7.0%')} "
            f"{_f(r['kv_used_mean'], '7.0%')} {_f(r['kv_used_peak'], '5.0%')} "
            f"{_f(r['host_out_blocks'], '9.0f')} {_f(r['host_in_blocks'], '8.0f')} "
            f"{_f(r['kv_cached_mean'], '6.0%')} "
            f"{_f(r['preemptions'], '7.0f')} {_f(r['learned_vs_oracle'], '5.2f')} "
            f"{r['mean_vs_no_host']:8.2f}"
        )


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", nargs="*", default=list(RATES), choices=list(RATES))
    parser.add_argument("--loads", nargs="*", default=["base", "heavy"])
    parser.add_argument("--rate", type=float, default=None, help="one rate instead of --loads")
    parser.add_argument("--jobs", type=int, default=None, help="default: 200 react, 100 traces")
    parser.add_argument("--token-scale", type=float, default=0.25, help="claude-code tokens")
    parser.add_argument("--max-wait", type=float, default=300.0, help="cap one wait, seconds")
    parser.add_argument("--gpu-blocks", type=int, default=GPU_BLOCKS, help="per replica")
    parser.add_argument(
        "--host-blocks", type=int, default=HOST_BLOCKS, help="per replica (0: no host tier)"
    )
    parser.add_argument(
        "--policies",
        nargs="*",
        default=list(POLICIES),
        choices=list(POLICIES),
        metavar="POLICY",
        help=f"a subset of {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--final-drop",
        action="store_true",
        help="also run final_policy=drop (lru and each policy, declare=oracle)",
    )
    add_run_args(parser, out="kv_policy.json", seed=0, workers="auto")


def main(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    started = time.perf_counter()
    groups = [
        (workload, load, rate)
        for workload in args.workloads
        for load, rate in (
            {"custom": args.rate} if args.rate else {k: RATES[workload][k] for k in args.loads}
        ).items()
    ]
    study = [
        (group, label, bench_config(group[0], group[2], args, policy, host, clients, final))
        for group in groups
        for label, policy, host, clients, final in configs(
            args.host_blocks, tuple(args.policies), args.final_drop
        )
    ]
    # Every configuration replays on its own clusters: all of them run side by side.
    outcomes = run_study([cfg for _, _, cfg in study], workers=args.workers, return_exceptions=True)
    for workload, load, rate in groups:
        these: list[dict[str, Any]] = []
        calls, wall = 0, 0.0
        for (group, label, _), outcome in zip(study, outcomes, strict=True):
            if group != (workload, load, rate):
                continue
            if not isinstance(outcome, BenchResult):  # an engine error: say so, the others ran
                exc: BaseException = outcome
                while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]
                error = f"{type(exc).__name__}: {exc}"
                failures.append(
                    {"workload": workload, "load": load, "policy": label, "error": error}
                )
                print(f"  {label}: FAILED ({error})")
                continue
            calls, wall = outcome.calls, max(wall, outcome.wall_s)
            these += [row(workload, load, rate, label, c) for c in outcome.clients]
        if these:
            add_ratios(these)
            floor = wait_floor(workload, rate, args)
            base = these[0]["jct_mean"]
            for r in these:
                r["wait_floor_s"] = floor
            rows += these
            print(
                f"{workload}, {load} load ({rate} jobs/s), {args.jobs or JOBS[workload]} jobs, "
                f"{calls} calls per configuration, done {wall:.0f} s into the study; waits "
                f"alone make {floor:.0f} s of the baseline's {base:.0f} s mean JCT (a policy "
                f"can cut at most {1 - floor / base:.0%})"
            )
            print_rows(these)
    setup = {
        "replicas": 2,
        "preset": "h100-8b",
        "gpu_blocks": args.gpu_blocks,
        "host_blocks": args.host_blocks,
        "token_scale": args.token_scale,
        "max_wait_s": args.max_wait,
        "seed": args.seed,
        "workers": args.workers,
        "policies": args.policies,
        "final_drop": args.final_drop,
    }
    write_result(args.out, {"setup": setup, "rows": rows, "failures": failures}, __doc__)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0
