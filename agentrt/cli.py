"""The ``agentrt`` command: ``demo``, ``bench``, ``report`` and ``sim serve``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .bench._drivers import CLIENT_SPEC_HELP

if TYPE_CHECKING:
    from .bench._runner import BenchConfig

__all__ = ["main"]

DEMO_CLIENTS = ("plain", "agentrt:round-robin", "agentrt:session")


def _bench_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results" if not demo else "results/demo"),
        help="folder for results.json and the PNGs (default: %(default)s)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="skip the journals (journal-<client>.jsonl in --out: one job report per line, "
        "as Runtime(journal=...) writes them)",
    )
    p.add_argument("--seed", type=int, default=0)
    if demo:
        return
    p.add_argument(
        "--workload",
        default="mixed",
        choices=("react", "react-longtail", "fanout", "chat", "mixed", "claude-code", "mixed-cc"),
        help="mixed: ReAct, fan-out and chat jobs; mixed-cc: short ReAct jobs and long Claude "
        "Code replays (--long-share of them); react-longtail: long ReAct loops over tools "
        "with heavy-tailed waits; default: %(default)s",
    )
    p.add_argument(
        "--long-share",
        type=float,
        default=0.2,
        help="mixed-cc: share of jobs that are Claude Code replays (default: %(default)s)",
    )
    p.add_argument("--jobs", type=int, default=40, help="number of jobs (default: %(default)s)")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrivals, jobs per second (default: all at once)",
    )
    p.add_argument(
        "--client",
        action="append",
        dest="clients",
        default=None,
        metavar="CLIENT",
        help="a client to compare (repeatable; default: plain, agentrt:round-robin, "
        "agentrt:session). " + CLIENT_SPEC_HELP.replace("%", "%%"),
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--preset", default="h100-8b", help="embedded engine cost model")
    p.add_argument(
        "--endpoint",
        action="append",
        dest="endpoints",
        default=[],
        help="a real server's base URL (repeatable); default: the embedded cluster",
    )
    p.add_argument("--model", default=None)
    p.add_argument(
        "--no-stretch",
        action="store_true",
        help="skip the solo runs that give each job's JCT stretch",
    )
    p.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="Claude Code traces folder (default: ../shared/traces/claude-code)",
    )
    p.add_argument("--token-scale", type=float, default=1.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument(
        "--max-wait", type=float, default=None, help="cap one think or tool wait, seconds"
    )
    p.add_argument(
        "--users",
        type=int,
        default=None,
        help="closed loop: this many users, each starting a job when its last ends",
    )
    p.add_argument(
        "--api",
        choices=("openai", "http"),
        default="openai",
        help="call through the openai client (default) or post raw JSON through agentrt's "
        "HTTP client (faster, for large replays)",
    )
    p.add_argument(
        "--tool-wait",
        type=float,
        default=2.0,
        help="median tool wait of the synthetic workloads, seconds",
    )
    p.add_argument(
        "--tool-wait-policy",
        default=None,
        help="embedded replicas: what the engine does with a session's KV during a declared "
        "tool wait (lru, keep, pin, offload, drop, ...; default: the preset's, lru)",
    )
    p.add_argument(
        "--gpu-blocks",
        type=int,
        default=None,
        help="embedded replicas: KV blocks on the accelerator (default: the preset's)",
    )
    p.add_argument(
        "--host-blocks",
        type=int,
        default=None,
        help="embedded replicas: KV blocks in the host tier (default: the preset's, none)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrt",
        description="agentrt: jobs, sessions and tool waits for LLM calls.",
    )
    parser.add_argument("--version", action="version", version=f"agentrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="compare a plain client and agentrt on an embedded 4-replica cluster",
        description="Runs a mixed agent workload (ReAct loops, fan-outs, chats) on an "
        "embedded cluster of 4 simulated H100-class replicas in virtual time, with a "
        "plain openai client and with agentrt, and prints the comparison.",
    )
    _bench_args(demo, demo=True)

    bench = sub.add_parser("bench", help="run a benchmark workload through several clients")
    _bench_args(bench, demo=False)

    report = sub.add_parser(
        "report",
        help="tables and plots from journals (Runtime(journal=...))",
        description="Per job name: JCT percentiles beside per-call latency, where the time "
        "went (queue, LLM critical path, tools), cache share, retries, session moves and "
        "errors. Several journals are pooled unless --compare. Needs the report extra: "
        'pip install "agentrt[report]".',
    )
    report.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL")
    report.add_argument(
        "--compare",
        action="store_true",
        help="two journals A and B side by side per job name, with ratios B/A",
    )
    report.add_argument(
        "--png", type=Path, metavar="DIR", help="write jct_cdf.png, breakdown.png, timeline.png"
    )
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="write one self-contained HTML page"
    )
    report.add_argument(
        "--job",
        metavar="ID",
        help="the job whose timeline and critical path are shown (default: the slowest)",
    )

    sim = sub.add_parser("sim", help="the embedded engine")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    serve = sim_sub.add_parser("serve", help="serve simulated replicas on loopback")
    serve.add_argument("--replicas", type=int, default=1)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--preset", default="h100-8b")
    serve.add_argument(
        "--replies",
        choices=("filler", "agent"),
        default="filler",
        help="'agent': follow CALL/ANSWER directives in the last user message, so agent "
        "frameworks call real tools (docs/sim.md)",
    )
    return parser


def _run_bench(cfg: BenchConfig, out: Path, plots: bool, title: str, journal: bool) -> int:
    from .bench._output import print_table, progress_bar
    from .bench._runner import run_bench

    if journal:
        cfg.journal_dir = out
    solo = 1 if cfg.stretch and not cfg.endpoints else 0
    total = cfg.jobs * (len(cfg.clients) + solo)
    with progress_bar(total, enabled=sys.stderr.isatty()) as advance:
        result = run_bench(cfg, advance)
    clock = "virtual time" if result.virtual_time else "wall-clock time"
    print_table(
        result,
        f"{title} ({result.calls} calls per client, {clock}, {result.wall_s:.1f} s wall)",
    )
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "results.json")
    print(f"results: {out / 'results.json'}")
    journals = [c.journal for c in result.clients if c.journal]
    if journals:
        print("journals: " + ", ".join(journals))
    if plots:
        try:
            from .bench._output import plot

            paths = [str(p) for p in plot(result, out)]
        except ImportError:
            print("plots: install the report extra for PNG plots: pip install -e '.[report]'")
        else:
            print("plots: " + ", ".join(paths))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .bench._runner import BenchConfig

    cfg = BenchConfig(
        workload="mixed",
        jobs=60,
        rate=2.0,
        seed=args.seed,
        clients=DEMO_CLIENTS,
        replicas=4,
        preset="h100-8b",
    )
    started = time.perf_counter()
    rc = _run_bench(
        cfg,
        args.out,
        not args.no_plots,
        "agentrt demo: 60 agent jobs on 4 simulated H100-class replicas",
        not args.no_journal,
    )
    print(
        "JCT is each job's completion time; stretch is JCT over the same job's JCT alone "
        "on an idle cluster (1.0 is the limit).\n"
        f"Done in {time.perf_counter() - started:.1f} s. More: agentrt bench --help"
    )
    return rc


def _bench(args: argparse.Namespace) -> int:
    from .bench._runner import BenchConfig
    from .bench._workloads import TraceOptions

    cfg = BenchConfig(
        workload=args.workload,
        jobs=args.jobs,
        rate=args.rate,
        users=args.users,
        seed=args.seed,
        clients=tuple(args.clients or DEMO_CLIENTS),
        replicas=args.replicas,
        preset=args.preset,
        endpoints=tuple(args.endpoints),
        model=args.model,
        traces=TraceOptions(
            directory=args.traces,
            token_scale=args.token_scale,
            time_scale=args.time_scale,
            max_wait_s=args.max_wait,
        ),
        stretch=not args.no_stretch and not args.endpoints,
        tool_wait_s=args.tool_wait,
        api=args.api,
        long_share=args.long_share,
        tool_wait_policy=args.tool_wait_policy,
        gpu_blocks=args.gpu_blocks,
        host_blocks=args.host_blocks,
    )
    title = f"agentrt bench: {args.workload}"
    return _run_bench(cfg, args.out, not args.no_plots, title, not args.no_journal)


def _report(args: argparse.Namespace) -> int:
    from .report import report

    def warn(message: str) -> None:
        print(f"agentrt: warning: {message}", file=sys.stderr)

    report(
        args.journals,
        compare_runs=args.compare,
        png_dir=args.png,
        html_path=args.html,
        job_id=args.job,
        warn=warn,
    )
    return 0


def _sim_serve(args: argparse.Namespace) -> int:
    from .sim import serve
    from .sim._config import resolve_config

    preset = resolve_config(args.preset).replace(replies=args.replies)

    def ready(urls: tuple[str, ...]) -> None:
        print("serving (Ctrl-C to stop):")
        for url in urls:
            print(f"  {url}")

    try:
        serve(args.replicas, args.host, args.port, preset, on_ready=ready)
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "report":
            return _report(args)
        if args.command == "sim" and args.sim_command == "serve":
            return _sim_serve(args)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"agentrt: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
