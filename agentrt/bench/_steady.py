"""The steady-state benchmark: what a platform running agents near capacity sees.

A burst (every job arriving within seconds) measures how a cluster drains a backlog, not
the load it sustains. This benchmark measures throughput against latency at steady state,
for each client, in two ways (docs/benchmarks/steady.md):

- **closed loop**: N agents, each starting its next job when its last one ends, for each N
  of ``users`` (light load to past the knee). Each N gives a throughput (jobs/s finished in
  the measurement window) and the latency of the jobs measured;
- **open loop**: Poisson arrivals at ``loads`` times the measured capacity, where the
  capacity is the throughput at the knee of the closed-loop curve (the smallest N whose
  throughput reaches ``knee`` of the curve's highest; the best client's, so that every
  client meets the same offered load).

Jobs: ``jobs`` drawn with replacement (seeded) from the Claude Code traces that fit
``traces.max_context`` tokens (each copy its own conversation: the same trace drawn twice
shares only the system prompt every job shares), or generated (``coding``, any synthetic
workload). Warm-up and drain are left out of every figure. In start order, the warm-up
is the first ``max(ceil(warmup_share * jobs), N)`` jobs in closed loop (N agents start
together on cold caches) and the first ``ceil(warmup_share * jobs)`` in open loop; the
drain, in closed loop, is the last N jobs to start (once the last job has started fewer
than N agents remain, and the last jobs to start run largely in that thinner load); open
loop has none (jobs arrive as they would on). The measurement window runs from the first
measured job's start to the last one's; throughput is the jobs that end inside it over
its length (closed loop: N agents are busy throughout it).

Per point and client: JCT p50/p90/p99 and stretch p90 (JCT over the job's JCT alone on an
idle cluster) with percentile-bootstrap 90% intervals over the measured jobs, and the
stretch of the shortest and the longest third of them by their JCT alone
(``stretch_short``, ``stretch_long``); the prompt
tokens the engines computed (not found in their prefix cache or host tier) and their
prefix-cache hit rate over the whole replay (``engine_prefill_tokens``,
``engine_hit_rate``: every client has them), and the measured jobs' own uncached tokens
and hit rate from their replies where the client reads usage (agentrt; ``plain`` does not
ask for it); moves (calls that went to another endpoint than their session's
previous call; clients that see the endpoints only), the replicas' busy share. For ample
KV (the preset's) and under KV pressure (``pressure_blocks`` per replica).

Every replay is independent (its own cluster, its own virtual-time loop) and runs on the
bench's pool (:func:`~agentrt.bench._runner.run_parts`): with W workers a grid of R replays
takes about R / W replay times.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from .._stats import bootstrap_interval, quantile
from ._drivers import ClientSpec, JobResult
from ._parallel import Workers, check_workers
from ._plan import Call, Fanout, JobPlan, SessionPlan
from ._runner import ALONE, BenchConfig, ClientRun, PartResult, run_parts
from ._view import format_view
from ._workloads import Arrivals, TraceOptions, claude_code_jobs, make_workload

__all__ = [
    "DEFAULT_CLIENTS",
    "SteadyConfig",
    "format_table",
    "measure",
    "plot",
    "run_steady",
    "steady_jobs",
    "steady_study",
]

DEFAULT_CLIENTS: Final = (
    "plain",
    "plain>llm-d",
    "plain>llm-d:ideal",
    "plain>dynamo:affinity",
    "plain>vllm-router:cache_aware",
    "agentrt:defaults",
    "agentrt:defaults>llm-d",
)

Kv = Literal["ample", "pressure"]


@dataclass(slots=True)
class SteadyConfig:
    """One steady-state study, run by :func:`steady_study`: its jobs (``workload``,
    ``jobs``, ``seed``, ``traces``), ``clients`` (``agentrt bench`` client specs), the
    closed-loop ``users`` and open-loop ``loads``, and the cluster (``replicas`` of
    ``preset``, ample ``kv`` and/or KV pressure). docs/benchmarks/steady.md says what
    it measures; ``python -m benchmarks alternatives steady`` is its command line."""

    workload: str = "claude-code"
    jobs: int = 500
    seed: int = 0
    clients: Sequence[str] = DEFAULT_CLIENTS
    users: Sequence[int] = (4, 8, 16, 24, 32, 48, 64)
    """Closed loop: the numbers of concurrent agents."""
    loads: Sequence[float] = (0.25, 0.5, 0.75, 1.0)
    """Open loop: Poisson arrival rates as fractions of the measured capacity."""
    kv: Sequence[Kv] = ("ample", "pressure")
    pressure_blocks: int | None = None
    """KV blocks per replica under pressure; None: a quarter of the preset's."""
    host_blocks: int | None = None
    """KV blocks in each replica's host tier (CPU offload); None: the preset's."""
    replicas: int = 8
    preset: str = "h100-8b"
    traces: TraceOptions = field(
        default_factory=lambda: TraceOptions(max_context=200_000, max_wait_s=30.0)
    )
    warmup_share: float = 0.1
    knee: float = 0.95
    bootstrap: int = 1000
    stretch: bool = True
    api: Literal["openai", "http"] = "http"
    kv_sample_s: float = 10.0

    @classmethod
    def quick(cls) -> SteadyConfig:
        """A small study that runs in about a minute on two cores (a smoke test, CI): the
        ``coding`` workload, 48 jobs, 2 replicas, ``plain`` against ``agentrt:defaults``."""
        return cls(
            workload="coding",
            jobs=48,
            users=(1, 2, 6),
            loads=(0.5, 1.0),
            kv=("ample",),
            replicas=2,
            bootstrap=200,
            clients=("plain", "agentrt:defaults"),
        )

    def check(self) -> None:
        """A clear error for a bad configuration, before anything runs."""
        if self.jobs < 2:
            raise ValueError("jobs must be >= 2")
        if not self.users or any(isinstance(n, bool) or n < 1 for n in self.users):
            raise ValueError(f"users must be ints >= 1, got {list(self.users)!r}")
        if max(self.users) >= self.jobs:
            raise ValueError(f"every N of users must be below jobs ({self.jobs})")
        if any(not 0 < x for x in self.loads):
            raise ValueError(f"loads must be > 0, got {list(self.loads)!r}")
        if not self.kv or any(k not in ("ample", "pressure") for k in self.kv):
            raise ValueError(f"kv must be 'ample' and/or 'pressure', got {list(self.kv)!r}")
        if not 0.0 <= self.warmup_share < 0.5:
            raise ValueError(f"warmup_share must be in [0, 0.5), got {self.warmup_share!r}")
        if not 0.0 < self.knee <= 1.0:
            raise ValueError(f"knee must be in (0, 1], got {self.knee!r}")
        if self.bootstrap < 10:
            raise ValueError("bootstrap must be >= 10 resamples")
        for name in self.clients:
            ClientSpec.parse(name)
        self.bench("ample").engine_config()
        if self.pressure_blocks is not None and self.pressure_blocks < 1:
            raise ValueError("pressure_blocks must be >= 1")
        if self.host_blocks is not None and self.host_blocks < 0:
            raise ValueError("host_blocks must be >= 0")

    def gpu_blocks(self, kv: Kv) -> int | None:
        """KV blocks per replica for ``kv`` (None: the preset's)."""
        if kv == "ample":
            return None
        if self.pressure_blocks is not None:
            return self.pressure_blocks
        return BenchConfig(preset=self.preset).engine_config().num_gpu_blocks // 4

    def bench(self, kv: Kv, users: int | None = None) -> BenchConfig:
        """The :class:`BenchConfig` of one replay."""
        return BenchConfig(
            workload=self.workload,
            jobs=self.jobs,
            users=users,
            seed=self.seed,
            clients=tuple(self.clients),
            replicas=self.replicas,
            preset=self.preset,
            traces=self.traces,
            stretch=False,
            api=self.api,
            gpu_blocks=self.gpu_blocks(kv),
            host_blocks=self.host_blocks,
            kv_sample_s=self.kv_sample_s,
        )


