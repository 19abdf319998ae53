"""The benchmark runner: the same workload through each client, side by side.

On the embedded engine (the default) every client gets fresh replicas and the run is in
virtual time (:class:`VirtualTimeLoop`), so results do not depend on this machine's noise and
hours of cluster time take seconds. Against real servers (``endpoints``) it runs in
wall-clock time, each client after the other; :func:`replay` runs one client so on jobs
the caller makes.

An embedded run splits into independent replays (:func:`replay_part`: each client, and the
solo runs, in its own event loop from virtual time 0). A study of many runs
(:func:`run_study`), or a grid of replays whose jobs the caller makes (:func:`run_parts`),
runs them one by one or side by side on processes or Ray (``_parallel.py``), with the same
results.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, overload

import anyio
import httpx

from .._config import Endpoint, redact_userinfo
from .._errors import EndpointError
from .._httplib import what_to_do
from .._stats import quantile
from ..sim import PRESETS, Cluster, EngineConfig
from ._clock import VirtualTimeLoop, every
from ._drivers import AgentrtDriver, ClientSpec, Driver, JobResult, Prompts, make_driver
from ._fleet import FLEET_ASSIGNS, Fleet, FleetAssign, plain_starts
from ._parallel import Workers, check_workers, portable, run_replays
from ._plan import JobPlan
from ._view import ViewSampler
from ._workloads import Arrivals, TraceOptions, make_workload, too_few_traces

__all__ = [
    "BenchConfig",
    "BenchResult",
    "ClientResult",
    "journal_paths",
    "replay",
    "run_bench",
    "run_parts",
    "run_study",
]


@dataclass(slots=True)
class BenchConfig:
    """One benchmark run. See ``agentrt bench --help`` for each option."""

    workload: str = "mixed"
    jobs: int = 40
    rate: float | None = None
    """Poisson arrivals, jobs per (simulated) second; None: all jobs arrive at once."""
    users: int | None = None
    """Closed loop instead: this many users, each starting its next job when the last one
    ends (``rate`` is then ignored)."""
    seed: int = 0
    clients: Sequence[str] = ("plain", "agentrt:round-robin", "agentrt:session")
    replicas: int = 4
    preset: str = "h100-8b"
    endpoints: Sequence[str] = ()
    """Real OpenAI-compatible servers (wall-clock time); empty: the embedded engine."""
    model: str | None = None
    traces: TraceOptions = field(default_factory=TraceOptions)
    stretch: bool = True
    """Also run every job alone on an idle cluster, for JCT stretch (embedded only)."""
    tool_wait_s: float = 2.0
    api: Literal["openai", "http"] = "openai"
    """How calls are made: through the openai client, or as raw JSON over agentrt's HTTP
    client (no openai object parsing: for large replays)."""
    long_share: float = 0.2
    """``mixed-cc``: the share of jobs that are Claude Code replays (the rest are ReAct)."""
    stream_interval: int = 256
    """Tokens per streamed chunk of the embedded engine (the first token is always sent
    at once, so time to first token is exact)."""
    journal_dir: Path | None = None
    """Write one journal per client there (``journal-<client>.jsonl``: a JobReport per
    line, as ``Runtime(journal=...)`` writes them); None: no journals. During the run
    each is written beside its place (``.journal-<client>.jsonl.part``) and moved there,
    replacing the previous run's, once the run has ended with at least one job done: a
    run that raises, or in which every job failed, leaves the folder's journals as they
    were. A fleet's members all append to their client's one file: each line is one
    unbuffered ``O_APPEND`` write made from the event loop's thread, so the members'
    lines never mix."""
    tool_wait_policy: str | None = None
    """The simulated replicas' tool-wait KV policy (``EngineConfig.tool_wait_policy``:
    lru, keep, pin, offload, drop, ...); None: the preset's."""
    retention_directives: bool = False
    """The simulated replicas honour retention directives
    (``EngineConfig.retention_directives``: what a call says about its session's idle
    and end orders their evictions); off: plain LRU, as released vLLM."""
    gpu_blocks: int | None = None
    """KV blocks on each embedded replica's accelerator; None: the preset's."""
    host_blocks: int | None = None
    """KV blocks in each embedded replica's host tier; None: the preset's."""
    kv_sample_s: float = 1.0
    """On the embedded engine: seconds between samples of the replicas' KV occupancy."""
    fleet: int = 1
    """Each client runs as a fleet of this many independent members, as a service's
    worker processes: for agentrt each its own Runtime (router, admission, learned
    waits), for ``plain`` each its own round-robin (starting at a random replica when
    ``fleet > 1``), all in one event loop on the same replicas."""
    fleet_assign: FleetAssign = "round_robin"
    """How a fleet's jobs are dealt to its members: ``round_robin`` (the i-th job to
    arrive to member ``i % fleet``), ``hash`` (a stable hash of the job's name) or
    ``plan`` (each job's ``JobPlan.worker``: how ``agentrt tune`` replays a fleet's
    journal)."""

    def engine_config(self) -> EngineConfig:
        """The simulated replicas' configuration: the preset with this run's changes."""
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; known: {', '.join(PRESETS)}")
        changes: dict[str, object] = {"stream_interval": self.stream_interval}
        if self.tool_wait_policy is not None:
            changes["tool_wait_policy"] = self.tool_wait_policy
        if self.retention_directives:
            changes["retention_directives"] = True
        if self.gpu_blocks is not None:
            changes["num_gpu_blocks"] = self.gpu_blocks
        if self.host_blocks is not None:
            changes["num_host_blocks"] = self.host_blocks
        return PRESETS[self.preset].replace(**changes)


