"""The command line of the benchmark harness: ``agentrt demo``, ``agentrt bench`` and
``agentrt traces``, their arguments and what they run. The harness itself is imported
when a command runs."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .._cliparts import Command, CommandError, examples, listing, positive
from ..sim._cli import engine_args

if TYPE_CHECKING:
    from ._parallel import Workers
    from ._runner import BenchConfig

__all__ = [
    "CLIENT_HELP",
    "DEMO_CLIENTS",
    "WORKLOADS",
    "add_bench",
    "add_demo",
    "add_traces",
    "workers_option",
]

DEMO_CLIENTS: Final = ("plain", "agentrt:round-robin", "agentrt:session")
"""``agentrt bench``'s clients unless ``--client`` is given."""

WORKLOADS: Final = {
    "coding": "the default and the demo's: coding sessions shaped like Claude Code's (long "
    "shared prompts, contexts growing turn by turn, tool waits); session routing's cache "
    "hits and TTFT show here",
    "mixed": "ReAct loops, fan-outs and chats with short contexts: little for routing to "
    "keep; the ordering policies under load (--rate)",
    "react": "tool loops of 4-12 turns: tool waits declared and learned, KV kept across them",
    "react-longtail": "long tool loops, heavy-tailed tool waits: the KV policies around a "
    "long wait (--tool-wait-policy)",
    "fanout": "a planner, 3-6 concurrent sub-agents, a reducer: program-aware ordering "
    "(agentrt:plas, agentrt:atlas)",
    "chat": "people chatting, streamed replies: TTFT",
    "claude-code": "replays of recorded Claude Code sessions, full size (the package's sample "
    "of 40; all 710: agentrt traces fetch): routing with real contexts",
    "mixed-cc": "short ReAct jobs among long Claude Code replays: head-of-line blocking, "
    "the ordering policies (agentrt:plas, agentrt:mlfq)",
}
"""The workloads of ``agentrt bench`` (tests check them against the bench package)."""

CLIENT_HELP: Final = (
    "a client to compare (repeatable; default: plain, agentrt:round-robin, "
    "agentrt:session). 'plain' is a bare openai client: every call sent at once, "
    "round-robin over replicas; 'plain:session' the same, naming each call's session in "
    "the headers agent harnesses send (x-session-id, x-dynamo-session-id, "
    "x-claude-code-session-id), as session-aware routers need. 'agentrt[:OPTIONS]': "
    "OPTIONS are names joined by '+' "
    "(a routing: round_robin, least_loaded, session_affinity, hash, or the aliases "
    "round-robin, session; a policy: fcfs, plas, atlas, mlfq, edf), then optionally "
    "'@LIMIT' (per-endpoint concurrency: an int >= 1, auto, none, or engine: a cap "
    "only while an engine's /metrics show a queue, polled every 1 s), then ',key=value' "
    "options: routing=, policy=, concurrency=, token_budget= (int), priority= (on/off: "
    "send each call's queue level as the engine priority), scheduling= (the replicas' "
    "queue order: fcfs, or priority, as vLLM's --scheduling-policy priority; default "
    "priority with priority=on, else fcfs), retention= (on/off: the replicas honour "
    "retention directives, as --retention-directives for this client alone), "
    "dialect= (default vllm), "
    "declare= (learned, the default; oracle; none), config=FILE (a settings file, as "
    "agentrt tune writes: it sets routing, policy, concurrency, token budget, priority "
    "and learned waits, so those options cannot be given with it). 'agentrt:defaults': "
    "Runtime(urls) as a user gets it, none of those options passed, so Runtime's "
    "defaults of this version are measured (no other option with it but the replicas' "
    "scheduling= and retention=). "
    "Either, then "
    "'>PEER': the client sends to one URL, a modelled router in front of the replicas "
    "(agentrt sim serve --gateway list names them: vllm-router's policies, llm-d, "
    "llm-d:flow, llm-d:fairness, dynamo, dynamo:affinity, thunderagent, ...; agentrt "
    "speaks its dialect). Examples: "
    "agentrt:session, agentrt:defaults, agentrt:plas+round_robin@auto, agentrt:mlfq@16, "
    "agentrt:session+mlfq@engine, agentrt:routing=hash,policy=plas, "
    "agentrt:config=agentrt-tuned.toml, plain>vllm-router, plain:session>thunderagent, "
    "agentrt:defaults>vllm-router:consistent_hash. Defaults: round_robin, fcfs, no limit"
)