# --------------------------------------------------------------------------- the jobs


def _renamed(session: SessionPlan, suffix: str) -> SessionPlan:
    steps: list[Call | Fanout] = []
    for s in session.steps:
        if isinstance(s, Call):
            steps.append(dataclasses.replace(s, namespace=s.namespace + suffix))
        else:
            steps.append(Fanout(tuple(_renamed(x, suffix) for x in s.sessions)))
    return SessionPlan(session.name, tuple(steps))


def steady_jobs(cfg: SteadyConfig) -> list[JobPlan]:
    """The study's jobs, all arriving at 0: Claude Code traces drawn with replacement
    (seeded) among those that fit (the first ``traces.limit`` of them where set), each
    copy its own conversation; other workloads as
    :func:`make_workload` makes them."""
    if cfg.workload != "claude-code":
        return make_workload(
            cfg.workload, cfg.jobs, Arrivals(None, cfg.seed), seed=cfg.seed, traces=cfg.traces
        )
    pool = claude_code_jobs(cfg.traces)  # all that fit (``traces.limit``: the first so many)
    if not pool:
        raise ValueError("no Claude Code trace fits the options (max_context?)")
    rng = random.Random(cfg.seed)
    out = []
    for i in range(cfg.jobs):
        k = rng.randrange(len(pool))
        root = _renamed(pool[k], f".copy{i}")
        out.append(JobPlan(name=f"claude-code-{i}", kind="claude-code", arrival_s=0.0, root=root))
    return out