@dataclass(slots=True)
class ClientResult:
    """What one client of a benchmark run measured: job completion times (``jct``:
    their distribution in seconds), stretch, call latency, TTFT, throughput, prefix-cache hits,
    load balance, utilization, and one row per job."""

    client: str
    jobs: int
    failed: int
    makespan_s: float
    jct: dict[str, float]
    stretch: dict[str, float] | None
    call_latency: dict[str, float]
    ttft: dict[str, float] | None
    jobs_per_s: float
    tokens_per_s: float | None
    prefix_cache_hit_rate: float | None
    load_imbalance: float | None
    utilization: float | None
    job_rows: list[dict[str, Any]] = field(default_factory=list)
    journal: str | None = None
    """The client's journal (one JobReport per job), when the run wrote journals."""
    resumed_hit_rate: float | None = None
    """Prefix-cache hit rate (cached / prompt tokens) of the calls that resume a session
    after a tool wait (agentrt clients; None where unknown)."""
    kv: dict[str, float] | None = None
    """On the embedded engine: KV occupancy (``occupancy_mean``/``occupancy_peak``: the used
    fraction of accelerator blocks, referenced or pinned, time-weighted over the makespan
    and the highest sample, averaged over the replicas; ``cached_mean``: the fraction
    holding prefix-cache blocks, used or not), host-tier traffic (blocks offloaded and
    loaded back, tokens hit in the host tier) and the engines' other counters, summed."""
    waits: dict[str, float | None] | None = None
    """Tool waits: ``count``, ``expected_share`` (the share whose expected duration was
    known when they began) and ``abs_error_median`` / ``rel_error_median`` of those."""
    fleet: int = 1
    """The client ran as a fleet of this many members (``BenchConfig.fleet``); each job
    row's ``worker`` says which member ran it."""
    replicas: list[dict[str, float]] | None = None
    """On the embedded engine: per replica, in the cluster's order, ``calls`` (requests the engine
    served), ``prefill_tokens`` (prompt tokens it computed: not found in its prefix cache
    nor in its host tier), ``busy_s`` and ``first_turns`` (sessions whose first call,
    turn 0, it served)."""
    kv_view: dict[str, Any] | None = None
    """On the embedded engine, one agentrt client over several replicas: its router's view of
    each replica's KV (working set, what is still cached, capacity) against the engine's,
    sampled together every ``kv_sample_s`` (bench/_view.py: ``resident``, ``over``,
    ``capacity``)."""
    call_imbalance: float | None = None
    """On the embedded engine: the replica that served the most calls, over the mean (beside
    ``load_imbalance``, the same for busy time)."""
    load_control: dict[str, Any] | None = None
    """On the embedded engine, an agentrt client with load control on: ``held`` (tool
    boundaries at which a session was held), ``held_s`` (seconds held in all),
    ``hold_max_s`` (the longest hold) and ``forced_resumes`` (holds ended by the bound),
    summed over a fleet's members."""