def workers_option(text: str) -> int | str:
    """``--workers``: checked here, so a bad value is a usage error."""
    from ._parallel import parse_workers

    try:
        return parse_workers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


BENCH_OUT: Final = "agentrt-bench"
"""``agentrt bench``'s folder unless ``--out`` is given, in the current folder."""


def output_args(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path(default_out),
        metavar="DIR",
        help=f"folder for results.json, the journals and the PNGs (default: {default_out}); "
        "a run writes them only once it has results (a run in which every job failed "
        "writes nothing), replacing the files of those names, and leaves the rest of DIR",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="skip the journals (journal-<client>.jsonl in --out: one job report per line, "
        "as Runtime(journal=...) writes them)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's generator")


def bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="coding",
        choices=tuple(WORKLOADS),
        metavar="NAME",
        help="the jobs to run (listed above)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=40,
        metavar="N",
        help="number of jobs (claude-code: one trace each, so at most the traces folder "
        "holds; more is an error)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="JOBS_PER_S",
        help="Poisson arrivals, jobs per second (default: all at once)",
    )
    p.add_argument(
        "--users",
        type=int,
        default=None,
        metavar="N",
        help="closed loop instead: N users, each starting a job when its last ends",
    )
    p.add_argument(
        "--client",
        action="append",
        dest="clients",
        default=None,
        metavar="CLIENT",
        help=CLIENT_HELP,
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=4,
        metavar="N",
        help="simulated replicas of the embedded engine",
    )
    p.add_argument(
        "--fleet",
        type=int,
        default=1,
        metavar="K",
        help="run each client as a fleet of K independent clients, as a service's K worker "
        "processes: each its own Runtime (its own router, admission and learned waits; "
        "plain: its own round-robin, from a random replica), all on the same replicas, "
        "one event loop",
    )
    p.add_argument(
        "--fleet-assign",
        choices=("round_robin", "hash"),
        default="round_robin",
        help="how a fleet's jobs are dealt to its members: round_robin (the i-th job to "
        "arrive to member i mod K) or hash (a stable hash of the job's name)",
    )
    engine_args(p, serve=False)
    p.add_argument(
        "--endpoint",
        action="append",
        dest="endpoints",
        default=[],
        metavar="URL",
        help="a real server's base URL (repeatable; default: the embedded engine)",
    )
    p.add_argument(
        "--model", default=None, help="model name sent to --endpoint (default: the server's)"
    )
    p.add_argument(
        "--api",
        choices=("openai", "http"),
        default="openai",
        help="call through the openai client, or post raw JSON through agentrt's HTTP "
        "client (faster, for large replays)",
    )
    p.add_argument(
        "--no-stretch",
        action="store_true",
        help="skip the solo runs that give each job's JCT stretch",
    )
    p.add_argument(
        "--show-view",
        action="store_true",
        help="also print what each agentrt client believed about the simulated replicas' KV "
        "cache against what the replicas held (results.json has it either way: kv_view)",
    )
    p.add_argument(
        "--workers",
        type=workers_option,
        default="auto",
        metavar="N",
        help="on the embedded engine: replay the clients (and the solo runs) side by side on N "
        "processes, with the same results; auto: one per core; 1: one by one in this "
        "process; ray: on Ray (the ray extra: pip install 'agentjct[ray]'; the cluster at "
        "RAY_ADDRESS, else a local one)",
    )
    p.add_argument(
        "--tool-wait",
        type=float,
        default=2.0,
        metavar="S",
        help="median tool wait of the synthetic workloads, seconds",
    )
    p.add_argument(
        "--long-share",
        type=float,
        default=0.2,
        metavar="SHARE",
        help="mixed-cc: share of jobs that are Claude Code replays",
    )
    p.add_argument(
        "--traces",
        type=Path,
        default=None,
        metavar="DIR",
        help="Claude Code traces folder (default: $AGENTRT_TRACES, else what 'agentrt traces "
        "fetch' wrote, else the package's sample of 40)",
    )
    p.add_argument(
        "--token-scale", type=float, default=1.0, metavar="X", help="traces: scale token counts"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="traces: scale think and tool times",
    )
    p.add_argument(
        "--max-wait",
        type=float,
        default=None,
        metavar="S",
        help="traces: cap one think or tool wait, seconds (default: no cap)",
    )
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        metavar="TOKENS",
        help="traces: skip those with a call longer than this (scaled), as a model's "
        "context window would; --jobs counts the traces kept (default: keep all)",
    )
    output_args(p, BENCH_OUT)


