"""``agentrt tune JOURNAL...``: journals in, a ranked table and a TOML file out."""

from __future__ import annotations

import math
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ..bench._fleet import FleetAssign
from ..bench._parallel import Workers
from ..sim import PRESETS, EngineConfig
from ._fit import Fit, from_journal, from_probe, read_cache_config
from ._search import LOADS, Score, Setting, Twin, combine, neighbours, score
from ._workload import JournalError, Observed, load, to_plans

__all__ = ["TuneResult", "tune"]

WIDTH = 80
MIN_GAIN = 0.02
"""The best settings must beat the recorded ones' score by this share to be chosen: the
twin's calibration is no finer than that."""


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """What :func:`tune` was asked (its arguments, which say what each is)."""

    journals: Sequence[Path]
    endpoint: str | None = None
    model: str | None = None
    preset: str = "h100-8b"
    replicas: int | None = None
    sample: int = 150
    seeds: int = 3
    top: int = 3
    warmup: int | None = None
    """Jobs replayed before each window, not counted (None: a third of ``sample``)."""
    gpu_blocks: int | None = None
    """The twin's KV blocks per replica, in the engine's blocks of ``block_size`` tokens
    (vLLM's ``# GPU blocks``); None: read from ``endpoint``'s metrics, else the preset's."""
    host_blocks: int | None = None
    """The twin's host-tier KV blocks per replica (same units); None: the preset's."""
    block_size: int | None = None
    """Tokens per block of ``gpu_blocks`` / ``host_blocks`` (None: the preset's)."""
    workers: Workers = "auto"
    progress: bool | None = None
    force: bool = False
    """Tune a journal shorter than one ``sample`` anyway (``--force``): its one replay
    per setting cannot rank them (confidence low)."""
    fleet: int | None = None
    """The processes that will each run the settings (``--fleet``); None: as many as
    the journals' runtimes that ran jobs at once (:attr:`Observed.fleet`)."""
    gateway: str | None = None
    """A modelled peer (``--gateway``, :mod:`agentrt.sim.peers`) in front of the twin's
    replicas, as the router the agents call through; None: straight to the replicas."""