@dataclass(slots=True)
class BenchResult:
    """A benchmark run: its configuration, whether it ran in virtual time, its wall
    time, and each client's :class:`ClientResult`."""

    config: dict[str, Any]
    virtual_time: bool
    wall_s: float
    calls: int
    clients: list[ClientResult]

    def to_json(self) -> str:
        """The result as indented JSON (what :meth:`save` writes)."""
        return json.dumps(asdict(self), indent=1)

    def save(self, path: Path) -> None:
        """Writes the result as JSON to ``path``, creating its folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())


def _dist(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    s = sorted(values)
    return {
        "mean": statistics.fmean(values),
        "p50": quantile(s, 0.5),
        "p90": quantile(s, 0.9),
        "p99": quantile(s, 0.99),
    }


Progress = Callable[[str], None]


def journal_paths(cfg: BenchConfig) -> list[Path | None]:
    """Each client's journal file (in ``cfg.clients`` order): ``journal-<client>.jsonl``
    in ``cfg.journal_dir``, the client's name made safe for a file name (and numbered if
    two clients would share one)."""
    if cfg.journal_dir is None:
        return [None] * len(cfg.clients)
    out: list[Path | None] = []
    used: set[str] = set()
    for name in cfg.clients:
        stem = "journal-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip()).strip("_") or "client")
        unique, n = stem, 1
        while unique in used:
            n += 1
            unique = f"{stem}-{n}"
        used.add(unique)
        out.append(cfg.journal_dir / f"{unique}.jsonl")
    return out


def _staged(path: Path | None) -> Path | None:
    """Where a run writes the journal ``path`` until it ends (see ``journal_dir``)."""
    return None if path is None else path.with_name(f".{path.name}.part")


def _discard_journals(cfg: BenchConfig) -> None:
    """Remove what a run wrote of its journals (or a run stopped before its end left)."""
    for path in journal_paths(cfg):
        staged = _staged(path)
        if staged is not None:
            staged.unlink(missing_ok=True)


def _keep_journals(cfg: BenchConfig, clients: list[ClientResult]) -> None:
    """A run ended: its journals replace the previous run's, unless every job failed
    (then the previous run's stay, and the clients name no journal)."""
    if not any(c.jobs > c.failed for c in clients):
        _discard_journals(cfg)
        for c in clients:
            c.journal = None
        return
    for path in journal_paths(cfg):
        staged = _staged(path)
        if path is None or staged is None:
            continue
        if staged.exists():
            staged.replace(path)
        else:  # the client wrote no line: no journal of this run
            path.unlink(missing_ok=True)


async def _replay(
    plans: Sequence[JobPlan],
    run_job: Callable[[JobPlan, float], Any],
    progress: Progress,
    label: str,
    at_arrival: Callable[[float], None] | None = None,
    users: int | None = None,
) -> tuple[list[JobResult], float]:
    results: list[JobResult] = []
    t0 = anyio.current_time()
    ordered = sorted(plans, key=lambda p: p.arrival_s)
    marks = {len(ordered) // 2, len(ordered) - 1}

    async def one(plan: JobPlan) -> None:
        results.append(await run_job(plan, t0))
        progress(label)

    if users:
        queue = iter(enumerate(ordered))

        async def user() -> None:
            for i, plan in queue:
                if at_arrival is not None and i in marks:
                    at_arrival(anyio.current_time() - t0)
                await one(plan)

        async with anyio.create_task_group() as tg:
            for _ in range(users):
                tg.start_soon(user)
        return results, anyio.current_time() - t0

    async with anyio.create_task_group() as tg:
        for i, plan in enumerate(ordered):
            delay = t0 + plan.arrival_s - anyio.current_time()
            if delay > 0:
                await anyio.sleep(delay)
            tg.start_soon(one, plan)
            if at_arrival is not None and i in marks:
                at_arrival(anyio.current_time() - t0)
    return results, anyio.current_time() - t0


def _summarize(
    name: str,
    results: list[JobResult],
    makespan: float,
    alone: dict[str, float] | None,
    engine: dict[str, float | None],
    journal: Path | None = None,
    kv: dict[str, float] | None = None,
    fleet: int = 1,
    replicas: list[dict[str, float]] | None = None,
    kv_view: dict[str, Any] | None = None,
    load_control: dict[str, Any] | None = None,
) -> ClientResult:
    ok = [r for r in results if r.status == "ok"]
    jcts = [r.jct_s for r in ok]
    lat = sorted(c.latency_s for r in ok for c in r.calls)
    ttft = sorted(c.ttft_s for r in ok for c in r.calls if c.ttft_s is not None)
    stretch = None
    if alone:
        ratios = [r.jct_s / alone[r.name] for r in ok if alone.get(r.name)]
        stretch = _dist(ratios)
    rows = [
        {
            "name": r.name,
            "kind": r.kind,
            "arrival_s": r.arrival_s,
            "start_s": r.start_s,
            "jct_s": r.jct_s,
            "status": r.status,
            "calls": len(r.calls),
            "call_latency_p50": quantile(sorted(c.latency_s for c in r.calls), 0.5),
            "alone_jct_s": alone.get(r.name) if alone else None,
            "worker": r.worker,
            "error": r.error and redact_userinfo(r.error),  # no user:password@
        }
        for r in sorted(results, key=lambda r: r.arrival_s)
    ]
    return ClientResult(
        client=name,
        jobs=len(results),
        failed=len(results) - len(ok),
        makespan_s=makespan,
        jct=_dist(jcts),
        stretch=stretch,
        call_latency={
            "p50": quantile(lat, 0.5),
            "p90": quantile(lat, 0.9),
            "p99": quantile(lat, 0.99),
        },
        ttft={"p50": quantile(ttft, 0.5), "p99": quantile(ttft, 0.99)} if ttft else None,
        jobs_per_s=len(ok) / makespan if makespan > 0 else math.nan,
        tokens_per_s=engine.get("tokens_per_s"),
        prefix_cache_hit_rate=engine.get("hit_rate"),
        load_imbalance=engine.get("imbalance"),
        utilization=engine.get("utilization"),
        job_rows=rows,
        journal=str(journal) if journal is not None else None,
        resumed_hit_rate=_resumed_hit_rate(ok),
        kv=kv,
        waits=_wait_stats(ok),
        fleet=fleet,
        replicas=replicas,
        call_imbalance=_imbalance([r["calls"] for r in replicas]) if replicas else None,
        kv_view=kv_view,
        load_control=load_control,
    )


def _resumed_hit_rate(results: list[JobResult]) -> float | None:
    prompt = cached = 0
    for r in results:
        for c in r.calls:
            if c.after_tool and c.prompt_tokens and c.cached_tokens is not None:
                prompt += c.prompt_tokens
                cached += c.cached_tokens
    return cached / prompt if prompt else None


def _wait_stats(results: list[JobResult]) -> dict[str, float | None] | None:
    tools = [w for r in results for w in r.tools]
    if not tools:
        return None
    known = [w for w in tools if w.expected_s is not None]
    abs_err = [abs(w.duration_s - w.expected_s) for w in known if w.expected_s is not None]
    rel_err = [e / w.duration_s for e, w in zip(abs_err, known, strict=True) if w.duration_s > 0]
    return {
        "count": len(tools),
        "expected_share": len(known) / len(tools),
        "abs_error_median": statistics.median(abs_err) if abs_err else None,
        "rel_error_median": statistics.median(rel_err) if rel_err else None,
    }


class _KVSampler:
    """Samples the replicas' KV occupancy every ``interval_s`` (time-weighted by
    construction) and reads their KV counters at the end."""

    def __init__(self, cluster: Cluster, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"kv_sample_s must be > 0, got {interval_s!r}")
        self._cluster = cluster
        self._interval = interval_s
        self._used: list[float] = []
        self._cached: list[float] = []

    def _sample(self, n: int = 1) -> None:
        """Take ``n`` samples of the replicas' state now (it holds until the next event)."""
        occupancy = [r.engine.kv_occupancy() for r in self._cluster.replicas]
        self._used.extend([statistics.fmean(u for u, _ in occupancy)] * n)
        self._cached.extend([statistics.fmean(c for _, c in occupancy)] * n)

    async def run(self) -> None:
        await every(self._interval, self._sample)

    def result(self) -> dict[str, float]:
        self._sample()
        stats = self._cluster.stats()
        out = {
            "occupancy_mean": statistics.fmean(self._used),
            "occupancy_peak": max(self._used),
            "cached_mean": statistics.fmean(self._cached),
            "gpu_blocks": float(sum(s.gpu_blocks for s in stats)),
            "host_blocks": float(sum(s.host_blocks for s in stats)),
        }
        # Every integer counter the engines expose (evictions, host-tier traffic,
        # prefetches where the engine counts them), summed over the replicas.
        for name in type(stats[0]).__dataclass_fields__:
            values = [getattr(s, name) for s in stats]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                out.setdefault(name, float(sum(values)))
        return out


def _sim_engine_stats(
    cluster: Cluster, makespan: float, window: tuple[float, float] | None
) -> dict[str, float | None]:
    """Engine-side figures. ``utilization`` is the replicas' mean busy fraction over the
    second half of the arrivals (``window``: its length and the mean busy seconds in it),
    once the load has ramped up: the load the arrival rate puts on the cluster. Over the
    whole makespan when all jobs arrive at once."""
    stats = cluster.stats()
    queries = sum(s.prefix_cache_queries for s in stats)
    hits = sum(s.prefix_cache_hits for s in stats)
    busy = [s.busy_s for s in stats]
    mean_busy = statistics.fmean(busy)
    tokens = sum(s.prompt_tokens + s.generation_tokens for s in stats)
    return {
        "hit_rate": hits / queries if queries else None,
        "imbalance": _imbalance(busy),
        "utilization": (window[1] / window[0])
        if window and window[0] > 0
        else (mean_busy / makespan if makespan > 0 else None),
        "tokens_per_s": tokens / makespan if makespan > 0 else None,
    }


def _imbalance(values: Sequence[float]) -> float | None:
    """The largest of ``values`` over their mean (None when the mean is 0)."""
    mean = statistics.fmean(values)
    return max(values) / mean if mean > 0 else None


def _replica_figures(cluster: Cluster, results: Sequence[JobResult]) -> list[dict[str, float]]:
    """Per replica: the calls it served, the prompt tokens it computed, its busy time and
    the sessions whose first call (turn 0) landed there (by the calls' endpoints)."""
    index = {url.rstrip("/"): i for i, url in enumerate(cluster.base_urls)}
    first = [0] * len(index)
    for r in results:
        for c in r.calls:
            if c.turn == 0 and c.endpoint is not None:
                i = index.get(c.endpoint.rstrip("/"))
                if i is not None:
                    first[i] += 1
    return [
        {
            "calls": s.requests_finished,
            "prefill_tokens": s.prefix_cache_queries - s.prefix_cache_hits - s.host_cache_hits,
            "busy_s": s.busy_s,
            "first_turns": first[i],
        }
        for i, s in enumerate(cluster.stats())
    ]


ALONE: Final = -1
"""The replay part that runs every job alone on an idle cluster (stretch); parts 0, 1, ...
are the clients, in ``BenchConfig.clients`` order."""


@dataclass(slots=True)
class ClientRun:
    """One client's replay on its own replicas of the embedded engine, before it is summarized."""

    results: list[JobResult]
    makespan: float
    engine: dict[str, float | None]
    kv: dict[str, float]
    replicas: list[dict[str, float]] = field(default_factory=list)
    """Per replica: see :attr:`ClientResult.replicas`."""
    view: dict[str, Any] | None = None
    """The client's view of the replicas' KV against the engines': see
    :attr:`ClientResult.kv_view`."""
    peer: dict[str, Any] | None = None
    """A modelled peer's own counters (``PeerPolicy.stats``: holds, pauses, resumes), or None."""


PartResult = dict[str, float] | ClientRun
"""What a replay part returns: each job's JCT alone (:data:`ALONE`), or a client's run."""


def sim_parts(cfg: BenchConfig) -> list[int]:
    """The independent replays of an embedded run, in the order they run one by one."""
    return ([ALONE] if cfg.stretch else []) + list(range(len(cfg.clients)))


def part_label(cfg: BenchConfig, part: int) -> str:
    """The label a part reports progress with: ``alone``, or the client's name."""
    return "alone" if part == ALONE else ClientSpec.parse(cfg.clients[part]).name


async def _alone(cfg: BenchConfig, plans: list[JobPlan], progress: Progress) -> dict[str, float]:
    preset = cfg.engine_config()
    model = cfg.model or preset.model_name
    alone: dict[str, float] = {}

    async def solo(plan: JobPlan) -> None:
        async with Cluster(cfg.replicas, preset) as cluster:
            driver = make_driver(
                ClientSpec.parse("agentrt:session"),
                list(cluster.base_urls),
                cluster.transport(),
                model,
                Prompts("sim"),
                False,
                cfg.api,
            )
            async with driver:
                res = await driver.run_job(plan, anyio.current_time())
        alone[plan.name] = res.jct_s
        progress("alone")

    async with anyio.create_task_group() as tg:
        for plan in plans:
            tg.start_soon(solo, plan)
    return alone


def _driver(
    cfg: BenchConfig,
    spec: ClientSpec,
    plans: Sequence[JobPlan],
    urls: list[str],
    transport: httpx.AsyncBaseTransport | None,
    model: str,
    prompts: Prompts,
    journal: Path | None,
) -> Driver:
    """The client's driver (:func:`make_driver`; no ``transport``: real servers), or a
    :class:`Fleet` of ``cfg.fleet`` of them, plain members starting their round-robin at
    random replicas."""
    real = transport is None and prompts.mode == "text"  # a real engine: ignore_eos

    def member(start: int) -> Driver:
        return make_driver(
            spec, urls, transport, model, prompts, real, cfg.api, journal, start=start
        )

    if cfg.fleet == 1:
        return member(0)
    starts = [0] * cfg.fleet
    if spec.kind == "plain":
        starts = plain_starts(cfg.fleet, len(urls), cfg.seed)
    return Fleet([member(start) for start in starts], plans, cfg.fleet_assign)


async def _client(
    cfg: BenchConfig, plans: list[JobPlan], index: int, progress: Progress, staged: bool
) -> ClientRun:
    preset = cfg.engine_config()
    model = cfg.model or preset.model_name
    spec = ClientSpec.parse(cfg.clients[index])
    journal = journal_paths(cfg)[index]
    # A client that sends engine priorities gets replicas that schedule by them (as a
    # vLLM server started with --scheduling-policy priority), as does one that asks for
    # them (scheduling=priority); the others keep FCFS.
    scheduling = spec.scheduling or ("priority" if spec.send_priority else None)
    engine = preset.replace(scheduling=scheduling) if scheduling else preset
    if spec.retention:
        engine = engine.replace(retention_directives=True)
    async with Cluster(cfg.replicas, engine, gateway=spec.gateway) as cluster:
        urls = [cluster.gateway_url] if spec.gateway else list(cluster.base_urls)
        prompts = Prompts("sim")
        driver = _driver(
            cfg,
            spec,
            plans,
            urls,
            cluster.transport(),
            model,
            prompts,
            _staged(journal) if staged else journal,
        )
        window: list[tuple[float, float]] = []

        def snapshot(elapsed: float) -> None:
            busy = statistics.fmean(s.busy_s for s in cluster.stats())
            window.append((elapsed, busy))

        sampler = _KVSampler(cluster, cfg.kv_sample_s)
        viewer: ViewSampler | None = None
        async with driver, anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            # One agentrt client (a fleet of one included) that sees the replicas.
            lone = driver
            if isinstance(driver, Fleet) and len(driver.members) == 1:
                lone = driver.members[0]
            if isinstance(lone, AgentrtDriver) and not spec.gateway and len(urls) > 1:
                viewer = ViewSampler(cluster, lone.runtime, cfg.kv_sample_s)
                tg.start_soon(viewer.run)
            results, makespan = await _replay(
                plans, driver.run_job, progress, spec.name, snapshot, cfg.users
            )
            tg.cancel_scope.cancel()
        span = None
        if len(window) == 2:
            span = (window[1][0] - window[0][0], window[1][1] - window[0][1])
        stats = _sim_engine_stats(cluster, makespan, span)
        kv = sampler.result()
        view = viewer.result() if viewer is not None else None
        replicas = _replica_figures(cluster, results)
        peer = cluster.gateway.policy.stats() if cluster.gateway is not None else None
        if peer is None:
            peer = _load_control(driver)  # agentrt's own, summed over a fleet's members
    return ClientRun(results, makespan, stats, kv, replicas, view, peer)


def _load_control(driver: object) -> dict[str, Any] | None:
    """What agentrt's load control did (holds, seconds held, the longest hold, forced
    resumes), summed over a fleet's members; None where no member had it on."""
    members = driver.members if isinstance(driver, Fleet) else [driver]
    out: dict[str, Any] | None = None
    for member in members:
        held = member.runtime.load_statistics() if isinstance(member, AgentrtDriver) else None
        if held is None:
            continue
        if out is None:
            out = {"held": 0, "hold_max_s": 0.0, "held_s": 0.0, "forced_resumes": 0}
        out["held"] += held.holds
        out["hold_max_s"] = max(out["hold_max_s"], held.longest_s)
        out["held_s"] += held.held_s
        out["forced_resumes"] += held.forced
    return out


def replay_part(
    cfg: BenchConfig,
    plans: list[JobPlan],
    part: int,
    progress: Progress | None = None,
    *,
    staged: bool = False,
) -> PartResult:
    """Replay one part of an embedded run (:data:`ALONE` or a client's index) on fresh
    clusters, in its own virtual-time event loop from time 0: a part's result does not
    depend on the other parts, nor on where or in which order they run (blocking).
    A client's journal (``cfg.journal_dir``) is appended to in its place, or with
    ``staged`` beside it, for the run to move there once it ends (:func:`run_study`)."""
    report: Progress = progress or (lambda label: None)
    options = {"loop_factory": VirtualTimeLoop}
    if part == ALONE:
        return anyio.run(_alone, cfg, plans, report, backend_options=options)
    return anyio.run(_client, cfg, plans, part, report, staged, backend_options=options)


def sim_clients(cfg: BenchConfig, parts: dict[int, PartResult]) -> list[ClientResult]:
    """The clients' results from the parts of an embedded run (see :func:`replay_part`)."""
    alone = parts.get(ALONE)
    assert alone is None or isinstance(alone, dict)
    out = []
    for index, journal in enumerate(journal_paths(cfg)):
        run = parts[index]
        assert isinstance(run, ClientRun)
        spec = ClientSpec.parse(cfg.clients[index])
        name = spec.name
        out.append(
            _summarize(
                name,
                run.results,
                run.makespan,
                alone,
                run.engine,
                journal,
                run.kv,
                cfg.fleet,
                run.replicas,
                run.view,
                None if spec.gateway else run.peer,
            )
        )
    return out


async def _metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    base = url[: -len("/v1")] if url.endswith("/v1") else url
    try:
        resp = await client.get(base + "/metrics")
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in resp.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        key = name.split("{", 1)[0]
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _brief(resp: httpx.Response, limit: int = 160) -> str:
    """What a server's error reply says, on one line, cut to ``limit`` characters: its
    message where the body is an OpenAI-style error (``{"error": {"message": ...}}``,
    vLLM's ``{"message": ...}``, FastAPI's ``{"detail": ...}``), else its text."""
    text = resp.text
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        said = error.get("message") if isinstance(error, dict) else error
        said = said or body.get("message") or body.get("detail")
        if isinstance(said, str) and said:
            text = said
    line = " ".join(text.split()) or "an empty reply"
    return line if len(line) <= limit else line[: limit - 3] + "..."


async def _served_models(http: httpx.AsyncClient, url: str, required: bool) -> list[str]:
    """The models ``GET {url}/models`` lists. A server not reached raises
    :class:`~agentrt.EndpointError`; so does one that answers no model list where
    ``required`` (no model was given), showing the server's own reply."""
    shown = redact_userinfo(url)
    try:
        resp = await http.get(url.rstrip("/") + "/models")
    except httpx.HTTPError as exc:
        raise EndpointError(
            f"could not reach {shown} (GET /models: {type(exc).__name__}: {exc}); "
            + what_to_do(exc, shown, httpx),
            endpoint=shown,
        ) from None
    problem = None
    ids: list[str] = []
    if resp.status_code != 200:
        problem = f"answered HTTP {resp.status_code}"
    else:
        try:
            ids = [str(m["id"]) for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError):
            problem = "answered no OpenAI model list"
    if problem is not None and required:
        raise EndpointError(
            f"{shown}/models {problem} ({_brief(resp)}): is {shown} the server's OpenAI "
            "base URL (usually ending in /v1)? (A server without /models: give --model)",
            endpoint=shown,
        )
    return ids


async def _model(http: httpx.AsyncClient, urls: Sequence[str], model: str | None) -> str:
    """``model``, else the first the first server lists. Every server is asked for its
    models before any job runs: one that is not there, or (without a model) not an
    OpenAI API at that URL, stops the run here."""
    served = [await _served_models(http, u, model is None) for u in urls]
    if model is not None:
        return model
    if not served[0]:
        raise EndpointError(
            f"{redact_userinfo(urls[0])}/models lists no model: give --model",
            endpoint=redact_userinfo(urls[0]),
        )
    return served[0][0]


async def _real_client(
    http: httpx.AsyncClient,
    cfg: BenchConfig,
    name: str,
    plans: list[JobPlan],
    model: str,
    prompts: Prompts,
    journal: tuple[Path | None, Path | None],
    progress: Progress,
) -> ClientResult:
    """One client's replay of ``plans`` against ``cfg.endpoints`` in wall-clock time, the
    servers' ``/metrics`` counters read before and after it. ``journal``: where the
    driver writes it, and the path the result names."""
    urls = list(cfg.endpoints)
    spec = ClientSpec.parse(name)
    before = [await _metrics(http, u) for u in urls]
    driver = _driver(cfg, spec, plans, urls, None, model, prompts, journal[0])
    async with driver:
        results, makespan = await _replay(
            plans, driver.run_job, progress, spec.name, None, cfg.users
        )
    after = [await _metrics(http, u) for u in urls]

    def delta(key: str) -> list[float]:
        return [a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True)]

    queries = math.fsum(delta("vllm:prefix_cache_queries_total"))
    hits = math.fsum(delta("vllm:prefix_cache_hits_total"))
    load = [
        p + g
        for p, g in zip(
            delta("vllm:prompt_tokens_total"), delta("vllm:generation_tokens_total"), strict=True
        )
    ]
    mean_load = statistics.fmean(load) if load else 0.0
    total = math.fsum(load)
    engine: dict[str, float | None] = {
        "hit_rate": hits / queries if queries else None,
        "imbalance": max(load) / mean_load if mean_load > 0 else None,
        "utilization": None,
        "tokens_per_s": total / makespan if makespan > 0 and total else None,
    }
    return _summarize(spec.name, results, makespan, None, engine, journal[1], fleet=cfg.fleet)


async def _run_real(
    cfg: BenchConfig, plans: list[JobPlan], progress: Progress
) -> list[ClientResult]:
    out = []
    async with httpx.AsyncClient(timeout=10.0) as http:
        model = await _model(http, cfg.endpoints, cfg.model)
        for name, journal in zip(cfg.clients, journal_paths(cfg), strict=True):
            where = (_staged(journal), journal)
            prompts = Prompts("text")
            out.append(await _real_client(http, cfg, name, plans, model, prompts, where, progress))
    return out


def replay(
    jobs: Sequence[JobPlan],
    endpoints: Sequence[str],
    client: str = "agentrt:session",
    *,
    model: str | None = None,
    prompts: Prompts | None = None,
    journal: str | Path | None = None,
    api: Literal["openai", "http"] = "openai",
) -> ClientResult:
    """Replay ``jobs`` of your own through one client against your servers (blocking).

    What :func:`run_bench` does for each client with ``BenchConfig.endpoints``, for jobs
    it does not make: each :class:`JobPlan` (from :func:`make_workload`, cut or reshaped,
    or built from :class:`SessionPlan` and :class:`Call`) starts at its ``arrival_s``
    after the start, in wall-clock time, against the OpenAI-compatible servers at
    ``endpoints`` (replicas, or a router in front of them). Returns the client's
    :class:`ClientResult`: JCTs, call latencies, failures, one row per job, and the
    prefix-cache hit rate and load balance where the servers' ``/metrics`` count them
    (vLLM's).

    Args:
        jobs: the jobs to replay.
        endpoints: the servers' OpenAI base URLs (``http://host:8000/v1``).
        client: the client spec, as ``BenchConfig.clients`` and ``agentrt bench
            --clients`` take it (``plain``, ``agentrt:session``,
            ``agentrt:config=FILE``, ...).
        model: the model named in every call; None: the first the first server lists.
        prompts: how a call's prompt blocks become text: ``Prompts("text")`` (the
            default: words, for a real engine's tokenizer, each call's output held to
            its planned length with ``ignore_eos``) or ``Prompts("sim")`` (the embedded
            engine's block markers, exact token counts: ``agentrt sim serve``).
        journal: a journal file the client appends one ``JobReport`` per job to.
        api: ``openai`` (calls through the openai client, as agent code makes them) or
            ``http`` (the same JSON over agentrt's HTTP client).

    Raises:
        ValueError: no endpoint, a malformed endpoint or client spec (before any
            request).
        agentrt.EndpointError: a server not reached, or without ``model`` one that
            lists no model.
    """
    cfg = BenchConfig(
        clients=(client,), endpoints=tuple(endpoints), model=model, api=api, stretch=False
    )
    if not cfg.endpoints:
        raise ValueError("replay needs at least one endpoint (an OpenAI base URL)")
    check_config(cfg)
    path = Path(journal) if journal is not None else None
    return anyio.run(_replay_one, cfg, list(jobs), prompts or Prompts("text"), path)


async def _replay_one(
    cfg: BenchConfig, plans: list[JobPlan], prompts: Prompts, journal: Path | None
) -> ClientResult:
    async with httpx.AsyncClient(timeout=10.0) as http:
        model = await _model(http, cfg.endpoints, cfg.model)
        where = (journal, journal)
        return await _real_client(
            http, cfg, cfg.clients[0], plans, model, prompts, where, lambda label: None
        )


def check_config(cfg: BenchConfig) -> None:
    """A clear error for a bad configuration, before anything runs."""
    for name in cfg.clients:
        spec = ClientSpec.parse(name)
        if spec.gateway is not None and cfg.endpoints:
            raise ValueError(
                f"client {name!r}: a modelled gateway (CLIENT>PEER) runs in front of the "
                "embedded engine only; against real servers give the real router's URL "
                "as the endpoint"
            )
    if cfg.users is not None and cfg.users < 1:
        raise ValueError("users must be >= 1")
    if cfg.users is not None and cfg.rate is not None:
        raise ValueError("give rate (open loop: Poisson arrivals) or users (closed loop), not both")
    if cfg.rate is not None and not cfg.rate > 0:
        raise ValueError("rate must be > 0 jobs per second")
    if isinstance(cfg.fleet, bool) or not isinstance(cfg.fleet, int) or cfg.fleet < 1:
        raise ValueError(f"fleet must be an int >= 1 (clients per client spec), not {cfg.fleet!r}")
    if cfg.fleet_assign not in FLEET_ASSIGNS:
        raise ValueError(
            f"fleet_assign must be one of {', '.join(FLEET_ASSIGNS)}, not {cfg.fleet_assign!r}"
        )
    for url in cfg.endpoints:
        Endpoint(url)  # as Runtime checks its endpoints: a scheme, a host, no whitespace
    if not cfg.endpoints:
        cfg.engine_config()  # fails on an unknown preset or a bad engine option


def prepare(cfg: BenchConfig) -> list[JobPlan]:
    """Check ``cfg`` and make its jobs: ``cfg.jobs`` of them, or a ValueError that says
    why there cannot be as many (a traces folder holding fewer traces)."""
    check_config(cfg)
    plans = make_workload(
        cfg.workload,
        cfg.jobs,
        Arrivals(cfg.rate, cfg.seed),
        seed=cfg.seed,
        traces=cfg.traces,
        tool_wait_s=cfg.tool_wait_s,
        long_share=cfg.long_share,
    )
    if len(plans) < cfg.jobs:
        raise ValueError(too_few_traces(cfg.jobs, len(plans), cfg.traces))
    return plans


def workload_key(cfg: BenchConfig) -> tuple[object, ...]:
    """What :func:`prepare` makes the jobs from: configurations with the same key replay
    the same jobs."""
    return (
        cfg.workload,
        cfg.jobs,
        cfg.rate,
        cfg.seed,
        cfg.traces,
        cfg.tool_wait_s,
        cfg.long_share,
    )


def bench_result(
    cfg: BenchConfig, plans: Sequence[JobPlan], clients: list[ClientResult], wall_s: float
) -> BenchResult:
    config = asdict(cfg)
    config["traces"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg.traces).items()
    }
    config["journal_dir"] = str(cfg.journal_dir) if cfg.journal_dir is not None else None
    config["endpoints"] = [redact_userinfo(u) for u in cfg.endpoints]  # no user:password@
    return BenchResult(
        config=config,
        virtual_time=not cfg.endpoints,
        wall_s=wall_s,
        calls=sum(p.calls() for p in plans),
        clients=clients,
    )


