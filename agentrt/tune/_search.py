"""The grid and its replays: which settings to try, at which loads, on which jobs.

Each replay is one bench part (:func:`agentrt.bench._runner.replay_part`): one client (a
fleet of as many processes as the journal's, each with the setting) on its own embedded
cluster (the calibrated engine) in its own virtual-time loop, so replays
run on the bench's process pool in any order with the results of one by one. The search
is coarse to fine:

1. **coarse**: the recorded settings and every one-setting change of them (routing,
   policy, concurrency limit, priority pass-through, learned tool waits), on one sample
   of the jobs (a window of consecutive arrivals, the observed load and burstiness), at
   each load;
2. **fine**: the recorded settings, the best of the coarse ones, and the best value of
   each setting combined, on ``seeds`` samples spread over the journal, at each load;
   the spread of the ratios over the samples says how sure the ranking is.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pickle
import secrets
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._stats import quantile
from ..bench._drivers import ENGINE_POLL_S
from ..bench._fleet import FleetAssign
from ..bench._parallel import Workers, check_workers, portable, run_replays
from ..bench._plan import JobPlan
from ..bench._runner import ALONE, BenchConfig, ClientRun, PartResult, replay_part
from ..sim import EngineConfig
from ._workload import scale_arrivals, window

__all__ = ["CONCURRENCY", "LOADS", "POLICIES", "ROUTINGS", "Score", "Setting"]

ROUTINGS: tuple[str, ...] = ("session_affinity", "least_loaded", "round_robin")
"""The routings tune tries (``Runtime(routing=...)``)."""
POLICIES: tuple[str, ...] = ("fcfs", "plas", "mlfq")
"""The scheduling policies tune tries (``Runtime(policy=...)``)."""
Concurrency = int | Literal["auto", "engine"] | None
CONCURRENCY: tuple[Concurrency, ...] = ("engine", "auto", 4)
"""The per-endpoint concurrency limits tune tries (``Runtime(concurrency=...)``).
``engine`` (Runtime's default: no client-side cap unless the engine's metrics show a
queue) is the real adaptive cap: the twin's client polls the replicas' metrics every
second (``poll_metrics_s``), and the file tune writes sets ``poll_metrics_s`` beside it
(without polling it never caps)."""
LOADS: tuple[float, ...] = (1.0, 1.5, 2.0)
"""The loads every setting is replayed at, as multiples of the observed one (the
journals' arrival gaps divided): the keys of :attr:`Score.p50` and :attr:`Score.p90`."""
STRETCH_SLO = 2.0
"""Throughput is the highest load at which the p90 stretch stays at or below this."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One configuration of the grid, as ``Runtime`` keyword arguments (or ``plain``:
    a bare client, when the journal was recorded with one). ``Setting()`` is Runtime's
    defaults over several endpoints (where ``concurrency="engine"`` polls the engines'
    metrics and caps while one queues)."""

    routing: str = "session_affinity"
    policy: str = "fcfs"
    concurrency: Concurrency = "engine"
    send_priority: bool | Literal["auto"] = "auto"
    learn_waits: bool = True
    plain: bool = False

    @staticmethod
    def of(settings: dict[str, Any]) -> Setting:
        """The setting of ``Runtime`` keyword arguments (a journal's ``runtime``, a
        settings file's keys). ``concurrency="engine"`` with no ``poll_metrics_s`` never
        capped: it is the setting with no cap."""
        if settings.get("plain"):
            return Setting(plain=True)
        concurrency = settings.get("concurrency")
        if not (
            concurrency is None
            or concurrency in ("auto", "engine")
            or (isinstance(concurrency, int) and not isinstance(concurrency, bool))
        ):
            concurrency = "engine"
        routing = str(settings.get("routing") or "session_affinity")
        policy = str(settings.get("policy") or "fcfs")
        poll = settings.get("poll_metrics_s")
        if poll == "auto":  # Runtime's default: polled where a decision reads the load
            endpoints = settings.get("endpoints")
            polled = (isinstance(endpoints, int) and endpoints > 1) or policy != "fcfs"
        else:
            polled = bool(poll)
        if concurrency == "engine" and not polled:
            concurrency = None
        priority = settings.get("send_priority")
        send_priority: bool | Literal["auto"] = "auto" if priority == "auto" else bool(priority)
        return Setting(
            routing if routing in (*ROUTINGS, "hash") else "session_affinity",
            policy if policy in (*POLICIES, "atlas", "edf") else "fcfs",
            concurrency,
            # "auto" is kept (and written back); the twin replays it as off: its
            # replicas schedule FCFS, so "auto" would send them no priorities.
            send_priority,
            settings.get("learn_waits") is not False,
        )

    def spec(self) -> str:
        """The bench client that runs with these settings."""
        if self.plain:
            return "plain"
        # The twin's replicas schedule FCFS unless priorities are sent: "auto" sends none.
        # "engine": the adaptive cap, the client polling the replicas' metrics.
        limit = "none" if self.concurrency is None else str(self.concurrency)
        return (
            f"agentrt:routing={self.routing},policy={self.policy},concurrency={limit},"
            f"priority={'on' if self.send_priority is True else 'off'},"
            f"declare={'learned' if self.learn_waits else 'none'}"
        )

    def label(self) -> str:
        """A short name: ``session+plas@auto,prio,nolearn``."""
        if self.plain:
            return "plain client"
        short = {"session_affinity": "session", "least_loaded": "least", "round_robin": "rr"}
        text = f"{short.get(self.routing, self.routing)}+{self.policy}"
        if self.concurrency != "engine":
            text += f"@{'none' if self.concurrency is None else self.concurrency}"
        if self.send_priority is True:
            text += ",prio"
        elif self.send_priority is False:
            text += ",noprio"
        if not self.learn_waits:
            text += ",nolearn"
        return text

    def runtime_kwargs(self) -> dict[str, Any]:
        """The settings as ``Runtime`` keyword arguments (``"engine"`` with the metrics
        polled, as the twin replayed it)."""
        out: dict[str, Any] = {
            "routing": self.routing,
            "policy": self.policy,
            "concurrency": self.concurrency,
        }
        if self.concurrency == "engine":
            out["poll_metrics_s"] = ENGINE_POLL_S
        out["send_priority"] = self.send_priority
        out["learn_waits"] = self.learn_waits
        return out


def neighbours(base: Setting) -> list[Setting]:
    """``base`` and every setting that differs from it in one dimension (from plain:
    from Runtime's defaults)."""
    start = Setting() if base.plain else base
    out = [base] if base.plain else []
    out.append(start)
    for r in ROUTINGS:
        out.append(_with(start, routing=r))
    for p in POLICIES:
        out.append(_with(start, policy=p))
    for c in CONCURRENCY:
        out.append(_with(start, concurrency=c))
    out.append(_with(start, send_priority=start.send_priority is not True))
    out.append(_with(start, learn_waits=not start.learn_waits))
    return list(dict.fromkeys(out))


def _with(s: Setting, **changes: Any) -> Setting:
    return dataclasses.replace(s, plain=False, **changes)


@dataclass(slots=True)
class TwinConfig(BenchConfig):
    """A bench run on the twin's calibrated engine (not a preset)."""

    engine: EngineConfig | None = None

    def engine_config(self) -> EngineConfig:
        base = self.engine if self.engine is not None else BenchConfig.engine_config(self)
        return base.replace(stream_interval=self.stream_interval)


_plans: dict[str, list[JobPlan]] = {}
"""A worker's unpickled jobs, by key (a handful: replays come grouped by sample)."""


def replay(description: tuple[TwinConfig, int, str], jobs: bytes) -> PartResult:
    """One replay (a pool worker's entry point): a bench part of the jobs ``jobs``."""
    cfg, part, key = description
    plans = _plans.get(key)
    if plans is None:
        if len(_plans) > 8:
            _plans.clear()
        plans = _plans[key] = pickle.loads(jobs)
    try:
        return replay_part(cfg, plans, part)
    except Exception as exc:
        raise portable(exc) from None


@dataclass(slots=True)
class Outcome:
    """One setting's replays: per (sample, load) its JCTs by job."""

    setting: Setting
    jct: dict[tuple[int, float], dict[str, float]] = field(default_factory=dict)


@dataclass(slots=True)
class Score:
    """A setting's prediction, relative to the recorded setting."""

    setting: Setting
    p50: dict[float, float]
    """Per load (:data:`LOADS`): JCT p50 over the recorded setting's (geometric mean
    over samples)."""
    p90: dict[float, float]
    """Per load: JCT p90 over the recorded setting's, likewise."""
    rate: float
    """Load (times the observed) it sustains at p90 stretch <= 2, over the recorded's."""
    rate_abs: float
    """That load itself, times the observed (the recorded one's: ``rate_abs / rate``)."""
    score: float
    """Geometric mean of sqrt(p50 * p90) ratios over loads and samples: lower is better."""
    spread: float
    """Standard deviation of the per-sample scores (0 with one sample)."""
    samples: list[float]
    """The score in each window."""


@dataclass(slots=True)
class Twin:
    """The jobs, the engine and the cluster the grid replays on."""

    plans: list[JobPlan]
    engine: EngineConfig
    replicas: int
    sample: int
    workers: Workers = "auto"
    progress: Callable[[], None] = lambda: None
    alone: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per sample: each job's JCT alone on an idle cluster."""
    done: dict[tuple[Setting, int, int, float], dict[str, float]] = field(default_factory=dict)
    """Replays run so far, by (setting, window index, windows, load): their JCTs."""
    warmup: int = 0
    """Jobs replayed before each window (not counted), so that it starts loaded."""
    cooldown_s: float = 0.0
    """Seconds after a window's last arrival whose arrivals are replayed too (not
    counted), so that its jobs compete with the later ones as when recorded."""
    fleet: int = 1
    """Each setting is replayed as a fleet of this many processes, each with it
    (``BenchConfig.fleet``)."""
    fleet_assign: FleetAssign = "round_robin"
    """How the fleet's jobs are dealt: ``plan``, each to the member that ran it in the
    journal (its ``JobPlan.worker``), or ``round_robin`` by arrival."""
    gateway: str | None = None
    """A modelled peer in front of the replicas: every setting is replayed behind it
    (``CLIENT>PEER``), agentrt speaking its dialect."""
    tag: str = field(default_factory=lambda: secrets.token_hex(4))
    """Begins the keys of this twin's jobs, so that the jobs a process keeps by key
    (``_plans``) are never another twin's: the replays run in this process with one
    worker, and two tunes there share it."""

    def _cfg(self, spec: str, stretch: bool = False) -> TwinConfig:
        if self.gateway is not None:
            spec = f"{spec}>{self.gateway}"  # the alone replay: agentrt direct either way
        return TwinConfig(
            clients=(spec,),
            replicas=self.replicas,
            stretch=stretch,
            api="http",
            kv_sample_s=3600.0,
            fleet=self.fleet,
            fleet_assign=self.fleet_assign,
            engine=self.engine,
        )

    def jobs(self, index: int, count: int) -> tuple[list[JobPlan], set[str]]:
        return window(self.plans, self.sample, index, count, self.warmup, self.cooldown_s)

    def run(self, settings: Sequence[Setting], samples: Sequence[tuple[int, int]]) -> list[Outcome]:
        """Replay every setting on every sample (``(index, count)`` windows) at every
        load, and each sample's jobs alone once."""
        replays: list[tuple[tuple[TwinConfig, int, str], str]] = []
        shared: dict[str, bytes] = {}
        keys: list[tuple[int, int, float]] = []  # (setting, sample, load); -1: alone
        counted: dict[int, set[str]] = {}
        for index, count in samples:
            plans, counted[index] = self.jobs(index, count)
            if index not in self.alone:
                key = f"{self.tag}:a{index}-{count}"
                mine = [p for p in plans if p.name in counted[index]]
                shared[key] = pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL)
                replays.append(((self._cfg("agentrt:session"), ALONE, key), key))
                keys.append((-1, index, 1.0))
            for load in LOADS:
                key = f"{self.tag}:s{index}-{count}-{load}"
                loaded = scale_arrivals(plans, load)
                shared[key] = pickle.dumps(loaded, protocol=pickle.HIGHEST_PROTOCOL)
                for k, setting in enumerate(settings):
                    if (setting, index, count, load) in self.done:
                        continue  # replayed in an earlier round: the same jobs
                    replays.append(((self._cfg(setting.spec()), 0, key), key))
                    keys.append((k, index, load))
        counts = dict(samples)
        outcomes = [Outcome(s) for s in settings]
        for k, setting in enumerate(settings):
            for index, count in samples:
                for load in LOADS:
                    jct = self.done.get((setting, index, count, load))
                    if jct is not None:
                        outcomes[k].jct[(index, load)] = jct

        def done(index: int, result: PartResult | BaseException) -> None:
            if isinstance(result, BaseException):
                raise result
            k, sample, load = keys[index]
            if k == -1:
                assert isinstance(result, dict)
                self.alone[sample] = result
            else:
                assert isinstance(result, ClientRun)
                names = counted[sample]
                jct = {
                    r.name: r.jct_s for r in result.results if r.status == "ok" and r.name in names
                }
                outcomes[k].jct[(sample, load)] = jct
                self.done[(outcomes[k].setting, sample, counts[sample], load)] = jct
            self.progress()

        workers = check_workers(self.workers)
        if workers == 1 or len(replays) <= 1:
            for i, (description, key) in enumerate(replays):
                done(i, replay(description, shared[key]))
        else:
            run_replays(replay, replays, shared, workers, done)
        return outcomes