def add_demo(command: Command, started: float) -> None:
    """``agentrt demo``; ``started``: when the command started (the demo's wall time)."""
    demo = command(
        "demo",
        "compare a plain client and agentrt on the embedded engine",
        "Runs agentic coding jobs (drawn from a fit to 710 Claude Code sessions: long "
        "shared system prompts, contexts growing turn by turn, tool waits, sub-agents in "
        "a few sessions) on the embedded engine (simulated H100-class replicas, in "
        "virtual time), once through a plain openai client and once through agentrt, and "
        "prints the comparison, a summary figure and where the results are. No server "
        "and no GPU are needed.",
        examples(
            "agentrt demo",
            "agentrt demo --out /tmp/demo --no-plots",
            "agentrt bench                       # coding jobs through three clients",
        ),
    )
    output_args(demo, "results/demo")
    demo.set_defaults(run=_demo, started=started)


def add_bench(command: Command) -> None:
    """``agentrt bench``."""
    bench = command(
        "bench",
        "run a workload through several clients, side by side",
        "Runs the same jobs through each client (--client) on the embedded engine (fresh "
        "simulated replicas for each, in virtual time), or against real servers "
        "(--endpoint) in wall-clock time, and prints JCT, call latency, TTFT and cache "
        "hits per client.\n\nworkloads:\n" + listing(WORKLOADS),
        examples(
            "agentrt bench --workload coding --jobs 32 --rate 0.2 --replicas 8",
            "agentrt bench --client plain --client agentrt:plas+session@auto",
            "agentrt bench --client plain --client agentrt:defaults --fleet 4",
            "agentrt bench --endpoint http://127.0.0.1:8000/v1 --workload react --jobs 8",
        ),
    )
    bench_args(bench)
    bench.set_defaults(run=_bench)


def add_traces(command: Command) -> None:
    """``agentrt traces fetch``: the full Claude Code traces (agentrt/bench/_traces.py)."""
    traces = command(
        "traces",
        "get the Claude Code traces (bench --workload claude-code)",
        "The Claude Code traces (callanjfox/kv-cache-tester on GitHub, Apache-2.0): the "
        "package ships a sample of 40; 'fetch' downloads the repository at a pinned commit, "
        "checks every trace against its git hash and writes the 710 under 4 MiB, which "
        "agentrt bench then reads by default.",
        examples(
            "agentrt traces fetch",
            "agentrt traces fetch --out traces/",
            "agentrt bench --workload claude-code --traces traces/",
        ),
    )
    traces.add_argument("action", choices=("fetch",), help="what to do")
    traces.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write them (default: ~/.cache/agentrt/traces/claude-code): the "
        "traces (trace_NNNN.json.gz), LICENSE and SOURCE are written there, replacing "
        "files of those names; nothing else in DIR is touched",
    )
    traces.add_argument(
        "--archive",
        type=Path,
        default=None,
        metavar="FILE",
        help="check and unpack this archive of the repository instead of downloading it "
        "(offline: download the archive elsewhere, from the URL the fetch names)",
    )
    traces.add_argument("--url", default=None, help="download the archive from here instead")
    traces.add_argument("--all", action="store_true", help="also the 29 traces of 4 MiB or more")
    traces.set_defaults(run=_traces_fetch)