def run_bench(
    cfg: BenchConfig, progress: Progress | None = None, *, workers: Workers = 1
) -> BenchResult:
    """Run the benchmark (blocking: it starts its own event loops).

    On the embedded engine each client, and the solo runs, replay in their own event loop
    from virtual time 0. ``workers``: 1 runs them one by one in this process; N > 1 (or
    ``"auto"``: one per core) on a pool of N processes; ``"ray"`` on Ray (the ``ray``
    extra); the results are the same (see :func:`run_study`). Real servers
    (``cfg.endpoints``) are always run one client after the other, in this process."""
    if not cfg.endpoints:
        (result,) = run_study([cfg], workers=workers, progress=progress)
        return result
    plans = prepare(cfg)
    report: Progress = progress or (lambda label: None)
    _discard_journals(cfg)  # (journals append: none left by a run stopped midway)
    started = time.perf_counter()
    try:
        clients = anyio.run(_run_real, cfg, plans, report)
    except BaseException:
        _discard_journals(cfg)
        raise
    _keep_journals(cfg, clients)
    return bench_result(cfg, plans, clients, time.perf_counter() - started)


@dataclass(frozen=True, slots=True)
class _Replay:
    """One replay, as a pool worker or a Ray task receives it (with its jobs, pickled)."""

    cfg: BenchConfig
    part: int
    jobs_id: str
    """Names the pickled jobs: a worker that has unpickled them keeps them for the next
    replay of the same workload."""
    staged: bool = False
    """Journals beside their place (see :func:`replay_part`)."""