def score(
    outcomes: Sequence[Outcome], recorded: Outcome, alone: dict[int, dict[str, float]]
) -> list[Score]:
    """Each setting's ratios to the recorded setting, best first."""
    samples = sorted({s for s, _ in recorded.jct})
    out = []
    base_rate = {s: _rate(recorded, s, alone.get(s, {})) for s in samples}
    for o in outcomes:
        per_sample: list[float] = []
        p50: dict[float, list[float]] = {load: [] for load in LOADS}
        p90: dict[float, list[float]] = {load: [] for load in LOADS}
        rates: list[float] = []
        rates_abs: list[float] = []
        for s in samples:
            logs = []
            for load in LOADS:
                mine, base = o.jct.get((s, load)), recorded.jct.get((s, load))
                if not mine or not base:
                    continue
                ours, ref = sorted(mine.values()), sorted(base.values())
                r50 = quantile(ours, 0.5) / quantile(ref, 0.5)
                r90 = quantile(ours, 0.9) / quantile(ref, 0.9)
                p50[load].append(r50)
                p90[load].append(r90)
                logs.append(0.5 * (math.log(r50) + math.log(r90)))
            if logs:
                per_sample.append(math.exp(statistics.fmean(logs)))
            rate = _rate(o, s, alone.get(s, {}))
            rates_abs.append(rate)
            rates.append(rate / base_rate[s] if base_rate[s] > 0 else math.nan)
        if not per_sample:
            continue
        out.append(
            Score(
                o.setting,
                {load: _gmean(v) for load, v in p50.items()},
                {load: _gmean(v) for load, v in p90.items()},
                _gmean(rates),
                _gmean(rates_abs),
                _gmean(per_sample),
                statistics.pstdev(per_sample) if len(per_sample) > 1 else 0.0,
                per_sample,
            )
        )
    # Within 0.5%: the recorded settings first (no change for nothing), then by rate.
    out.sort(
        key=lambda s: (
            round(s.score, 3) if s.setting != recorded.setting else round(s.score, 3) - 0.005,
            -s.rate,
        )
    )
    return out


