"""tune's loop on the real engine: record, tune, apply, measure.

Two vLLM CPU replicas (the tiny random-weight model of ``.engine/``, one core each, dev
mode to empty the prefix caches between runs) serve a small ``mixed`` workload (ReAct
loops, fan-outs and chats; each session cut where its prompt would pass the replicas'
context) arriving as a Poisson stream:

1. **record**: an agentrt client with Runtime's defaults (a settings file of the
   defaults) runs --jobs jobs (seed --seed) against both replicas, writing a journal;
2. **tune**: ``agentrt tune JOURNAL --endpoint REPLICA --preset cpu-tiny`` (the embedded
   engine calibrated by a probe of an idle replica), and the same from the journal alone
   (no --endpoint); the probe's file is applied;
3. **apply and measure**: fresh jobs (seed --seed + 1), the defaults and the tuned file,
   each through ``Runtime(config=FILE)``, --runs runs each in alternating order
   (defaults, tuned, tuned, defaults, ...), empty prefix caches before each run.

Prints per run JCT p50/p90/mean (s) and the load average, then the medians, the
measured ratios tuned/defaults beside tune's predicted ones (1x load), and writes
results/tune_real.json.

    python -m benchmarks tune vllm            # about 15-25 min on 2 cores

The machine's other load makes wall-clock JCTs noisy: read the per-run spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrt.bench import (
    Arrivals,
    Call,
    Fanout,
    JobPlan,
    SessionPlan,
    make_workload,
    parse_workers,
    replay,
)
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaServer, ReplicaSpec, find_engine, launch
from agentrt.tune import TuneResult, tune

from ._harness import add_run_args, write_result

TEXT_TOKENS_PER_TOKEN = 0.7
"""Real tokens per nominal token of ``Prompts("text")`` on the tiny model's tokenizer
(0.64 measured on a 34-block prompt), rounded up: the cut keeps a margin."""


# -- the workload --------------------------------------------------------------------------


def _fits(call: Call, max_model_len: int) -> bool:
    need = TEXT_TOKENS_PER_TOKEN * call.prompt_tokens + call.output_tokens
    return need < max_model_len - 64


def _cut(plan: SessionPlan, max_model_len: int, output_scale: float) -> SessionPlan:
    """``plan`` with its outputs scaled, up to its first call that would not fit the
    context (sub-agents too)."""
    out: list[Call | Fanout] = []
    for step in plan.steps:
        if isinstance(step, Fanout):
            subs = tuple(_cut(s, max_model_len, output_scale) for s in step.sessions)
            out.append(Fanout(tuple(s for s in subs if s.steps)))
            continue
        step = dataclasses.replace(
            step, output_tokens=max(8, round(step.output_tokens * output_scale))
        )
        if not _fits(step, max_model_len):
            break
        out.append(step)
    return SessionPlan(plan.name, tuple(out))


def workload(
    name: str,
    jobs: int,
    rate: float,
    seed: int,
    tool_wait_s: float,
    max_model_len: int,
    output_scale: float,
) -> list[JobPlan]:
    plans = make_workload(name, jobs, Arrivals(rate, seed), seed=seed, tool_wait_s=tool_wait_s)
    return [dataclasses.replace(p, root=_cut(p.root, max_model_len, output_scale)) for p in plans]


def _calls(plan: SessionPlan) -> list[Call]:
    out: list[Call] = []
    for step in plan.steps:
        if isinstance(step, Fanout):
            for s in step.sessions:
                out += _calls(s)
        else:
            out.append(step)
    return out


def describe(plans: Sequence[JobPlan]) -> dict[str, Any]:
    calls = [c for p in plans for c in _calls(p.root)]
    return {
        "jobs": len(plans),
        "kinds": {k: sum(p.kind == k for p in plans) for k in sorted({p.kind for p in plans})},
        "calls": len(calls),
        "output_tokens": sum(c.output_tokens for c in calls),
        "prompt_tokens_nominal_max": max(c.prompt_tokens for c in calls),
        "arrivals_span_s": round(max(p.arrival_s for p in plans), 2),
    }


# -- the client ----------------------------------------------------------------------------


def defaults_file(path: Path) -> Path:
    """A settings file that sets nothing: ``Runtime(config=FILE)`` keeps Runtime's
    defaults (``concurrency="engine"``, polled over the two replicas)."""
    path.write_text("# Runtime's defaults\n")
    return path


def run_one(
    label: str,
    config: Path,
    replicas: list[ReplicaServer],
    plans: list[JobPlan],
    journal: Path | None = None,
) -> dict[str, Any]:
    for r in replicas:
        r.reset_prefix_cache()
    before = [r.metrics() for r in replicas]
    load_before = os.getloadavg()[0]
    urls = [r.base_url for r in replicas]
    client = f"agentrt:config={config}"  # Runtime(urls, config=config)
    result = replay(plans, urls, client, model=replicas[0].model, journal=journal)
    after = [r.metrics() for r in replicas]
    makespan = result.makespan_s
    errors = {row["error"] or row["status"] for row in result.job_rows if row["status"] != "ok"}

    def delta(key: str) -> float:
        return sum(a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True))

    queries = delta("vllm:prefix_cache_queries_total")
    tokens = delta("vllm:prompt_tokens_total") + delta("vllm:generation_tokens_total")
    return {
        "client": label,
        "config": str(config),
        "jobs": result.jobs,
        "failed": result.failed,
        "errors": sorted(errors)[:3],
        "makespan_s": makespan,
        "jct_p50": result.jct["p50"],
        "jct_p90": result.jct["p90"],
        "jct_mean": result.jct["mean"],
        "cached_share": delta("vllm:prefix_cache_hits_total") / queries if queries else math.nan,
        "engine_tokens_per_s": tokens / makespan if makespan else math.nan,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


# -- tune ----------------------------------------------------------------------------------


def tuned(result: TuneResult, out: Path) -> dict[str, Any]:
    pick = result.chosen
    setting = pick.setting if pick is not None else result.recorded
    return {
        "file": str(out),
        "settings": tomllib.loads(out.read_text()),
        "label": setting.label(),
        "best": result.ranked[0].setting.label() if result.ranked else None,
        "recorded": result.recorded.label(),
        "fleet": {"size": result.fleet, "source": result.fleet_source},
        "confidence": result.confidence,
        "fit": {
            "source": result.fit.source,
            "prefill_scale": result.fit.prefill_scale,
            "decode_scale": result.fit.decode_scale,
        },
        "predicted_p50_ratio": {f"{k:g}x": v for k, v in pick.p50.items()} if pick else {},
        "predicted_p90_ratio": {f"{k:g}x": v for k, v in pick.p90.items()} if pick else {},
        "score": pick.score if pick else None,
        "spread": pick.spread if pick else None,
        "replays": result.replays,
        "wall_s": result.wall_s,
    }


# -- the loop ------------------------------------------------------------------------------


def _row(r: dict[str, Any]) -> str:
    load = f"{r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f}"
    return (
        f"{r['phase']:8} {r['client']:9} {r['jct_p50']:7.2f} {r['jct_p90']:7.2f} "
        f"{r['jct_mean']:7.2f} {r['makespan_s']:8.1f} {r['cached_share']:6.1%} "
        f"{r['failed']:4d}  {load:>9}"
    )


HEADER = (
    f"{'phase':8} {'client':9} {'JCT p50':>7} {'p90':>7} {'mean':>7} {'makespan':>8} "
    f"{'cached':>6} {'fail':>4}  {'load avg':>9}"
)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.3, help="jobs/s")
    parser.add_argument("--output-scale", type=float, default=0.4, help="x output tokens")
    parser.add_argument("--tool-wait", type=float, default=1.0, help="median tool wait, s")
    parser.add_argument("--runs", type=int, default=2, help="measured runs per client")
    parser.add_argument("--seed", type=int, default=0, help="the recorded jobs' seed")
    parser.add_argument("--sample", type=int, default=15, help="agentrt tune --sample")
    parser.add_argument("--seeds", type=int, default=2, help="agentrt tune --seeds")
    parser.add_argument("--workers", default="2", help="agentrt tune --workers")
    parser.add_argument("--max-model-len", type=int, default=4096)
    add_run_args(parser, out="tune_real.json")


def main(args: argparse.Namespace) -> None:
    if find_engine() is None:
        raise SystemExit(SETUP_MESSAGE)
    work = args.out.parent / (args.out.stem + "-files")
    work.mkdir(parents=True, exist_ok=True)
    journal = work / "journal-defaults.jsonl"
    journal.unlink(missing_ok=True)
    defaults = defaults_file(work / "defaults.toml")
    shape_args = (args.tool_wait, args.max_model_len, args.output_scale)
    recorded_plans = workload(args.workload, args.jobs, args.rate, args.seed, *shape_args)
    fresh_plans = workload(args.workload, args.jobs, args.rate, args.seed + 1, *shape_args)
    shape = {"recorded": describe(recorded_plans), "measured": describe(fresh_plans)}
    print(f"workload: {json.dumps(shape)}", flush=True)
    specs = [
        ReplicaSpec(
            name=f"tune-{i}",
            cpu_bind=str(i % 2),
            dev_mode=True,  # POST /reset_prefix_cache before each run
            max_model_len=args.max_model_len,
            kv_cache_space_gib=1,
        )
        for i in range(2)
    ]
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrt-tune-real-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    fits: dict[str, dict[str, Any]] = {}
    # launch() stops every replica (process groups, SIGKILL after 20 s) when the block
    # ends, on errors and Ctrl-C too.
    with launch(specs, log_dir=log_dir) as replicas:
        print(f"replicas up in {max(r.startup_s or 0.0 for r in replicas):.0f} s", flush=True)
        print(HEADER)
        # 1. record
        r = run_one("defaults", defaults, replicas, recorded_plans, journal)
        r["phase"] = "record"
        runs.append(r)
        print(_row(r), flush=True)
        # 2. tune: a probe of an idle replica, then the journal alone
        for source, endpoint in (("probe", replicas[0].base_url), ("journal", None)):
            out = work / f"tuned-{source}.toml"
            result = tune(
                journal,
                endpoint=endpoint,
                preset="cpu-tiny",
                sample=args.sample,
                seeds=args.seeds,
                workers=parse_workers(args.workers),
                echo=lambda line: print(line, flush=True),
            )
            for line in result.table():
                print(line, flush=True)
            out.write_text(result.to_toml())
            fits[source] = tuned(result, out)
        # 3. apply, 4. measure: alternating order on fresh jobs
        applied = work / "tuned-probe.toml"
        order = ["defaults", "tuned"]
        for n in range(args.runs):
            for label in order if n % 2 == 0 else order[::-1]:
                config = defaults if label == "defaults" else applied
                r = run_one(label, config, replicas, fresh_plans)
                r["phase"] = f"run {n}"
                runs.append(r)
                print(_row(r), flush=True)
    wall = time.monotonic() - started
    summary = summarize(runs, fits["probe"])
    result_doc = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workload": shape,
        "engine": "2 x vLLM CPU 0.32 (tiny-llama), one core each",
        "cpus": os.cpu_count(),
        "tune": fits,
        "runs": runs,
        "summary": summary,
        "wall_s": wall,
    }
    write_result(args.out, result_doc, __doc__)
    print()
    print(report(summary, fits))
    print(f"wrote {args.out} ({wall:.0f} s)")


def summarize(runs: list[dict[str, Any]], fit: dict[str, Any]) -> dict[str, Any]:
    measured = [r for r in runs if r["phase"] != "record"]
    out: dict[str, Any] = {}
    for label in ("defaults", "tuned"):
        mine = [r for r in measured if r["client"] == label]
        out[label] = {
            k: statistics.median(r[k] for r in mine) for k in ("jct_p50", "jct_p90", "jct_mean")
        }
        out[label]["spread_p50"] = [
            min(r["jct_p50"] for r in mine),
            max(r["jct_p50"] for r in mine),
        ]
        out[label]["failed"] = sum(r["failed"] for r in mine)
    out["measured_ratio"] = {
        k: out["tuned"][k] / out["defaults"][k] for k in ("jct_p50", "jct_p90", "jct_mean")
    }
    out["predicted_ratio"] = {
        "jct_p50": fit["predicted_p50_ratio"].get("1x"),
        "jct_p90": fit["predicted_p90_ratio"].get("1x"),
    }
    out["load_avg"] = [min(r["load_avg"][0] for r in runs), max(r["load_avg"][1] for r in runs)]
    return out


def report(summary: dict[str, Any], fits: dict[str, dict[str, Any]]) -> str:
    lines = []
    for source, f in fits.items():
        p50 = f["predicted_p50_ratio"]
        lines.append(f"tune ({source}): chose {f['label']}, recorded {f['recorded']}")
        lines.append(f"  best in the twin {f['best']}, confidence {f['confidence']}")
        lines.append(
            f"  fit prefill x{f['fit']['prefill_scale']:.2f} decode "
            f"x{f['fit']['decode_scale']:.2f}; p50 predicted "
            + ", ".join(f"{k} {v:.2f}" for k, v in p50.items())
        )
    lines.append(f"{'medians':10} {'JCT p50':>8} {'p90':>8} {'mean':>8}")
    for label in ("defaults", "tuned"):
        s = summary[label]
        lines.append(f"{label:10} {s['jct_p50']:8.2f} {s['jct_p90']:8.2f} {s['jct_mean']:8.2f}")
    m, p = summary["measured_ratio"], summary["predicted_ratio"]
    lines.append(f"{'measured':10} {m['jct_p50']:7.3f}x {m['jct_p90']:7.3f}x {m['jct_mean']:7.3f}x")

    def x(v: float | None) -> str:
        return "       -" if v is None else f"{v:7.3f}x"

    lines.append(f"{'predicted':10} {x(p['jct_p50'])} {x(p['jct_p90'])}")
    lines.append(f"load average during the runs: {summary['load_avg'][0]}-{summary['load_avg'][1]}")
    return "\n".join(lines)