_jobs_cache: dict[str, list[JobPlan]] = {}
"""A worker process's last unpickled jobs (replays of the same jobs arrive together)."""


def _run_replay(replay: _Replay, jobs: bytes) -> PartResult:
    """A worker's entry point (a pool process or a Ray task)."""
    plans = _jobs_cache.get(replay.jobs_id)
    if plans is None:
        _jobs_cache.clear()
        plans = _jobs_cache[replay.jobs_id] = pickle.loads(jobs)
    try:
        return replay_part(replay.cfg, plans, replay.part, staged=replay.staged)
    except Exception as exc:
        raise portable(exc) from None


@dataclass(slots=True)
class _Run:
    """One configuration of a study: its jobs, its replays' results, its error."""

    cfg: BenchConfig
    plans: list[JobPlan] | None = None
    parts: dict[int, PartResult | BaseException] | None = None
    error: BaseException | None = None
    done_s: float = 0.0


def run_parts(
    parts: Sequence[tuple[BenchConfig, list[JobPlan], int]],
    done: Callable[[int, PartResult | BaseException], None],
    *,
    workers: Workers = "auto",
    progress: Progress | None = None,
    staged: bool = False,
) -> None:
    """Replay each ``(config, jobs, part)`` of ``parts`` (see :func:`replay_part`:
    :data:`ALONE` or a client's index): independent replays, in this process (``workers``
    1, or a single part), on a pool of processes or on Ray; results are the same
    wherever they run. ``done(index, result or exception)`` is called in this thread as
    each ends; an exception out of it stops the replays still running and is raised.
    A jobs list given for several parts (the same object) is pickled once and unpickled
    once per process. ``progress`` as :func:`run_bench` (in one go as a replay ends, when
    it ran elsewhere). The entry point for a grid of replays whose jobs are made by the
    caller; :func:`run_study` runs :class:`BenchConfig` runs through it (``staged``: the
    journals beside their place, as :func:`replay_part`). Blocking."""
    where = check_workers(workers)
    report: Progress = progress or (lambda label: None)
    if where == 1 or len(parts) <= 1:
        for index, (cfg, plans, part) in enumerate(parts):
            try:
                result: PartResult | BaseException = replay_part(
                    cfg, plans, part, report, staged=staged
                )
            except Exception as exc:
                result = exc
            done(index, result)
        return

    def finished(index: int, result: PartResult | BaseException) -> None:
        cfg, plans, part = parts[index]
        done(index, result)
        if not isinstance(result, BaseException):
            label = part_label(cfg, part)
            for _ in plans:
                report(label)

    batch = uuid.uuid4().hex
    ids: dict[int, str] = {}
    shared: dict[str, bytes] = {}
    replays: list[tuple[_Replay, str]] = []
    for cfg, plans, part in parts:
        key = ids.get(id(plans))
        if key is None:
            key = ids[id(plans)] = f"{batch}-{len(ids)}"
            shared[key] = pickle.dumps(plans, protocol=pickle.HIGHEST_PROTOCOL)
        replays.append((_Replay(cfg, part, key, staged), key))
    run_replays(_run_replay, replays, shared, where, finished)


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: Literal[False] = ...,
) -> list[BenchResult]: ...


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: Literal[True],
) -> list[BenchResult | Exception]: ...


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: bool,
) -> list[BenchResult] | list[BenchResult | Exception]: ...