def _arriving(plans: list[JobPlan], rate: float, seed: int) -> list[JobPlan]:
    times = Arrivals(rate, seed).times(len(plans))
    return [dataclasses.replace(p, arrival_s=t) for p, t in zip(plans, times, strict=True)]


def _moves(job: JobResult) -> tuple[int, int]:
    """Calls that went elsewhere than their session's previous call, and calls after a
    session's first (endpoints as the client saw them)."""
    last: dict[str, str] = {}
    moves = resumed = 0
    for c in sorted(job.calls, key=lambda c: c.start_s):
        if c.endpoint is None:
            continue
        key = c.session_id or c.session_name or ""
        prev = last.get(key)
        if prev is not None:
            resumed += 1
            moves += prev != c.endpoint
        last[key] = c.endpoint
    return moves, resumed


def measure(
    results: Sequence[JobResult],
    *,
    users: int | None,
    warmup_share: float,
    alone: dict[str, float] | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    gateway: bool = False,
) -> dict[str, Any]:
    """One replay's steady-state figures (see the module docstring): the measured jobs
    (warm-up and drain left out), the window, throughput, latency with intervals,
    prefill and cache figures, moves."""
    ok = sorted((r for r in results if r.status == "ok"), key=lambda r: (r.start_s, r.name))
    n = len(ok)
    warm = math.ceil(warmup_share * n)
    if users:
        warm = max(warm, users)
        last = n - users  # from the (n - users)-th start on, fewer than N agents remain
    else:
        last = n
    measured = ok[warm:last] if last > warm else []
    if len(measured) < 2:
        errors = [r.error for r in results if r.status != "ok" and r.error]
        raise ValueError(
            f"too few jobs to measure: {n} done, {warm} warm-up, {n - last} drain; "
            + (
                f"{len(errors)} failed, the first: {errors[0]}"
                if errors
                else "give more jobs or fewer users"
            )
        )
    t0, t1 = measured[0].start_s, measured[-1].start_s
    span = t1 - t0
    ends = sum(1 for r in ok if t0 < r.start_s + r.jct_s <= t1)
    rng = random.Random(seed)
    jcts = [r.jct_s for r in measured]
    out: dict[str, Any] = {
        "jobs": len(results),
        "failed": len(results) - n,
        "warmup_jobs": warm,
        "drain_jobs": n - max(last, warm),
        "measured_jobs": len(measured),
        "window_s": [t0, t1],
        "throughput": ends / span if span > 0 else math.nan,
        "jct": bootstrap_interval(jcts, (0.5, 0.9, 0.99), bootstrap, rng),
        "jct_mean": statistics.fmean(jcts),
        "measured": [r.name for r in measured],
    }
    if alone:
        sized = [(alone[r.name], r.jct_s / alone[r.name]) for r in measured if alone.get(r.name)]
        ratios = [x for _, x in sized]
        out["stretch"] = bootstrap_interval(ratios, (0.5, 0.9), bootstrap, rng)
        # By job size (its JCT alone): the shortest and the longest third of the measured
        # jobs, where short jobs beside long ones are hurt most.
        sized.sort(key=lambda x: x[0])
        third = len(sized) // 3
        if third >= 2:
            for key, part in (("stretch_short", sized[:third]), ("stretch_long", sized[-third:])):
                out[key] = bootstrap_interval([x for _, x in part], (0.5, 0.9), bootstrap, rng)
    prompt = cached = 0
    known = True
    for r in measured:
        for c in r.calls:
            if c.prompt_tokens is None or c.cached_tokens is None:
                known = False
                continue
            prompt += c.prompt_tokens
            cached += c.cached_tokens
    # Each session's worst wait: the longest any of its turns waited for the model to
    # answer (time to first token where streamed, else the call's latency), from the
    # call entering the client: queues, holds and prefill included.
    worst: dict[tuple[str, str], float] = {}
    for r in measured:
        for c in r.calls:
            wait = c.ttft_s if c.ttft_s is not None else c.latency_s
            where = (r.name, c.session_id)
            if wait > worst.get(where, -1.0):
                worst[where] = wait
    waits = sorted(worst.values())
    out["worst_wait"] = {
        "sessions": len(waits),
        "p50": quantile(waits, 0.5),
        "p90": quantile(waits, 0.9),
        "max": waits[-1] if waits else math.nan,
    }
    out["prompt_tokens"] = prompt
    out["uncached_tokens"] = prompt - cached if prompt else None
    out["cache_hit_rate"] = cached / prompt if prompt else None
    out["usage_complete"] = known
    """False when some calls' replies reported no cached tokens (left out above)."""
    if gateway:
        out["moves"] = None  # the client sees one URL: the gateway's
    else:
        mv = [_moves(r) for r in measured]
        total = sum(m for m, _ in mv)
        resumed = sum(x for _, x in mv)
        out["moves"] = total
        out["move_rate"] = total / resumed if resumed else None
    return out


