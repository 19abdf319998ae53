"""Does ``agentrt tune`` pick well?

On workloads tune was not developed on, each on an embedded cluster in virtual time:

1. **record** a journal with Runtime's defaults (a bench agentrt client built from a
   settings file that sets nothing, so Runtime's defaults, ``journal_dir``);
2. **tune** it (:func:`agentrt.tune.tune`, what the command runs, with its defaults but
   a smaller ``sample`` / ``seeds``: see ``WORKLOADS``);
3. **apply** the file tune wrote (``agentrt:config=FILE``: ``Runtime(config=FILE)``) and
   measure it on fresh jobs of the same workload at the same load (another seed; for the
   Claude Code replay, the next traces);
4. **measure the grid** directly on the same fresh jobs: routing x policy x concurrency
   (tune's own values: ``agentrt.tune.ROUTINGS``, ``POLICIES``, ``CONCURRENCY``) with
   priorities and learned
   waits at Runtime's defaults, each of those two flipped on the defaults, and every
   setting tune's fine round scored;
5. compare: the applied choice's JCT p50 against the grid's best (goal: within 5%), and
   tune's predicted JCT p50 ratio (chosen over recorded, at 1x load) against the measured
   one (applied over the recorded settings on the fresh jobs; goal: within 15%).

``react-longtail-kv-told`` passes the recording's KV capacity to tune (``--gpu-blocks``);
``mixed-cap4`` is recorded with a poor setting (a fixed cap of 4) that tune must change.
``--merge`` keeps the other workloads already in ``--out``.

Prints a table and writes ``results/tune_check.json``::

    python -m benchmarks tune twin
    python -m benchmarks tune twin --workloads mixed --out /tmp/tc.json
    python -m benchmarks tune twin --workloads mixed-cap4 --merge
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrt.bench import BenchConfig, BenchResult, ClientSpec, TraceOptions, run_study
from agentrt.tune import CONCURRENCY, LOADS, POLICIES, ROUTINGS, Setting, TuneResult, tune

from ._harness import add_run_args, run_record, write_result

ROOT = Path(__file__).resolve().parents[1]
GOAL_GAP = 0.05
"""The applied choice's measured JCT p50 may be at most this much above the grid's best."""
GOAL_ERROR = 0.15
"""Tune's predicted p50 ratio may differ from the measured one by at most this share."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload of the check: what is recorded, tuned and measured."""

    name: str
    workload: str
    rate: float
    record_jobs: int
    fresh_jobs: int
    sample: int
    """tune's ``--sample`` (its default is 150: smaller here for the cost)."""
    seeds: int
    """tune's ``--seeds`` (its default is 3)."""
    replicas: int = 2
    gpu_blocks: int | None = None
    token_scale: float = 1.0
    max_wait_s: float | None = None
    note: str = ""
    tell_blocks: bool = False
    """Pass ``gpu_blocks`` to tune (``--gpu-blocks``), as a user who knows their
    engine's KV capacity would; else tune's twin keeps the preset's."""
    record_with: tuple[tuple[str, Any], ...] = ()
    """Changes to Runtime's defaults the journal is recorded with (``Setting`` fields):
    a poor setting that tune must change; the measured ratio is then over this one."""