def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = "auto",
    progress: Progress | None = None,
    return_exceptions: bool = False,
) -> list[BenchResult] | list[BenchResult | Exception]:
    """Run every configuration, their replays spread over ``workers``; one result per
    configuration, in order, the same as ``[run_bench(c) for c in configs]`` except for
    ``wall_s`` (here: seconds from the study's start to the configuration's last replay).

    Configurations that replay the same jobs (the same workload, jobs, rate, seed, traces,
    ...) share them: they are made once. Real servers (``endpoints``) run in this process,
    one configuration after the other, before the rest. ``progress`` is called with the
    replay's label (``alone`` or the client's name) once per job, as the replay ends when
    it runs elsewhere. ``return_exceptions``: a configuration that fails (a bad option, an
    engine error) gives its exception in its place and the others run; otherwise the first
    error is raised and the replays not yet started are cancelled. Blocking."""
    where = check_workers(workers)
    runs = [_Run(cfg) for cfg in configs]
    _check_journals(configs)
    made: dict[tuple[object, ...], list[JobPlan]] = {}
    for run in runs:
        try:
            if run.cfg.endpoints:
                continue
            key = workload_key(run.cfg)
            if key not in made:
                made[key] = prepare(run.cfg)
            else:
                check_config(run.cfg)
            run.plans = made[key]
        except Exception as exc:
            if not return_exceptions:
                raise
            run.error = exc
    results: list[BenchResult | Exception] = []
    for run in runs:  # real servers: wall-clock time, one client at a time, here
        if run.cfg.endpoints and run.error is None:
            try:
                results.append(run_bench(run.cfg, progress))
            except Exception as exc:
                if not return_exceptions:
                    raise
                run.error = exc

    jobs = [
        (i, part)
        for i, run in enumerate(runs)
        if run.plans is not None and run.error is None
        for part in sim_parts(run.cfg)
    ]
    for run in runs:
        if run.plans is not None and run.error is None:
            _discard_journals(run.cfg)  # (journals append: none left by a stopped run)
            run.parts = {}
    started = time.perf_counter()

    def done(index: int, result: PartResult | BaseException) -> None:
        i, part = jobs[index]
        run = runs[i]
        assert run.parts is not None
        run.parts[part] = result
        run.done_s = time.perf_counter() - started
        if isinstance(result, BaseException) and not return_exceptions:
            raise result

    items = []
    for i, part in jobs:
        plans = runs[i].plans
        assert plans is not None
        items.append((runs[i].cfg, plans, part))
    try:
        run_parts(items, done, workers=where, progress=progress, staged=True)
    except BaseException:
        for run in runs:
            if run.parts is not None:
                _discard_journals(run.cfg)
        raise

    out: list[BenchResult | Exception] = []
    real = iter(results)
    for run in runs:
        if run.error is not None:
            out.append(_as_exception(run.error))
        elif run.cfg.endpoints:
            out.append(next(real))
        else:
            assert run.parts is not None and run.plans is not None
            failed = [r for p, r in sorted(run.parts.items()) if isinstance(r, BaseException)]
            if failed:
                _discard_journals(run.cfg)
                out.append(_as_exception(failed[0]))
            else:
                parts = {p: r for p, r in run.parts.items() if not isinstance(r, BaseException)}
                clients = sim_clients(run.cfg, parts)
                _keep_journals(run.cfg, clients)
                out.append(bench_result(run.cfg, run.plans, clients, run.done_s))
    return out


def _as_exception(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")


def _check_journals(configs: Sequence[BenchConfig]) -> None:
    seen: set[str] = set()
    for cfg in configs:
        for path in journal_paths(cfg):
            if path is None:
                continue
            name = str(path.resolve())
            if name in seen:
                raise ValueError(
                    f"two configurations of the study write the journal {path}: give each "
                    "its own journal_dir"
                )
            seen.add(name)