# --------------------------------------------------------------------------- the study

Progress = Callable[[str], None]


@dataclass(slots=True)
class _Point:
    kind: Literal["closed", "open"]
    kv: Kv
    x: float
    """N agents (closed) or the load's fraction of capacity (open)."""
    rate: float | None = None
    runs: dict[int, ClientRun] = field(default_factory=dict)


def _capacity(
    rows: list[dict[str, Any]], clients: Sequence[str], knee: float
) -> tuple[float, dict[str, dict[str, float]]]:
    """The best client's throughput at its curve's knee, and each client's knee."""
    per: dict[str, dict[str, float]] = {}
    for name in clients:
        curve = sorted(
            (r["users"], r["throughput"])
            for r in rows
            if r["client"] == name and math.isfinite(r["throughput"])
        )
        if not curve:
            continue
        top = max(x for _, x in curve)
        n, x = next((n, x) for n, x in curve if x >= knee * top)
        per[name] = {"knee_users": n, "capacity": x, "peak": top}
    best = max((v["capacity"] for v in per.values()), default=math.nan)
    return best, per


def run_steady(
    cfg: SteadyConfig,
    *,
    workers: Workers = "auto",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the study (blocking): the closed-loop curves, then the open-loop points at
    fractions of the measured capacity, for each KV setting; a JSON-ready dict."""
    cfg.check()
    where = check_workers(workers)
    say: Progress = progress or (lambda line: None)
    started = time.perf_counter()
    plans = steady_jobs(cfg)
    names = [ClientSpec.parse(c).name for c in cfg.clients]
    gateway = [ClientSpec.parse(c).gateway is not None for c in cfg.clients]
    alone: dict[Kv, dict[str, float]] = {}
    rows: list[dict[str, Any]] = []

    def replay(points: list[_Point], with_alone: bool) -> None:
        items: list[tuple[BenchConfig, list[JobPlan], int]] = []
        keys: list[tuple[_Point | Kv, int]] = []
        if with_alone:
            for kv in cfg.kv:
                items.append((cfg.bench(kv), plans, ALONE))
                keys.append((kv, ALONE))
        for p in points:
            users = int(p.x) if p.kind == "closed" else None
            jobs = plans if p.rate is None else _arriving(plans, p.rate, cfg.seed)
            for i in range(len(cfg.clients)):
                items.append((cfg.bench(p.kv, users), jobs, i))
                keys.append((p, i))
        total = len(items)
        count = [0]

        def done(index: int, result: PartResult | BaseException) -> None:
            if isinstance(result, BaseException):
                raise result
            key, part = keys[index]
            count[0] += 1
            if isinstance(key, _Point):
                assert isinstance(result, ClientRun)
                key.runs[part] = result
                label = f"{key.kind} {key.kv} {key.x:g} {names[part]}"
            else:
                assert isinstance(result, dict)
                alone[key] = result
                label = f"alone {key}"
            say(f"[{count[0]}/{total}] {label} ({time.perf_counter() - started:.0f} s)")

        run_parts(items, done, workers=where)

    def summarize(p: _Point) -> None:
        for i, name in enumerate(names):
            run = p.runs[i]
            figures = measure(
                run.results,
                users=int(p.x) if p.kind == "closed" else None,
                warmup_share=cfg.warmup_share,
                alone=alone.get(p.kv) if cfg.stretch else None,
                bootstrap=cfg.bootstrap,
                seed=cfg.seed,
                gateway=gateway[i],
            )
            del figures["measured"]
            figures.update(
                {
                    "mode": p.kind,
                    "kv": p.kv,
                    "client": name,
                    "users": int(p.x) if p.kind == "closed" else None,
                    "load": p.x if p.kind == "open" else None,
                    "rate": p.rate,
                    "makespan_s": run.makespan,
                    "engine_hit_rate": run.engine.get("hit_rate"),
                    "utilization": run.engine.get("utilization"),
                    "engine_prefill_tokens": sum(r["prefill_tokens"] for r in run.replicas),
                    "evictions": run.kv.get("evictions") if run.kv else None,
                    "kv_view": run.view,
                    "peer": run.peer,
                }
            )
            rows.append(figures)

    closed = [_Point("closed", kv, float(n)) for kv in cfg.kv for n in sorted(cfg.users)]
    replay(closed, cfg.stretch)
    for p in closed:
        summarize(p)
    capacity: dict[str, Any] = {}
    opened = []
    for kv in cfg.kv:
        best, per = _capacity([r for r in rows if r["kv"] == kv], names, cfg.knee)
        capacity[kv] = {"jobs_per_s": best, "clients": per}
        if math.isfinite(best) and best > 0:
            opened += [_Point("open", kv, x, rate=x * best) for x in cfg.loads]
    if opened:
        replay(opened, False)
        for p in opened:
            summarize(p)
    config = asdict(cfg)
    config["traces"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg.traces).items()
    }
    config["gpu_blocks"] = {kv: cfg.gpu_blocks(kv) for kv in cfg.kv}
    return {
        "config": config,
        "calls_per_replay": sum(p.calls() for p in plans),
        "wall_s": time.perf_counter() - started,
        "capacity": capacity,
        "rows": rows,
    }


# --------------------------------------------------------------------------- output


def _ci(triple: list[float] | None, digits: int = 0) -> str:
    if not triple or not math.isfinite(triple[0]):
        return "-"
    p, lo, hi = triple
    return f"{p:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def _where(row: dict[str, Any]) -> str:
    """A row's N (closed loop) or load (open loop, ``0.5x``)."""
    return str(row["users"]) if row["mode"] == "closed" else f"{row['load']:g}x"


def format_table(result: dict[str, Any]) -> str:
    """The study as a text table, one row per point and client."""
    head = (
        f"{'mode':<6} {'kv':<8} {'N/load':>6} {'client':<30} {'jobs/s':>8} "
        f"{'JCT p50 [90% CI]':>22} {'JCT p90 [90% CI]':>22} {'JCT p99':>8} "
        f"{'stretch p90 [90% CI]':>22} {'short p90':>9} {'prefill Mtok':>12} {'hit':>5} "
        f"{'moves':>6}"
    )
    lines = [head, "-" * len(head)]
    # prefill Mtok and hit: the engines' own counts over the whole replay (every client
    # reports them; the measured jobs' own, from their replies, are in the JSON)
    for r in result["rows"]:
        x = _where(r)
        stretch = r.get("stretch", {}).get("p90")
        short = r.get("stretch_short", {}).get("p90")
        unc = r.get("engine_prefill_tokens")
        hit = r.get("engine_hit_rate")
        lines.append(
            f"{r['mode']:<6} {r['kv']:<8} {x!s:>6} {r['client']:<30} "
            f"{r['throughput']:>8.4f} {_ci(r['jct']['p50']):>22} {_ci(r['jct']['p90']):>22} "
            f"{r['jct']['p99'][0]:>8.0f} {_ci(stretch, 2):>22} "
            f"{(short[0] if short else math.nan):>9.2f} "
            f"{(unc / 1e6 if unc is not None else math.nan):>12.2f} "
            f"{(hit * 100 if hit is not None else math.nan):>4.0f}% "
            f"{r['moves'] if r['moves'] is not None else '-'!s:>6}"
        )
    views = [r for r in result["rows"] if r.get("kv_view")]
    if views:
        lines.append("the client's view of the replicas' KV against the engines' (bench/_view.py):")
    for r in views:
        lines.append(
            f"  {r['mode']} {r['kv']} {_where(r)} {r['client']}: {format_view(r['kv_view'])}"
        )
    failed = [r for r in result["rows"] if r.get("failed")]
    if failed:
        worst = max(failed, key=lambda r: r["failed"])
        lines.append(
            f"warning: jobs failed at {len(failed)} of {len(result['rows'])} points (up to "
            f"{worst['failed']} of {worst['jobs']}, {worst['client']}); the figures leave them "
            "out. A job whose context does not fit a replica's KV fails: give --max-context "
            "below the KV capacity (--kv pressure holds a quarter of the preset's)"
        )
    for kv, cap in result["capacity"].items():
        knees = ", ".join(
            f"{c} {v['capacity']:.4f} at N={v['knee_users']}" for c, v in cap["clients"].items()
        )
        lines.append(f"capacity ({kv}): {cap['jobs_per_s']:.4f} jobs/s (knees: {knees})")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Throughput against JCT p90 (with its interval), one panel per KV setting and
    mode that ran (no open-loop panels without --loads), one line per client, each in
    its colour of every bench figure (``_output.client_styles``); written to ``path``
    (PNG). Needs matplotlib."""
    import matplotlib

    from ..report._plots import plain_text
    from ._output import client_styles

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    kvs = list(dict.fromkeys(r["kv"] for r in rows))
    modes = [m for m in ("closed", "open") if any(r["mode"] == m for r in rows)] or ["closed"]
    clients = list(dict.fromkeys(r["client"] for r in rows))
    styles = dict(zip(clients, client_styles(clients), strict=True))
    with plain_text():
        fig, axes = plt.subplots(
            len(kvs) or 1,
            len(modes),
            figsize=(6 * len(modes), 4.5 * (len(kvs) or 1)),
            squeeze=False,
            constrained_layout=True,
        )
        for i, kv in enumerate(kvs):
            for j, mode in enumerate(modes):
                ax = axes[i][j]
                for c in clients:
                    pts = [
                        r for r in rows if r["kv"] == kv and r["mode"] == mode and r["client"] == c
                    ]
                    pts.sort(key=lambda r: r["throughput"])
                    if not pts:
                        continue
                    xs = [r["throughput"] for r in pts]
                    ys = [r["jct"]["p90"][0] for r in pts]
                    lo = [r["jct"]["p90"][0] - r["jct"]["p90"][1] for r in pts]
                    hi = [r["jct"]["p90"][2] - r["jct"]["p90"][0] for r in pts]
                    color, style = styles[c]
                    ax.errorbar(
                        xs,
                        ys,
                        yerr=[lo, hi],
                        marker="o",
                        capsize=3,
                        label=c,
                        color=color,
                        linestyle=style,
                    )
                cap = result["capacity"].get(kv, {}).get("jobs_per_s")
                if cap and math.isfinite(cap):
                    ax.axvline(cap, color="grey", linestyle=":", linewidth=1)
                ax.set_title(
                    f"{result['config']['workload']}, {kv} KV, "
                    + ("closed loop (N agents)" if mode == "closed" else "open loop (Poisson)")
                )
                ax.set_xlabel("throughput (jobs/s, measured window)")
                ax.set_ylabel("JCT p90 (s), 90% CI")
                ax.grid(alpha=0.3)
        if clients:
            axes[0][0].legend(fontsize=8)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return path


def save(result: dict[str, Any], path: Path) -> Path:
    """Write the study as JSON (NaN as null)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(result), indent=1))
    return path


def steady_study(
    cfg: SteadyConfig,
    out: Path,
    *,
    png: Path | None = None,
    workers: Workers = "auto",
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the steady-state study ``cfg`` (blocking), write it as JSON to ``out`` and its
    throughput against JCT p90 as a PNG (``png``, default beside ``out``; needs
    matplotlib, the ``report`` extra), and ``echo`` its progress, its table and where
    it wrote them; returns the study (a JSON-ready dict). A bad configuration raises
    ValueError before anything runs. ``workers``: as :func:`run_study`."""
    cfg.check()
    started = time.perf_counter()
    result = run_steady(cfg, workers=workers, progress=echo)
    save(result, out)
    echo(format_table(result))
    echo(f"results: {out} ({time.perf_counter() - started:.0f} s wall)")
    try:
        echo(f"plot: {plot(result, png or out.with_suffix('.png'))}")
    except ImportError:
        echo("plot: matplotlib is not installed (pip install 'agentjct[report]')")
    return result