WORKLOADS: dict[str, Workload] = {
    "mixed": Workload(
        "mixed", "mixed", rate=1.0, record_jobs=72, fresh_jobs=40, sample=24, seeds=1,
        note="ReAct loops, fan-outs and chats",
    ),
    "claude-code": Workload(
        "claude-code", "claude-code", rate=0.1, record_jobs=24, fresh_jobs=8, sample=6,
        seeds=1, token_scale=0.25, max_wait_s=30.0,
        note="Claude Code traces 1-24 recorded, 25-32 fresh; tokens x0.25, waits <= 30 s",
    ),
    "react-longtail-kv": Workload(
        "react-longtail-kv", "react-longtail", rate=0.3, record_jobs=72, fresh_jobs=40,
        sample=24, seeds=1, gpu_blocks=4096,
        note="long tool loops, heavy-tailed waits; 4,096 KV blocks per replica, no host tier",
    ),
    "react-longtail-kv-told": Workload(
        "react-longtail-kv-told", "react-longtail", rate=0.3, record_jobs=72, fresh_jobs=40,
        sample=24, seeds=1, gpu_blocks=4096, tell_blocks=True,
        note="react-longtail-kv with tune told the capacity (--gpu-blocks 4096)",
    ),
    "mixed-cap4": Workload(
        "mixed-cap4", "mixed", rate=1.0, record_jobs=72, fresh_jobs=40, sample=24, seeds=1,
        record_with=(("concurrency", 4),),
        note="mixed recorded with a poor setting: a fixed cap of 4 per endpoint",
    ),
}  # fmt: skip


def config_supported() -> bool:
    """Whether bench clients take ``agentrt:config=FILE`` (else settings map to a spec)."""
    return "config" in ClientSpec.__dataclass_fields__


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + ("none" if value is None else str(value)) + '"'


def write_settings(setting: Setting | None, path: Path) -> Path:
    """``setting`` as a settings file ``Runtime(config=...)`` reads (TOML has no null:
    ``"none"``); None: a file with no settings (Runtime's defaults)."""
    lines = ["# Runtime's defaults" if setting is None else "# " + setting.label()]
    if setting is not None:
        lines += [f"{k} = {toml_value(v)}" for k, v in setting.runtime_kwargs().items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def default_setting() -> Setting:
    """Runtime's defaults as tune reads them over the check's two endpoints
    (``Setting()``): with several, ``poll_metrics_s="auto"`` polls, so
    ``concurrency="engine"`` caps while an engine queues."""
    return Setting()


def settings_of(path: Path) -> Setting:
    """The settings in a file tune wrote."""
    import tomllib

    data = tomllib.loads(path.read_text())
    return Setting.of({k: (None if v == "none" else v) for k, v in data.items()})


def recorded_setting(w: Workload) -> Setting:
    """The settings ``w``'s journal is recorded with."""
    return replace(default_setting(), **dict(w.record_with))


def client(setting: Setting, folder: Path, use_config: bool, file: Path | None = None) -> str:
    """The bench client that runs ``setting``: ``agentrt:config=FILE`` (``file``, or one
    written into ``folder``) where bench clients take it, else ``setting.spec()``."""
    if not use_config:
        return setting.spec()
    if file is None and setting == default_setting():
        file = write_settings(None, folder / "defaults.toml")
    if file is None:
        name = "".join(c if c.isalnum() else "_" for c in setting.label()) + ".toml"
        file = write_settings(setting, folder / name)
    return f"agentrt:config={file}"


def grid(extra: list[Setting]) -> list[Setting]:
    """Runtime's defaults; routing x policy x concurrency (tune's values) with the other
    settings at the defaults; each routing with the defaults' limit (no cap: no queue
    for a policy to order, so only the defaults' policy); each other setting flipped on
    the defaults; then ``extra``."""
    base = default_setting()
    out = [base] + [
        replace(base, routing=r, policy=p, concurrency=c)
        for r, p, c in itertools.product(ROUTINGS, POLICIES, CONCURRENCY)
    ]
    out += [replace(base, routing=r) for r in ROUTINGS]
    out.append(replace(base, send_priority=True))
    out.append(replace(base, learn_waits=False))
    out.extend(extra)
    return list(dict.fromkeys(out))


def bench_config(w: Workload, jobs: int, seed: int, clients: list[str], **kw: Any) -> BenchConfig:
    return BenchConfig(
        workload=w.workload,
        jobs=jobs,
        rate=w.rate,
        seed=seed,
        clients=tuple(clients),
        replicas=w.replicas,
        stretch=False,
        api="http",
        gpu_blocks=w.gpu_blocks,
        **kw,
    )


def traces(w: Workload, first: int, count: int, folder: Path) -> TraceOptions:
    """Trace options replaying traces ``first .. first+count-1`` (file order): a folder of
    links, so that fresh jobs are other traces, not the same ones at other times."""
    opts = TraceOptions(token_scale=w.token_scale, max_wait_s=w.max_wait_s)
    if w.workload not in ("claude-code", "mixed-cc"):
        return opts
    files = sorted(opts.folder().glob("trace_*.json.gz"))[first : first + count]
    if len(files) < count:
        raise SystemExit(f"{w.name}: needs {first + count} traces, found fewer")
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f.name).symlink_to(f.resolve())
    return replace(opts, directory=folder)