Confidence = Literal["high", "medium", "low"]


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What :func:`tune` found: the settings ranked by their predicted JCT (best first),
    the ones the journals were recorded with, the one to apply (:attr:`chosen`), and how
    the search went. :meth:`runtime_kwargs` gives the chosen settings as ``Runtime``
    keyword arguments, :meth:`to_toml` as the settings file ``agentrt tune`` writes
    (``Runtime(config=FILE)`` reads it), :meth:`table` as the table it prints."""

    ranked: list[Score]
    """Every setting of the fine round, best (lowest score) first."""
    recorded: Setting
    """The settings the journals were recorded with: every ratio is to theirs."""
    recorded_known: bool
    """False where the journals did not say them (Runtime's defaults were assumed)."""
    fit: Fit
    """How the embedded engine was calibrated."""
    jobs: int
    """The jobs the journals hold (the workload replayed)."""
    sample: int
    """Jobs per replayed window."""
    seeds: int
    """Windows the finalists were replayed on."""
    replays: int
    """Replays run in all."""
    wall_s: float
    """Seconds the search took."""
    confidence: Confidence
    """How sure the pick is, from the spread of the scores over the windows: ``high``,
    ``medium`` or ``low`` (always ``low`` over one window)."""
    capacity: str = ""
    """The twin's KV capacity per replica and where it came from (one line)."""
    fleet: int = 1
    """The processes each setting was replayed as (``BenchConfig.fleet``)."""
    fleet_source: str = "journal"
    """Where :attr:`fleet` came from: ``journal`` (its runtimes) or ``--fleet`` (the
    ``fleet`` argument)."""
    journals: tuple[Path, ...] = ()
    """The journals tuned."""

    @property
    def chosen(self) -> Score | None:
        """The settings to apply: the best, if its score beats the recorded settings' by
        2% (the calibration is no finer), else the recorded ones; None when nothing was
        ranked."""
        if not self.ranked:
            return None
        best = self.ranked[0]
        recorded = next((s for s in self.ranked if s.setting == self.recorded), None)
        if recorded is not None and best.score > recorded.score * (1.0 - MIN_GAIN):
            return recorded
        return best

    def runtime_kwargs(self) -> dict[str, Any]:
        """The chosen settings as ``Runtime`` keyword arguments (``Runtime(urls,
        **result.runtime_kwargs())``), as the twin replayed them (``poll_metrics_s``
        beside ``concurrency="engine"``); Runtime's defaults where the chosen one is a
        plain client (a bare client has no settings to apply)."""
        best = self.chosen
        setting = best.setting if best is not None else self.recorded
        return (Setting() if setting.plain else setting).runtime_kwargs()

    def to_toml(self) -> str:
        """The chosen settings as the file ``agentrt tune`` writes: the keyword
        arguments of :meth:`runtime_kwargs`, top-level keys, ``"none"`` for None (TOML
        has no null; ``Runtime(config=FILE)`` reads it back), after comments saying
        where they came from and what was predicted."""
        return to_toml(self)

    def table(self) -> list[str]:
        """The ranked table ``agentrt tune`` prints, one string per line (80 columns)."""
        return table(self)


def tune(
    journals: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    endpoint: str | None = None,
    model: str | None = None,
    preset: str = "h100-8b",
    replicas: int | None = None,
    fleet: int | None = None,
    gateway: str | None = None,
    sample: int = 150,
    seeds: int = 3,
    top: int = 3,
    warmup: int | None = None,
    gpu_blocks: int | None = None,
    host_blocks: int | None = None,
    block_size: int | None = None,
    workers: Workers = "auto",
    force: bool = False,
    progress: bool | None = False,
    echo: Callable[[str], None] | None = None,
) -> TuneResult:
    """Pick the settings for the workload in ``journals``: what ``agentrt tune`` runs
    (docs/tune.md), blocking, in virtual time on the embedded engine. It writes no
    file: :meth:`TuneResult.to_toml` is the file's text.

    The journals' jobs are replayed on the embedded engine calibrated to their own
    latencies (or to a probe of ``endpoint``) under a grid of settings
    (:data:`ROUTINGS`, :data:`POLICIES`, :data:`CONCURRENCY`, priorities, learned tool
    waits), coarse to fine, at each of :data:`LOADS`, and ranked by predicted JCT
    against the settings they were recorded with.

    Args:
        journals: journal files (JSON lines, as ``Runtime(journal=...)`` writes them):
            one path or several, one workload.
        endpoint: calibrate the engine by probing this idle OpenAI-compatible server
            (and read its KV capacity from its ``/metrics``); None: from the journals'
            latencies.
        model: the model named in the probe's calls (None: the server's).
        preset: the ``agentrt.sim.PRESETS`` engine calibrated, whose limits are kept.
        replicas: the twin's replicas (None: the journals' endpoints).
        fleet: the processes that will each run the settings (None: the journals'
            runtimes that ran jobs at once).
        gateway: a modelled router (``agentrt.sim.peers``) in front of the replicas,
            which the agents call through.
        sample: jobs per replayed window (at least 2).
        seeds: windows the finalists are replayed on (their spread: the confidence).
        top: coarse settings kept for the fine round.
        warmup: jobs replayed before each window, not counted (None: a third of
            ``sample``).
        gpu_blocks: the twin's KV blocks per replica, in blocks of ``block_size``
            tokens (vLLM's ``# GPU blocks``; None: ``endpoint``'s metrics, else the
            preset's).
        host_blocks: host-tier KV blocks per replica (same units; None: the preset's).
        block_size: tokens per block of ``gpu_blocks`` and ``host_blocks`` (None: the
            preset's).
        workers: processes the replays run on (``"auto"``: one per core; 1: this
            process; ``"ray"``).
        force: tune journals shorter than one ``sample`` anyway (one window:
            confidence low); without it they raise ValueError.
        progress: count the replays on stderr: a bar where it is a terminal, else a
            line every 10 s; None: the bar on a terminal, nothing elsewhere (the
            command's default).
        echo: called with the header the command prints before the replays (the
            workload, the calibration, the fleet, the KV capacity).

    Raises:
        ValueError: a bad argument, or journals that cannot be tuned (unreadable,
            without jobs, or shorter than ``sample`` without ``force``), in one line,
            before any replay.
    """
    paths = [journals] if isinstance(journals, str | os.PathLike) else list(journals)
    opts = TuneOptions(
        journals=tuple(Path(p) for p in paths),
        endpoint=endpoint,
        model=model,
        preset=preset,
        replicas=replicas,
        sample=sample,
        seeds=seeds,
        top=top,
        warmup=warmup,
        gpu_blocks=gpu_blocks,
        host_blocks=host_blocks,
        block_size=block_size,
        workers=workers,
        progress=progress,
        force=force,
        fleet=fleet,
        gateway=gateway,
    )
    return run(opts, echo or (lambda line: None))


def run(opts: TuneOptions, echo: Callable[[str], None]) -> TuneResult:
    """Run the whole tune (blocking): :func:`tune`'s body."""
    if opts.preset not in PRESETS:
        raise ValueError(f"unknown preset {opts.preset!r}; known: {', '.join(PRESETS)}")
    if opts.sample < 2 or opts.seeds < 1 or opts.top < 1:
        raise ValueError("--sample must be >= 2, --seeds and --top >= 1")
    if opts.warmup is not None and opts.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {opts.warmup}")
    for name, blocks in (
        ("--gpu-blocks", opts.gpu_blocks),
        ("--host-blocks", opts.host_blocks),
        ("block_size", opts.block_size),
    ):
        if blocks is not None and (isinstance(blocks, bool) or blocks < 1):
            raise ValueError(f"{name} must be a whole number of blocks >= 1, got {blocks}")
    k = opts.fleet
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"--fleet must be a whole number of processes >= 1, got {k!r}")
    started = time.perf_counter()
    observed = load(opts.journals)
    plans = to_plans(observed.reports, observed.runtimes)
    if len(plans) < opts.sample and not opts.force:
        raise JournalError(_too_short(len(plans), opts.sample))
    fleet = observed.fleet if opts.fleet is None else opts.fleet
    # The journal's dealing holds for its own fleet size; another is dealt round-robin.
    assign: FleetAssign = "plan" if fleet == observed.fleet else "round_robin"
    engine = PRESETS[opts.preset]
    if opts.endpoint:
        engine, fit = from_probe(opts.endpoint, engine, opts.model)
    else:
        engine, fit = from_journal(observed.reports, engine)
    engine, capacity = kv_capacity(opts, engine)
    recorded = Setting.of(observed.recorded)
    replicas = opts.replicas or observed.replicas
    sample = min(opts.sample, len(plans))
    seeds = 1 if sample >= len(plans) else opts.seeds
    coarse_set = neighbours(recorded)
    fine_max = 2 + opts.top
    # (the fine round skips the coarse window's replays of the recorded and top settings)
    kept = min(opts.top, len(coarse_set) - 1) + 1
    total = len(coarse_set) * len(LOADS) + 1 + seeds * (fine_max * len(LOADS) + 1)
    total -= kept * len(LOADS) + 1
    warmup = sample // 3 if opts.warmup is None else opts.warmup
    # The jobs that arrive while a window's jobs run compete with them: replayed too,
    # for the recorded median job's time after the window's last arrival.
    jcts = sorted(r.jct_s for r in observed.reports if r.jct_s is not None)
    cooldown_s = statistics.median(jcts) if jcts else 0.0
    echo(_intro(opts, observed, len(plans), fit, recorded, replicas, sample, seeds))
    if sample < len(plans):
        echo(
            f"  each after up to {warmup} earlier jobs, with those arriving {cooldown_s:.0f} s"
            " after it\n  (the recorded JCT p50), replayed but not counted"
        )
    echo(_fleet_line(opts, observed, fleet))
    if opts.gateway is not None:
        from ..sim.peers import peer_dialect

        echo(
            f"gateway: every setting replayed behind {opts.gateway} (a modelled peer),\n"
            f"  agentrt speaking its dialect, {peer_dialect(opts.gateway)}"
        )
    echo(capacity)
    terminal = sys.stderr.isatty()
    on = terminal if opts.progress is None else opts.progress
    replays = 0
    with _Progress(total, bar=on and terminal, lines=on is not False and not terminal) as bar:

        def tick() -> None:
            nonlocal replays
            replays += 1
            bar.tick()

        twin = Twin(
            plans,
            engine,
            replicas,
            sample,
            opts.workers,
            tick,
            warmup=warmup,
            cooldown_s=cooldown_s,
            fleet=fleet,
            fleet_assign=assign,
            gateway=opts.gateway,
        )
        # Coarse: one-setting changes, on one of the fine round's windows (the middle).
        middle = [(seeds // 2, seeds)]
        coarse_out = twin.run(coarse_set, middle)
        base = next(o for o in coarse_out if o.setting == recorded)
        coarse = score(coarse_out, base, twin.alone)
        fine_set = [recorded, combine(recorded, coarse)]
        fine_set += [s.setting for s in coarse if s.setting != recorded][: opts.top]
        fine_set = list(dict.fromkeys(fine_set))
        # The fine round's replays, now that its settings are known (the total counted
        # the most there could be).
        fine_left = seeds * (len(fine_set) * len(LOADS) + 1)
        fine_left -= sum(x in coarse_set for x in fine_set) * len(LOADS) + 1
        bar.retotal(replays + max(0, fine_left))
        # Fine: the best few, on ``seeds`` windows spread over the journal.
        windows = [(i, seeds) for i in range(seeds)]
        fine_out = twin.run(fine_set, windows)
        base = next(o for o in fine_out if o.setting == recorded)
        ranked = score(fine_out, base, twin.alone)
    result = TuneResult(
        ranked,
        recorded,
        observed.recorded_known,
        fit,
        len(plans),
        sample,
        seeds,
        replays,
        time.perf_counter() - started,
        _confidence(ranked, recorded),
        capacity,
        fleet,
        "journal" if opts.fleet is None else "--fleet",
        tuple(opts.journals),
    )
    return result


PROGRESS_EVERY_S = 10.0
"""How often tune says how far it is when its stderr is not a terminal, seconds."""


class _Progress:
    """tune's progress on stderr, counting replays: a rich bar on a terminal (``bar``,
    kept when done), else (``lines``) one line every :data:`PROGRESS_EVERY_S` seconds
    and one at the end; nothing when neither."""

    def __init__(self, total: int, *, bar: bool, lines: bool, every_s: float = PROGRESS_EVERY_S):
        self.total = total
        self.done = 0
        self._lines = lines
        self._every_s = every_s
        self._started = self._said = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        if bar:
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            except ImportError:
                self._lines = True
            else:
                self._bar = Progress(
                    TextColumn("tune"), BarColumn(), MofNCompleteColumn(), TextColumn("replays")
                )

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.__enter__()
            self._task = self._bar.add_task("tune", total=self.total)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            if exc_info[0] is None:
                self._bar.update(self._task, total=self.done, completed=self.done)
            self._bar.__exit__(*exc_info)
        elif self._lines and exc_info[0] is None:
            self._say(done=True)

    def retotal(self, total: int) -> None:
        """The replays there will be, known better."""
        self.total = max(total, self.done)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def tick(self) -> None:
        """One replay done."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1)
        elif self._lines and time.monotonic() - self._said >= self._every_s:
            self._say()

    def _say(self, done: bool = False) -> None:
        self._said = now = time.monotonic()
        total = self.done if done else max(self.total, self.done)
        end = ", done" if done else ""
        print(
            f"tune: {self.done}/{total} replays, {now - self._started:.0f} s{end}",
            file=sys.stderr,
            flush=True,
        )


def kv_capacity(opts: TuneOptions, engine: EngineConfig) -> tuple[EngineConfig, str]:
    """``engine`` with the KV capacity the journal's engines had, and a line saying it:
    ``--gpu-blocks`` / ``--host-blocks`` where given (in blocks of ``block_size`` tokens,
    the preset's by default), else the ``vllm:cache_config_info`` gauge of
    ``--endpoint``'s ``/metrics``, else the preset's. The twin counts blocks of its own
    ``block_size`` tokens: other sizes are converted (whole blocks, rounded down)."""
    gpu, host, size = opts.gpu_blocks, opts.host_blocks, opts.block_size
    source = "--gpu-blocks"
    if gpu is None and opts.endpoint:
        info = read_cache_config(opts.endpoint)
        if info is not None:
            gpu, size, source = info.gpu_blocks, info.block_size, "--endpoint's metrics"
            if host is None and info.host_blocks:
                host = info.host_blocks
    if gpu is None and host is None:
        why = "no vllm:cache_config_info at --endpoint; " if opts.endpoint else ""
        return engine, (
            f"kv: {engine.num_gpu_blocks:,} blocks of {engine.block_size} tokens per "
            f"replica, the {opts.preset} preset's\n    ({why}--gpu-blocks N: the engine's)"
        )
    size = size or engine.block_size
    changes: dict[str, int] = {}
    if gpu is not None:
        changes["num_gpu_blocks"] = max(1, gpu * size // engine.block_size)
    if host is not None:
        changes["num_host_blocks"] = max(0, host * size // engine.block_size)
    engine = engine.replace(**changes)
    unit = ""
    if size != engine.block_size:
        unit = f"\n    (the engine's {size}-token blocks, converted)"
    host_text = f" + {engine.num_host_blocks:,} host" if engine.num_host_blocks else ""
    if gpu is None:
        source = "--host-blocks"
    return engine, (
        f"kv: {engine.num_gpu_blocks:,}{host_text} blocks of {engine.block_size} tokens "
        f"per replica, from {source}{unit}"
    )


def _intro(
    opts: TuneOptions,
    observed: Observed,
    jobs: int,
    fit: Fit,
    recorded: Setting,
    replicas: int,
    sample: int,
    seeds: int,
) -> str:
    calls = sum(len(r.call_reports) for r in observed.reports)
    lines = [f"agentrt tune: {jobs} jobs, {calls} calls, {replicas} replicas"]
    if observed.skipped_lines:
        lines[0] += f" ({observed.skipped_lines} invalid lines skipped)"
    if fit.source == "journal":
        err = f", error {fit.error:.0%}" if fit.error is not None else ""
        lines.append(
            f"engine: {opts.preset} fitted to {fit.calls} latencies (prefill x"
            f"{fit.prefill_scale:.2f}, decode x{fit.decode_scale:.2f}{err})"
        )
    elif fit.source == "probe":
        lines.append(f"engine: fitted to a probe of {opts.endpoint}")
    else:
        lines.append(f"engine: {opts.preset} as it is (too few calls to fit)")
    rec = recorded.label() + ("" if observed.recorded_known else " (assumed: Runtime defaults)")
    lines.append(f"recorded with: {rec}")
    if recorded.plain:
        lines.append(
            "  (no agentrt: each call sent at once, round-robin over the replicas); ranked:\n"
            "  that client replayed (*) and agentrt's settings (Runtime's defaults, then one\n"
            "  change each), every ratio to the plain client's replay"
        )
    lines.append(
        f"replays: {sample} jobs per sample, {seeds} sample(s), loads "
        + ", ".join(f"{x:g}x" for x in LOADS)
    )
    return "\n".join(lines)


def _too_short(jobs: int, sample: int) -> str:
    """Why a journal of ``jobs`` jobs cannot be tuned with samples of ``sample``, and
    what would help (one line)."""
    fewer = f"--sample {max(2, jobs // 3)} (noisier)" if jobs >= 6 else "more journals"
    return (
        f"the journals have {jobs} jobs to replay, fewer than one sample of {sample} "
        f"(--sample): record more jobs (a longer window), or give {fewer}, or --force to "
        f"replay the {jobs} once (confidence low)"
    )


def _processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _fleet_line(opts: TuneOptions, observed: Observed, fleet: int) -> str:
    """The header's fleet lines: its size, where it came from, how jobs are dealt."""
    ids = len(set(observed.runtimes))
    seen = f"{ids} runtime" + ("" if ids == 1 else "s")
    if ids != observed.fleet:
        seen += f", at most {observed.fleet} at once"
    source = "the journal" if opts.fleet is None else "--fleet"
    if fleet == 1:
        return f"fleet: 1 process, from {source} (the journal: {seen})"
    dealt = "as recorded" if fleet == observed.fleet else "round-robin by arrival"
    return (
        f"fleet: {_processes(fleet)}, each with the settings, from {source}\n"
        f"  (the journal: {seen}); jobs dealt {dealt}"
    )


def _confidence(ranked: list[Score], recorded: Setting) -> Confidence:
    """How sure the pick is, from the spread of the scores over the samples: ``high``
    when the best beats the runner-up (or, when it is not the recorded settings, the
    recorded ones) in every sample, by more than twice the spread on average;
    ``medium`` by more than the spread; ``low`` otherwise (keep the recorded settings
    unless the gain is worth it). One sample (one window: ``--force`` on a short
    journal) has no spread to judge by: ``low``."""
    if len(ranked) < 2 or len(ranked[0].samples) < 2:
        return "low"
    best = ranked[0]
    other = ranked[1]
    if best.setting != recorded:
        other = next((s for s in ranked if s.setting == recorded), other)
    spread = max(best.spread, other.spread)
    margin = other.score - best.score
    pairs = list(zip(best.samples, other.samples, strict=False))
    if margin > 2 * spread and all(b < o for b, o in pairs):
        return "high"
    if margin > spread:
        return "medium"
    return "low"


def _r(x: float) -> str:
    return "  -  " if not math.isfinite(x) else f"{x:5.2f}"


def table(result: TuneResult) -> list[str]:
    """The ranked table, 80 columns."""
    head = f"{'#':>2}  {'settings':<26} {'JCT p50 ratio':^17}  {'JCT p90 ratio':^17}  {'rate':>5}"
    loads = "  ".join(f"{x:g}x".rjust(5) for x in LOADS)
    sub = f"{'':>2}  {'':<26} {loads}  {loads}  {'S<=2':>5}"
    lines = ["", head, sub]
    for i, s in enumerate(result.ranked, start=1):
        p50 = "  ".join(_r(s.p50[x]) for x in LOADS)
        p90 = "  ".join(_r(s.p90[x]) for x in LOADS)
        mark = "*" if s.setting == result.recorded else " "
        label = (s.setting.label() + mark)[:26]
        rate = "  -  " if not math.isfinite(s.rate) else f"{s.rate:4.2f}x"
        lines.append(f"{i:>2}  {label:<26} {p50}  {p90}  {rate:>5}")
    best = result.ranked[0] if result.ranked else None
    lines.append("")
    base = "the plain client's replay" if result.recorded.plain else "the recorded settings"
    lines += textwrap.wrap(
        f"Ratios to {base} (*), lower is better; rate: the load sustained at p90 stretch "
        f"<= 2 over the recorded one's (higher is better), loads capped at {LOADS[-1]:g}x "
        "the observed.",
        WIDTH,
    )
    pick = result.chosen
    if best is not None and pick is not None:
        lines.append(f"best: {best.setting.label()}; confidence {result.confidence}")
        lines.append(
            f"  score {best.score:.3f} +/- {best.spread:.3f} over {len(best.samples)} "
            "window(s), lower is better"
        )
        if pick.setting.plain:  # a settings file configures agentrt, not a bare client
            lines.append(
                f"chosen: Runtime's defaults (no setting beats the plain client by {MIN_GAIN:.0%})"
            )
        elif pick is not best:
            lines.append(f"chosen: the recorded settings (the best gains under {MIN_GAIN:.0%})")
    lines.append(f"{result.replays} replays in {result.wall_s:.0f} s")
    return [line[:WIDTH] if len(line) > WIDTH else line for line in lines]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_toml(result: TuneResult) -> str:
    """:meth:`TuneResult.to_toml`: ``poll_metrics_s`` beside ``concurrency =
    "engine"``, as the twin replayed it."""
    best = result.chosen
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# agentrt tune: the best settings found, as Runtime keyword arguments",
        f"# {now}; journals: {', '.join(str(p) for p in result.journals)}",
        f"# recorded with: {result.recorded.label()}",
        f"# chosen for a fleet of {_processes(result.fleet)} each running these settings"
        f" (from {'the journal' if result.fleet_source == 'journal' else '--fleet'})",
    ]
    if result.capacity:
        lines += [f"# twin {line.strip()}" for line in result.capacity.splitlines()]
    if best is not None:
        p50 = ", ".join(f"{x:g}x {best.p50[x]:.2f}" for x in LOADS)
        lines.append(f"# predicted JCT p50 ratio: {p50}")
        lines.append(
            f"# score {best.score:.3f} +/- {best.spread:.3f}; confidence {result.confidence}"
        )
    lines.append("")
    for key, value in result.runtime_kwargs().items():
        if key == "poll_metrics_s":
            lines.append(
                '# "engine" caps only while it polls the engines\' /metrics (as vLLM serves)'
            )
        lines.append(f"{key} = {_toml_value('none' if value is None else value)}")
    return "\n".join(lines) + "\n"
