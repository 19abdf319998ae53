"""agentrt with, and against, vLLM's router (vllm-project/router 0.1.17) on the same work.

A slice of the Claude Code traces (the first --jobs traces whose cut fits the replicas'
context, each session cut to its first --calls steps, sub-agents included; tokens
x--token-scale, think and tool waits x--time-scale, each capped at --max-wait s) arrives
as a Poisson stream (--rate jobs/s) and is replayed by six clients, each on a fresh router
and empty prefix caches:

1. ``plain > router cache_aware``: a bare openai client, the router's default policy;
2. ``plain > router round_robin``;
3. ``agentrt > router consistent_hash``: agentrt with the ``vllm-router-agentic`` dialect
   (X-Session-ID and ``vllm_xargs.agentic_context``);
4. ``agentrt > router kv_aware``: the same, ``--kv-aware-session-affinity-ttl-secs 300``;
5. ``agentrt > router programs``: the same, ``--enable-program-scheduling`` (policy
   consistent_hash);
6. ``agentrt direct``: agentrt straight to the replicas, its own session-affinity routing
   (dialect ``vllm``), no router.

agentrt's sessions learn each tool's wait (its default), so their later calls carry the
expected idle (``kv_retention_ttl_seconds`` for the router). Each client runs --runs
times, in alternating order (1..6, 6..1, ...). Reported per client (medians over its
runs): job completion time (JCT) mean/p50/p90, call latency p50/p90, the cached share of
prompt tokens (the replicas' own prefix-cache counters: hit / queried tokens), and JCT and
latency as ratios to ``plain > router cache_aware``.

Two engines (--engine; defaults in DEFAULTS):

- ``vllm``: two vLLM CPU replicas (the tiny model, one core each, dev mode to empty the
  prefix cache between runs) behind the router; needs ``bash scripts/engine_setup.sh``;
- ``sim``: ``agentrt sim serve --replicas 4 --preset cpu-tiny`` (the embedded engine with
  the tiny model's fitted costs, in wall-clock time, restarted for each run) behind the
  same router: a cluster larger than this machine can run vLLM at.

    python -m benchmarks routing router --engine vllm   # results/router_vllm.json
    python -m benchmarks routing router --engine sim    # results/router_sim.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentrt.bench import (
    Arrivals,
    Call,
    Fanout,
    JobPlan,
    Prompts,
    SessionPlan,
    TraceOptions,
    make_workload,
    replay,
)
from agentrt.testing.vllm_cpu import (
    ROUTER_SETUP_MESSAGE,
    SETUP_MESSAGE,
    ReplicaServer,
    ReplicaSpec,
    RouterSpec,
    find_engine,
    find_router,
    launch,
    parse_prometheus,
    start_router,
)

from ._harness import add_run_args, write_result

BASELINE = "plain > router cache_aware"
DEFAULTS: dict[str, dict[str, float]] = {
    # Jobs, arrival rate (jobs/s), token and time scales of the traces, per engine: a load
    # that keeps the plain client's replicas busy, in about a minute per client and run.
    "vllm": {"jobs": 16, "rate": 0.8, "token_scale": 0.01, "time_scale": 0.03},
    "sim": {"jobs": 48, "rate": 4.0, "token_scale": 0.02, "time_scale": 0.03},
}


@dataclass(frozen=True)
class Client:
    name: str
    spec: str
    """agentrt.bench client spec (``plain`` or ``agentrt:...``)."""
    router: RouterSpec | None
    """The router in front of the replicas; None: straight to the replicas."""


AGENTIC = "agentrt:dialect=vllm-router-agentic"
CLIENTS = (
    Client(BASELINE, "plain", RouterSpec(policy="cache_aware")),
    Client("plain > router round_robin", "plain", RouterSpec(policy="round_robin")),
    Client("agentrt > router consistent_hash", AGENTIC, RouterSpec(policy="consistent_hash")),
    Client(
        "agentrt > router kv_aware",
        AGENTIC,
        RouterSpec(policy="kv_aware", kv_affinity_ttl_s=300),
    ),
    Client(
        "agentrt > router programs",
        AGENTIC,
        RouterSpec(policy="consistent_hash", program_scheduling=True),
    ),
    Client("agentrt direct", "agentrt:session,dialect=vllm", None),
)


# -- the workload --------------------------------------------------------------------------


def _cut(plan: SessionPlan, steps: int) -> SessionPlan:
    out: list[Call | Fanout] = []
    for step in plan.steps[:steps]:
        if isinstance(step, Fanout):
            step = Fanout(tuple(_cut(s, steps) for s in step.sessions))
        out.append(step)
    return SessionPlan(plan.name, tuple(out))


def workload(args: argparse.Namespace) -> list[JobPlan]:
    traces = TraceOptions(
        token_scale=args.token_scale, time_scale=args.time_scale, max_wait_s=args.max_wait
    )
    # The first traces whose cut fits the replicas' context (--max-model-len), in order.
    plans: list[JobPlan] = []
    pool = make_workload("claude-code", 4 * args.jobs, Arrivals(), seed=args.seed, traces=traces)
    for plan in pool:
        cut = dataclasses.replace(plan, root=_cut(plan.root, args.calls))
        if max(c.prompt_tokens + c.output_tokens for c in _calls(cut)) < args.max_model_len:
            plans.append(cut)
        if len(plans) == args.jobs:
            break
    rng, t, out = random.Random(args.seed), 0.0, []
    for plan in plans:  # Poisson arrivals, the first at 0
        out.append(dataclasses.replace(plan, arrival_s=t))
        t += rng.expovariate(args.rate)
    return out


def _calls(plan: JobPlan) -> list[Call]:
    calls: list[Call] = []

    def walk(s: SessionPlan) -> None:
        for step in s.steps:
            if isinstance(step, Call):
                calls.append(step)
            else:
                for sub in step.sessions:
                    walk(sub)

    walk(plan.root)
    return calls


def describe(plans: Sequence[JobPlan]) -> dict[str, Any]:
    calls = [c for p in plans for c in _calls(p)]
    prompt = sorted(c.prompt_tokens for c in calls)
    return {
        "jobs": len(plans),
        "calls": len(calls),
        "tool_waits": sum(1 for c in calls if c.tool and c.wait_s),
        "prompt_tokens_p50": prompt[len(prompt) // 2],
        "prompt_tokens_max": prompt[-1],
        "output_tokens_mean": statistics.fmean(c.output_tokens for c in calls),
        "wait_s_mean": statistics.fmean(c.wait_s for c in calls),
        "arrivals_span_s": max(p.arrival_s for p in plans),
    }


# -- the engines ---------------------------------------------------------------------------


def _get(url: str, timeout: float = 5.0) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine:
    """Replicas behind one interface: worker roots, base URLs, counters, a clean cache."""

    roots: list[str]
    model: str
    prompts: Literal["sim", "text"]
    """How calls are written (``Prompts``): words for a real tokenizer, or the
    embedded engine's block markers."""

    def base_urls(self) -> list[str]:
        return [r + "/v1" for r in self.roots]

    def counters(self) -> list[dict[str, float]]:
        return [parse_prometheus(_get(r + "/metrics")) for r in self.roots]

    def fresh(self) -> None:
        """Empty every prefix cache before a run."""
        raise NotImplementedError