@dataclass(slots=True)
class Check:
    """One workload's figures."""

    workload: Workload
    recorded_with: str = ""
    tune: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per setting label: JCT p50 and p90 (seconds), jobs, failed."""
    applied: dict[str, float] = field(default_factory=dict)
    chosen: str = ""
    predicted: float = math.nan
    defaults: str = field(default_factory=lambda: default_setting().label())
    """The measured ratios' base: the recorded settings (Runtime's defaults unless the
    workload says otherwise)."""
    best: str = ""

    @staticmethod
    def of(saved: dict[str, Any]) -> Check:
        """A workload's check as ``main`` wrote it to the JSON file."""
        return Check(
            Workload(**saved["workload"]),
            saved["recorded_with"],
            saved["tune"],
            saved["measured"],
            saved["applied"],
            saved["chosen"],
            saved["predicted_p50_ratio"],
            defaults=saved.get("base", default_setting().label()),
            best=saved["best"],
        )

    def summary(self) -> dict[str, Any]:
        base = self.measured[self.defaults]["p50"]
        best = self.measured[self.best]["p50"]
        applied = self.applied["p50"]
        ratio = applied / base
        error = self.predicted / ratio - 1.0
        gap = applied / best - 1.0
        return {
            "base": self.defaults,
            "chosen": self.chosen,
            "predicted_p50_ratio": self.predicted,
            "measured_p50_ratio": ratio,
            "prediction_error": error,
            "defaults_p50_s": base,
            "applied_p50_s": applied,
            "best": self.best,
            "best_p50_s": best,
            "best_ratio_to_defaults": best / base,
            "gap_to_best": gap,
            "goal_gap_met": gap <= GOAL_GAP,
            "goal_prediction_met": abs(error) <= GOAL_ERROR,
        }


def record(checks: list[Check], work: Path, use_config: bool, workers: Any) -> list[Path]:
    """Step 1: each workload's journal, recorded with Runtime's defaults."""
    cfgs = []
    for c in checks:
        w = c.workload
        folder = work / w.name
        folder.mkdir(parents=True, exist_ok=True)
        setting = recorded_setting(w)
        c.defaults = setting.label()
        spec = client(setting, folder, use_config)
        c.recorded_with = spec
        opts = traces(w, 0, w.record_jobs, folder / "traces-recorded")
        cfgs.append(
            bench_config(w, w.record_jobs, 0, [spec], traces=opts, journal_dir=folder / "journal")
        )
    results = run_study(cfgs, workers=workers)
    out = []
    for c, cfg, res in zip(checks, cfgs, results, strict=True):
        # one client, one journal: ``journal-<client>.jsonl`` (BenchConfig.journal_dir)
        assert cfg.journal_dir is not None
        (path,) = cfg.journal_dir.glob("journal-*.jsonl")
        row = res.clients[0]
        c.tune["recording"] = {
            "jobs": row.jobs,
            "failed": row.failed,
            "jct_p50_s": row.jct["p50"],
            "utilization": row.utilization,
        }
        out.append(path)
    return out