def _gmean(values: Sequence[float]) -> float:
    ok = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in ok)) if ok else math.nan


def _rate(o: Outcome, sample: int, alone: dict[str, float]) -> float:
    """The load (times the observed) at which the p90 stretch reaches the SLO, linearly
    between the loads tried; the last load when it never does, a fraction of the first
    (first / its stretch * SLO) when it always does."""
    points = []
    for load in LOADS:
        jct = o.jct.get((sample, load))
        if not jct:
            continue
        ratios = sorted(t / alone[n] for n, t in jct.items() if alone.get(n))
        if ratios:
            points.append((load, quantile(ratios, 0.9)))
    if not points:
        return math.nan
    if points[0][1] > STRETCH_SLO:
        return points[0][0] * STRETCH_SLO / points[0][1]
    for (l1, s1), (l2, s2) in itertools.pairwise(points):
        if s2 > STRETCH_SLO:
            return l1 + (STRETCH_SLO - s1) * (l2 - l1) / (s2 - s1) if s2 > s1 else l1
    return points[-1][0]


def combine(base: Setting, coarse: Sequence[Score]) -> Setting:
    """Per dimension, the value of the best-scoring one-change setting (where it beats
    ``base``), combined."""
    start = Setting() if base.plain else base
    own = next((s.score for s in coarse if s.setting == start), 1.0)
    best: dict[str, tuple[float, Any]] = {}
    for s in coarse:
        if s.setting.plain:
            continue
        for name in ("routing", "policy", "concurrency", "send_priority", "learn_waits"):
            value = getattr(s.setting, name)
            if value != getattr(start, name) and s.score < own:
                if name not in best or s.score < best[name][0]:
                    best[name] = (s.score, value)
    return _with(start, **{k: v for k, (_, v) in best.items()})