class VllmEngine(Engine):
    def __init__(self, replicas: list[ReplicaServer]) -> None:
        self.replicas = replicas
        self.roots = [r.url for r in replicas]
        self.model = replicas[0].model
        self.prompts = "text"

    def fresh(self) -> None:
        for r in self.replicas:
            r.reset_prefix_cache()


class SimEngine(Engine):
    """``agentrt sim serve`` in a process of its own, restarted for each run."""

    def __init__(self, replicas: int, log: Path) -> None:
        self.n = replicas
        self.model = "tiny-llama"
        self.prompts = "sim"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.roots = []

    def fresh(self) -> None:
        self.stop()
        port = _free_port()
        cmd = [sys.executable, "-m", "agentrt", "sim", "serve", "--replicas", str(self.n)]
        cmd += ["--port", str(port), "--preset", "cpu-tiny"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.roots = [f"http://127.0.0.1:{port}/replica-{i}" for i in range(self.n)]
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                _get(f"http://127.0.0.1:{port}/health", timeout=1.0)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"agentrt sim serve did not start; see {self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None


@contextlib.contextmanager
def engine_for(args: argparse.Namespace, log_dir: Path) -> Iterator[Engine]:
    if args.engine == "sim":
        sim = SimEngine(args.sim_replicas, log_dir / "sim-serve.log")
        try:
            yield sim
        finally:
            sim.stop()
        return
    if find_engine() is None:
        raise SystemExit(SETUP_MESSAGE)
    specs = [
        ReplicaSpec(
            name=f"r{i}",
            cpu_bind=str(i % 2),
            dev_mode=True,  # POST /reset_prefix_cache between runs
            num_gpu_blocks=args.gpu_blocks,
            max_model_len=args.max_model_len,
            kv_cache_space_gib=1,
        )
        for i in range(2)
    ]
    with launch(specs, log_dir=log_dir) as replicas:
        yield VllmEngine(replicas)


# -- one run of one client -----------------------------------------------------------------


def run_one(
    client: Client, engine: Engine, plans: list[JobPlan], router_bin: Path, log_dir: Path
) -> dict[str, Any]:
    engine.fresh()
    router = None
    if client.router is not None:
        router = start_router(client.router, engine.roots, binary=router_bin, log_dir=log_dir)
        urls = [router.base_url]
    else:
        urls = engine.base_urls()
    try:
        before = engine.counters()
        result = replay(
            plans, urls, client.spec, model=engine.model, prompts=Prompts(engine.prompts)
        )
        after = engine.counters()
        scheduling = program_scheduling_counts(router) if router is not None else {}
    finally:
        if router is not None:
            router.stop()

    def delta(key: str) -> list[float]:
        return [a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True)]

    queries, hits = (
        sum(delta("vllm:prefix_cache_queries_total")),
        sum(delta("vllm:prefix_cache_hits_total")),
    )
    load = [
        p + g
        for p, g in zip(
            delta("vllm:prompt_tokens_total"), delta("vllm:generation_tokens_total"), strict=True
        )
    ]
    return {
        "client": client.name,
        "jobs": result.jobs,
        "failed": result.failed,
        "errors": sorted({row["status"] for row in result.job_rows if row["status"] != "ok"}),
        "makespan_s": result.makespan_s,
        "jct_mean": result.jct["mean"],
        "jct_p50": result.jct["p50"],
        "jct_p90": result.jct["p90"],
        "latency_p50": result.call_latency["p50"],
        "latency_p90": result.call_latency["p90"],
        "cached_share": hits / queries if queries else math.nan,
        "load_share_max": max(load) / sum(load) if sum(load) else math.nan,
        "router_scheduling": scheduling,
    }