def run_tune(c: Check, journal: Path, work: Path, workers: Any) -> tuple[TuneResult, Path]:
    """Step 2: tune with its defaults but ``sample`` and ``seeds``; its file written
    as the command writes it."""
    w = c.workload
    out = work / w.name / "agentrt-tuned.toml"
    lines: list[str] = []
    result = tune(
        journal,
        sample=w.sample,
        seeds=w.seeds,
        workers=workers,
        gpu_blocks=w.gpu_blocks if w.tell_blocks else None,
        echo=lines.append,
    )
    lines += result.table()
    out.write_text(result.to_toml())
    lines.append(f"best settings: {out}")
    pick = result.chosen
    assert pick is not None
    c.chosen = pick.setting.label()
    c.predicted = pick.p50[1.0]
    c.tune.update(
        {
            "sample": w.sample,
            "seeds": w.seeds,
            "replays": result.replays,
            "wall_s": result.wall_s,
            "confidence": result.confidence,
            "capacity": result.capacity,
            "fleet": {"size": result.fleet, "source": result.fleet_source},
            "recorded": result.recorded.label(),
            "fit": {"prefill": result.fit.prefill_scale, "decode": result.fit.decode_scale},
            "chosen": c.chosen,
            "ranked": [
                {
                    "setting": s.setting.label(),
                    "p50": {f"{x:g}x": s.p50[x] for x in LOADS},
                    "p90": {f"{x:g}x": s.p90[x] for x in LOADS},
                    "rate": s.rate,
                    "score": s.score,
                    "spread": s.spread,
                }
                for s in result.ranked
            ],
            "output": "\n".join(lines),
            "file": out.read_text(),
        }
    )
    return result, out


def measure(
    checks: list[Check],
    tuned: list[tuple[TuneResult, Path]],
    work: Path,
    use_config: bool,
    workers: Any,
    only: list[Setting] | None = None,
) -> list[BenchResult]:
    """Steps 3 and 4: the applied file and the grid, on the same fresh jobs."""
    cfgs = []
    layouts: list[list[str]] = []
    for c, (result, file) in zip(checks, tuned, strict=True):
        w = c.workload
        folder = work / w.name / "grid"
        folder.mkdir(parents=True, exist_ok=True)
        fine = [s.setting for s in result.ranked]
        settings = grid(fine) if only is None else list(dict.fromkeys([*only, *fine]))
        settings = list(dict.fromkeys([default_setting(), recorded_setting(w), *settings]))
        labels = [s.label() for s in settings]
        clients = [client(s, folder, use_config) for s in settings]
        clients.append(client(settings_of(file), folder, use_config, file))  # as applied
        layouts.append([*labels, "applied"])
        opts = traces(w, w.record_jobs, w.fresh_jobs, work / w.name / "traces-fresh")
        cfgs.append(bench_config(w, w.fresh_jobs, 1, clients, traces=opts))
    results = run_study(cfgs, workers=workers)
    for c, labels, res in zip(checks, layouts, results, strict=True):
        for label, row in zip(labels, res.clients, strict=True):
            figures = {
                "p50": row.jct["p50"],
                "p90": row.jct["p90"],
                "jobs": float(row.jobs),
                "failed": float(row.failed),
            }
            if label == "applied":
                c.applied = figures
            else:
                c.measured[label] = figures
        ok = {k: v for k, v in c.measured.items() if v["failed"] == 0}
        c.best = min(ok, key=lambda k: ok[k]["p50"])
    return results


def run(
    workloads: list[Workload], work: Path, workers: Any = "auto", only: list[Setting] | None = None
) -> list[Check]:
    """The whole check on ``workloads``; ``only``: these settings (and tune's finalists)
    in place of the grid."""
    use_config = config_supported()
    checks = [Check(w) for w in workloads]
    journals = record(checks, work, use_config, workers)
    tuned = [run_tune(c, j, work, workers) for c, j in zip(checks, journals, strict=True)]
    measure(checks, tuned, work, use_config, workers, only)
    return checks


def _pct(x: float) -> str:
    return f"{x:+.0%}" if math.isfinite(x) else "-"


