"""The steady-state benchmark: throughput against latency per client, closed
loop (N agents) and open loop (Poisson at fractions of the measured capacity), for ample
KV and KV pressure. The logic is the package's (:func:`agentrt.bench.steady_study`, a
:class:`agentrt.bench.SteadyConfig`); this is its command line. docs/benchmarks/steady.md
says what it measures and how far to trust it.

    # the full study (Claude Code traces that fit 200k tokens, 500 jobs, 7 clients)
    python -m benchmarks alternatives steady --workers 16 --out results/steady_claude_code.json
    # the same for the coding workload
    python -m benchmarks alternatives steady --workload coding --workers 16
    # a smoke test (coding, 48 jobs, 2 replicas, 2 clients; about a minute on 2 cores)
    python -m benchmarks alternatives steady --quick --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from agentrt.bench import SteadyConfig, TraceOptions, steady_study

from ._harness import add_run_args


def add_args(ap: argparse.ArgumentParser) -> None:
    d = SteadyConfig()
    ap.add_argument("--quick", action="store_true", help="a small study (CI, smoke test)")
    ap.add_argument("--workload", default=None, help="claude-code (default) or coding, ...")
    ap.add_argument("--jobs", type=int, default=None, help=f"jobs per replay ({d.jobs})")
    ap.add_argument("--clients", nargs="+", default=None, help="client specs (agentrt bench)")
    ap.add_argument("--users", nargs="+", type=int, default=None, help="closed-loop N values")
    ap.add_argument(
        "--loads", nargs="*", type=float, default=None, help="x capacity (none: closed loop only)"
    )
    ap.add_argument("--kv", nargs="+", choices=("ample", "pressure"), default=None)
    ap.add_argument("--pressure-blocks", type=int, default=None, help="KV blocks per replica")
    ap.add_argument(
        "--host-blocks", type=int, default=None, help="KV blocks per replica's host tier"
    )
    ap.add_argument("--replicas", type=int, default=None)
    ap.add_argument("--preset", default=d.preset)
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--max-context", type=int, default=200_000)
    ap.add_argument("--max-wait", type=float, default=30.0, help="cap on one wait (s)")
    ap.add_argument("--token-scale", type=float, default=1.0)
    ap.add_argument("--warmup-share", type=float, default=d.warmup_share)
    ap.add_argument("--knee", type=float, default=d.knee)
    ap.add_argument("--bootstrap", type=int, default=None)
    ap.add_argument("--no-stretch", action="store_true")
    ap.add_argument("--api", choices=("http", "openai"), default=d.api)
    ap.add_argument("--plot", type=Path, default=None, help="PNG (next to --out)")
    add_run_args(ap, out="", seed=0, workers="auto")


def config(args: argparse.Namespace) -> SteadyConfig:
    """The study's configuration from the options."""
    d = SteadyConfig.quick() if args.quick else SteadyConfig()
    fields: dict[str, Any] = {}
    for name in ("workload", "jobs", "clients", "users", "loads", "kv", "replicas", "bootstrap"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = tuple(value) if isinstance(value, list) else value
    traces = TraceOptions(
        directory=args.traces,
        max_context=args.max_context,
        max_wait_s=args.max_wait,
        token_scale=args.token_scale,
    )
    cfg = dataclasses.replace(
        d,
        seed=args.seed,
        preset=args.preset,
        pressure_blocks=args.pressure_blocks,
        host_blocks=args.host_blocks,
        traces=traces,
        warmup_share=args.warmup_share,
        knee=args.knee,
        stretch=not args.no_stretch,
        api=args.api,
        **fields,
    )
    return cfg


def main(args: argparse.Namespace) -> int:
    cfg = config(args)
    try:
        cfg.check()
    except ValueError as exc:
        print(f"steady_state: {exc}", file=sys.stderr)
        return 2
    tag = f"{cfg.workload}{'-quick' if args.quick else ''}"
    out = args.out or Path("results") / f"steady_{tag.replace('-', '_')}.json"
    steady_study(
        cfg, out, png=args.plot, workers=args.workers, echo=lambda line: print(line, flush=True)
    )
    return 0