_SAMPLE = re.compile(r"^(vllm_router_agent_aware_[a-z_]+)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$")
_REASON = re.compile(r'(?:reason|transition)="([^"]*)"')


def program_scheduling_counts(router: Any) -> dict[str, Any]:
    """What the router's program scheduler did in a run, from its own /metrics: requests
    held in its RequestPool (count, total and mean seconds) and its transitions by reason
    (admit, pause, force_resume, ...). Empty without program scheduling."""
    try:
        text = router.metrics_text()
    except (OSError, RuntimeError):
        return {}
    wait_sum = wait_count = 0.0
    transitions: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or m.group(3) == "NaN":
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm_router_agent_aware_queue_wait_seconds_sum":
            wait_sum += value
        elif name == "vllm_router_agent_aware_queue_wait_seconds_count":
            wait_count += value
        elif name == "vllm_router_agent_aware_transitions_total":
            reason = _REASON.search(labels)
            key = reason.group(1) if reason else "?"
            transitions[key] = transitions.get(key, 0.0) + value
    if not wait_count and not transitions:
        return {}
    return {
        "pool_requests": wait_count,
        "pool_wait_s": wait_sum,
        "pool_wait_mean_s": wait_sum / wait_count if wait_count else 0.0,
        "transitions": transitions,
    }