def table(checks: list[Check]) -> list[str]:
    lines = [
        f"{'workload':<23}{'pick (chosen)':<19}{'pred':>5}{'meas':>6}{'err':>5}  "
        f"{'grid best':<15}{'gap':>5}",
    ]
    for c in checks:
        s = c.summary()
        lines.append(
            f"{c.workload.name[:22]:<23}{c.chosen[:18]:<19}{s['predicted_p50_ratio']:>5.2f}"
            f"{s['measured_p50_ratio']:>6.2f}{_pct(s['prediction_error']):>5}  "
            f"{s['best'][:15]:<15}{_pct(s['gap_to_best']):>5}"
        )
    lines.append("")
    lines.append("pred / meas: JCT p50 of the pick over the recorded settings' (tune's")
    lines.append("prediction at 1x, measured on fresh jobs); err: pred/meas - 1 (goal within")
    lines.append(f"{GOAL_ERROR:.0%});")
    lines.append(f"gap: the pick's p50 over the grid's best p50 - 1 (goal <= {GOAL_GAP:.0%}).")
    return lines


def grid_table(c: Check) -> list[str]:
    base = c.measured[c.defaults]["p50"]
    lines = [f"{c.workload.name}: measured on {c.workload.fresh_jobs} fresh jobs, best first"]
    lines.append(f"  {'setting':<28}{'p50 s':>8}{'p90 s':>8}{'x rec':>7}  tune")
    predicted = {r["setting"]: r["p50"]["1x"] for r in c.tune["ranked"]}
    for label, m in sorted(c.measured.items(), key=lambda kv: kv[1]["p50"]):
        marks = []
        if label == c.chosen:
            marks.append("pick")
        if label == c.defaults:
            marks.append("recorded")
        if label in predicted:
            marks.append(f"pred {predicted[label]:.2f}")
        if m["failed"]:
            marks.append(f"{int(m['failed'])} failed")
        line = (
            f"  {label[:27]:<28}{m['p50']:>8.1f}{m['p90']:>8.1f}{m['p50'] / base:>7.3f}"
            f"  {' '.join(marks)}"
        )
        lines.append(line[:80].rstrip())
    return lines


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    add_run_args(ap, out="tune_check.json")
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--work", type=Path, default=None, help="folder for journals and files")
    ap.add_argument("--show", type=Path, default=None, help="print the tables of a saved run")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the other workloads already in --out (this run's replace their namesakes)",
    )


def main(args: argparse.Namespace) -> int:
    if args.show is not None:
        saved = json.loads(args.show.read_text())["workloads"]
        checks = [Check.of(v) for v in saved.values()]
        for c in checks:
            print("\n".join(grid_table(c)) + "\n")
        print("\n".join(table(checks)))
        return 0
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    for n in names:
        if n not in WORKLOADS:
            raise SystemExit(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    workers: Any = args.workers if args.workers in ("auto", "ray") else int(args.workers)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-check-") as tmp:
        work = args.work or Path(tmp)
        checks = run([WORKLOADS[n] for n in names], work, workers)
    wall = time.perf_counter() - started
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    for c in checks:
        print("\n".join(grid_table(c)))
        print()
    print("\n".join(table(checks)))
    print(f"\n{wall:.0f} s wall, {cpu:.0f} s CPU (all processes)")
    record = run_record("")
    out = {
        "command": record["command"],
        "commit": record.get("commit", ""),
        "wall_s": wall,
        "cpu_s": cpu,
        "config_clients": config_supported(),
        "goals": {"gap_to_best": GOAL_GAP, "prediction_error": GOAL_ERROR},
        "workloads": {
            c.workload.name: {
                "workload": asdict(c.workload),
                "recorded_with": c.recorded_with,
                "tune": c.tune,
                "measured": c.measured,
                "applied": c.applied,
                **c.summary(),
            }
            for c in checks
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and args.out.exists():
        merged = json.loads(args.out.read_text())
        for entry in out["workloads"].values():
            entry.update(command=out["command"], commit=out["commit"], wall_s=wall, cpu_s=cpu)
        merged["workloads"].update(out["workloads"])
        out = merged
    write_result(args.out, out, __doc__)
    print(f"wrote {args.out}")
    return 0