def _traces_fetch(args: argparse.Namespace) -> int:
    from ._traces import TARBALL_URL, FetchError, fetch

    try:
        fetch(args.out, url=args.url or TARBALL_URL, archive=args.archive, include_large=args.all)
    except FetchError as exc:
        raise CommandError(str(exc)) from None
    return 0


def _run(
    cfg: BenchConfig,
    out: Path,
    plots: bool,
    title: str,
    journal: bool,
    workers: Workers = 1,
    show_view: bool = False,
) -> int:
    from ._output import print_table, run_with_progress

    if journal:
        cfg.journal_dir = out
    existed = out.exists()
    result = run_with_progress(cfg, workers=workers)
    from ._takeaway import all_failed, failures, why_all_failed

    if all_failed(result):
        if not existed:  # the journals' folder, made for a run that kept none
            with contextlib.suppress(OSError):
                out.rmdir()
        raise CommandError(
            f"{why_all_failed(result)}; nothing was written to {out}"
            + (" (its files are as they were)" if existed else "")
        )
    clock = "virtual time" if result.virtual_time else "wall-clock time"
    print_table(
        result,
        f"{title} ({result.calls} calls per client, {clock}, {result.wall_s:.1f} s wall)",
        view=show_view,
    )
    from ._output import terminal_width
    from ._takeaway import takeaway

    failed = failures(result)
    if failed is not None:
        print(failed)
    for line in takeaway(result, min(terminal_width(), 100)):
        print(line)
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "results.json")
    print(f"results: {out / 'results.json'}")
    journals = [c.journal for c in result.clients if c.journal]
    if journals:
        print("journals: " + ", ".join(journals))
    if plots:
        try:
            from ._output import plot

            paths = [str(p) for p in plot(result, out)]
        except ImportError:
            print("plots: install the report extra for PNG plots: pip install 'agentjct[report]'")
        else:
            print("plots: " + ", ".join(paths))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(
        args.out,
        plots=not args.no_plots,
        journal=not args.no_journal,
        seed=args.seed,
        started=args.started,
    )


def _bench(args: argparse.Namespace) -> int:
    from ._runner import BenchConfig
    from ._workloads import TraceOptions

    for option, value in (
        ("--jobs", args.jobs),
        ("--rate", args.rate),
        ("--users", args.users),
        ("--replicas", args.replicas),
        ("--fleet", args.fleet),
        ("--gpu-blocks", args.gpu_blocks),
        ("--token-scale", args.token_scale),
        ("--time-scale", args.time_scale),
        ("--max-wait", args.max_wait),
        ("--max-context", args.max_context),
    ):
        positive(value, option)
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
            max_context=args.max_context,
        ),
        stretch=not args.no_stretch and not args.endpoints,
        tool_wait_s=args.tool_wait,
        api=args.api,
        long_share=args.long_share,
        tool_wait_policy=args.tool_wait_policy,
        retention_directives=args.retention_directives,
        gpu_blocks=args.gpu_blocks,
        host_blocks=args.host_blocks,
        fleet=args.fleet,
        fleet_assign=args.fleet_assign,
    )
    title = f"agentrt bench: {args.workload}"
    return _run(
        cfg, args.out, not args.no_plots, title, not args.no_journal, args.workers, args.show_view
    )