# -- the comparison ------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("jct_mean", "jct_p50", "jct_p90", "latency_p50", "latency_p90", "cached_share")
    rows = []
    for client in CLIENTS:
        mine = [r for r in runs if r["client"] == client.name]
        row: dict[str, Any] = {"client": client.name, "runs": len(mine)}
        for k in keys:
            row[k] = statistics.median(r[k] for r in mine)
        row["failed"] = sum(r["failed"] for r in mine)
        rows.append(row)
    base = rows[0]
    for row in rows:
        for k in ("jct_mean", "jct_p50", "jct_p90", "latency_p50"):
            row[f"{k}_ratio"] = row[k] / base[k] if base[k] else math.nan
        row["cached_points"] = 100 * (row["cached_share"] - base["cached_share"])
    return rows


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The goals, checked: agentrt > router JCT mean at most 0.85x the best plain
    > router policy's, with a cached share 15 points higher or more; agentrt direct within
    5% of the best agentrt > router JCT mean."""
    by = {r["client"]: r for r in rows}
    plain = min((r for r in rows if r["client"].startswith("plain")), key=lambda r: r["jct_mean"])
    routed = [r for r in rows if r["client"].startswith("agentrt >")]
    best = min(routed, key=lambda r: r["jct_mean"])
    out: dict[str, Any] = {"best_plain": plain["client"], "best_agentrt_router": best["client"]}
    for r in routed:
        out[r["client"]] = {
            "jct_vs_best_plain": r["jct_mean"] / plain["jct_mean"],
            "cached_points_vs_best_plain": 100 * (r["cached_share"] - plain["cached_share"]),
        }
    direct = by["agentrt direct"]
    out["agentrt direct"] = {"jct_vs_best_agentrt_router": direct["jct_mean"] / best["jct_mean"]}
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The rows in 80 columns: JCT (s), call latency p50 (s), cached share, JCT ratio."""
    lines = [
        f"{'client':33} {'JCT mean':>8} {'p50':>6} {'p90':>6} {'lat p50':>7} "
        f"{'cached':>6} {'x base':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['client']:33} {r['jct_mean']:8.2f} {r['jct_p50']:6.2f} {r['jct_p90']:6.2f} "
            f"{r['latency_p50']:7.3f} {r['cached_share']:6.1%} {r['jct_mean_ratio']:6.2f}"
        )
    return "\n".join(lines)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    parser.add_argument("--jobs", type=int, default=None, help="default: see DEFAULTS")
    parser.add_argument("--calls", type=int, default=8, help="steps kept per session")
    parser.add_argument("--rate", type=float, default=None, help="jobs/s")
    parser.add_argument("--token-scale", type=float, default=None)
    parser.add_argument("--time-scale", type=float, default=None)
    parser.add_argument("--max-wait", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--sim-replicas", type=int, default=4)
    parser.add_argument("--gpu-blocks", type=int, default=96, help="vLLM KV blocks (128 tokens)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--only", default=None, help="comma-separated client numbers (1-6)")
    add_run_args(parser, out="", seed=0)


def main(args: argparse.Namespace) -> None:
    for key, value in DEFAULTS[args.engine].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = args.out or Path("results") / f"router_{args.engine}.json"
    router_bin = find_router()
    if router_bin is None:
        raise SystemExit(ROUTER_SETUP_MESSAGE)
    plans = workload(args)
    shape = describe(plans)
    print(f"workload: {json.dumps(shape)}", flush=True)
    clients = list(CLIENTS)
    if args.only:
        clients = [CLIENTS[int(i) - 1] for i in args.only.split(",")]
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrt-router-bench-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    with engine_for(args, log_dir) as engine:
        for n in range(args.runs):
            order = clients if n % 2 == 0 else clients[::-1]
            for client in order:
                r = run_one(client, engine, plans, router_bin, log_dir)
                r["run"] = n
                runs.append(r)
                print(
                    f"run {n} {client.name:34} JCT mean {r['jct_mean']:6.2f} s  "
                    f"cached {r['cached_share']:6.1%}  failed {r['failed']}",
                    flush=True,
                )
                if r["router_scheduling"]:
                    print(f"  router scheduling: {json.dumps(r['router_scheduling'])}")
    rows = summarize(runs) if not args.only else []
    checked = goals(rows) if rows else {}
    wall = time.monotonic() - started
    result = {
        "engine": args.engine,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workload": shape,
        "router": "vllm-router 0.1.17",
        "wall_s": wall,
        "runs": runs,
        "rows": rows,
        "goals": checked,
    }
    write_result(out, result, __doc__)
    if rows:
        print(table(rows))
        print(json.dumps(checked, indent=1))
    print(f"wrote {out} ({wall:.0f} s)")
