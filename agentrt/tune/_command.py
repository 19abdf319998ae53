"""``agentrt tune JOURNAL...``: journals in, a ranked table and a TOML file out."""

from __future__ import annotations

import math
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..bench._fleet import FleetAssign
from ..bench._parallel import Workers
from ..sim import PRESETS, EngineConfig
from ._fit import Fit, from_journal, from_probe, read_cache_config
from ._search import LOADS, Score, Setting, Twin, combine, neighbours, score
from ._workload import JournalError, Observed, load, to_plans

__all__: list[str] = []

WIDTH = 80
MIN_GAIN = 0.02
"""The best settings must beat the recorded ones' score by this share to be chosen: the
twin's calibration is no finer than that."""


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """What ``agentrt tune`` was asked."""

    journals: Sequence[Path]
    out: Path = Path("agentrt-tuned.toml")
    endpoint: str | None = None
    model: str | None = None
    preset: str = "h100-8b"
    replicas: int | None = None
    sample: int = 200
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


@dataclass(frozen=True, slots=True)
class TuneResult:
    """The ranked settings (best first), the recorded one, and how it went."""

    ranked: list[Score]
    recorded: Setting
    recorded_known: bool
    fit: Fit
    jobs: int
    sample: int
    seeds: int
    replays: int
    wall_s: float
    confidence: str
    capacity: str = ""
    """The twin's KV capacity per replica and where it came from (one line)."""
    fleet: int = 1
    """The processes each setting was replayed as (``BenchConfig.fleet``)."""
    fleet_source: str = "journal"
    """Where :attr:`fleet` came from: ``journal`` (its runtimes) or ``--fleet``."""


def tune(opts: TuneOptions, echo: Callable[[str], None] = print) -> TuneResult:
    """Run the whole tune (blocking); writes ``opts.out``."""
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
    )
    for line in table(result):
        echo(line)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(to_toml(result, opts))
    echo(f"best settings: {opts.out}")
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


def _confidence(ranked: list[Score], recorded: Setting) -> str:
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
    pick = chosen(result)
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


def chosen(result: TuneResult) -> Score | None:
    """The settings to apply: the best, if it beats the recorded ones by
    :data:`MIN_GAIN`, else the recorded ones."""
    if not result.ranked:
        return None
    best = result.ranked[0]
    recorded = next((s for s in result.ranked if s.setting == result.recorded), None)
    if recorded is not None and best.score > recorded.score * (1.0 - MIN_GAIN):
        return recorded
    return best


def to_toml(result: TuneResult, opts: TuneOptions) -> str:
    """The chosen settings as ``Runtime`` keyword arguments (docs/tune.md): top-level
    keys only, ``"none"`` for None (TOML has no null; the loader reads it back), and
    ``poll_metrics_s`` beside ``concurrency = "engine"``, as the twin replayed it."""
    best = chosen(result)
    setting = best.setting if best is not None else result.recorded
    if setting.plain:  # a bare client cannot be configured: keep Runtime's defaults
        setting = Setting()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# agentrt tune: the best settings found, as Runtime keyword arguments",
        f"# {now}; journals: {', '.join(str(p) for p in opts.journals)}",
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
    for key, value in setting.runtime_kwargs().items():
        if key == "poll_metrics_s":
            lines.append(
                '# "engine" caps only while it polls the engines\' /metrics (as vLLM serves)'
            )
        lines.append(f"{key} = {_toml_value('none' if value is None else value)}")
    return "\n".join(lines) + "\n"
