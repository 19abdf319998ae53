"""The ``agentrt`` command: ``demo``, ``bench``, ``report``, ``tune`` and ``sim serve``.

Only the standard library is imported up front, so ``agentrt --help`` starts fast; each
subcommand imports what it needs when it runs. Errors are one line on stderr (exit status
2), never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from .bench._parallel import Workers
    from .bench._runner import BenchConfig

__all__ = ["main"]

_STARTED: Final = time.perf_counter()
"""When the command started (its interpreter start-up aside): the demo's wall time."""

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

PRESETS: Final = {
    "h100-8b": "an 8B model on one H100 (vLLM's defaults)",
    "cpu-tiny": "the tiny test model on vLLM's CPU engine",
}
"""The embedded engine's presets (tests check them against ``agentrt.sim.PRESETS``)."""

KV_POLICIES: Final = ("lru", "keep", "pin", "offload", "drop", "adaptive", "resume")
SCHEDULING: Final = ("fcfs", "priority")
FINAL_POLICIES: Final = ("lru", "drop")

CLIENT_HELP: Final = (
    "a client to compare (repeatable; default: plain, agentrt:round-robin, "
    "agentrt:session). 'plain' is a bare openai client: every call sent at once, "
    "round-robin over replicas. 'agentrt[:OPTIONS]': OPTIONS are names joined by '+' "
    "(a routing: round_robin, least_loaded, session_affinity, hash, or the aliases "
    "round-robin, session; a policy: fcfs, plas, atlas, mlfq, edf), then optionally "
    "'@LIMIT' (per-endpoint concurrency: an int >= 1, auto, none, or engine: a cap "
    "only while an engine's /metrics show a queue, polled every 1 s), then ',key=value' "
    "options: routing=, policy=, concurrency=, token_budget= (int), priority= (on/off: "
    "send each call's queue level as the engine priority), dialect= (default vllm), "
    "declare= (learned, the default; oracle; none), config=FILE (a settings file, as "
    "agentrt tune writes: it sets routing, policy, concurrency, token budget, priority "
    "and learned waits, so those options cannot be given with it). 'agentrt:defaults': "
    "Runtime(urls) as a user gets it, none of those options passed, so Runtime's "
    "defaults of this version are measured (no other option with it). Either, then "
    "'>PEER': the client sends to one URL, a modelled router in front of the replicas "
    "(agentrt sim serve --gateway list names them; agentrt speaks its dialect). Examples: "
    "agentrt:session, agentrt:defaults, agentrt:plas+round_robin@auto, agentrt:mlfq@16, "
    "agentrt:session+mlfq@engine, agentrt:routing=hash,policy=plas, "
    "agentrt:config=agentrt-tuned.toml, plain>vllm-router, "
    "agentrt:defaults>vllm-router:consistent_hash. Defaults: round_robin, fcfs, no limit"
)

_EXTRAS: Final = {
    "matplotlib": "report",
    "rich": "report",
    "uvicorn": "serve",
    "prometheus_client": "prometheus",
    "opentelemetry": "otel",
    "ray": "ray",
}
"""Optional modules and the extra that installs each."""


class _Formatter(argparse.HelpFormatter):
    """Wraps prose to the terminal, keeps indented lists and examples as written, and adds
    each option's default to its help."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if any(line.startswith(" ") for line in paragraph.splitlines()):
                paragraphs.append(paragraph)
            else:
                paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
            or isinstance(default, list)
        ):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line that says what to do."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


class _CommandError(Exception):
    """A failure the command reports as one line (exit status 2)."""


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _listing(items: dict[str, str], columns: int = 79) -> str:
    width = max(map(len, items))
    return "\n".join(
        textwrap.fill(
            text,
            columns,
            initial_indent=f"  {name.ljust(width)}  ",
            subsequent_indent=" " * (width + 4),
            break_on_hyphens=False,
        )
        for name, text in items.items()
    )


def _output_args(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path(default_out),
        metavar="DIR",
        help="folder for results.json, the journals and the PNGs",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="skip the journals (journal-<client>.jsonl in --out: one job report per line, "
        "as Runtime(journal=...) writes them)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's generator")


def _engine_args(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """The embedded engine's options, shared by ``bench`` and ``sim serve``."""
    p.add_argument(
        "--preset",
        default="h100-8b",
        choices=tuple(PRESETS),
        help="the engine's cost model and limits: "
        + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()),
    )
    p.add_argument(
        "--gpu-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks on each replica's accelerator (default: the preset's)",
    )
    p.add_argument(
        "--host-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks in each replica's host tier (default: the preset's, none)",
    )
    p.add_argument(
        "--tool-wait-policy",
        default=None,
        choices=KV_POLICIES,
        metavar="POLICY",
        help="what a replica does with a session's KV during a declared tool wait: "
        + ", ".join(KV_POLICIES)
        + " (default: the preset's, lru; docs/sim.md)",
    )
    p.add_argument(
        "--retention-directives",
        action="store_true",
        help="the replicas honour retention directives: a session's declared end and "
        "expected idle order their evictions (ended first, then LRU, then the session "
        "waking latest); default: plain LRU, as released vLLM (docs/sim.md)",
    )
    if serve:
        p.add_argument(
            "--scheduling",
            default="fcfs",
            choices=SCHEDULING,
            help="the replicas' queue order: fcfs, or priority (the request's priority "
            "field, as vLLM's --scheduling-policy priority)",
        )
        p.add_argument(
            "--final-policy",
            default=None,
            choices=FINAL_POLICIES,
            metavar="POLICY",
            help="what a replica does with a session's KV when its declared last call "
            "(final) finishes: lru (leave it to LRU, as vLLM) or drop (free the "
            "session's own blocks at once; shared prefixes stay) (default: the preset's, "
            "lru; docs/sim.md)",
        )


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "journals", nargs="+", type=Path, metavar="JOURNAL", help="journal files (JSON lines)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("agentrt-tuned.toml"),
        metavar="FILE",
        help="where the best settings go (TOML: Runtime keyword arguments)",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="calibrate the engine by probing this idle server (default: from the "
        "journal's own latencies)",
    )
    p.add_argument(
        "--model", default=None, help="model name sent to --endpoint (default: the server's)"
    )
    p.add_argument(
        "--preset",
        default="h100-8b",
        choices=tuple(PRESETS),
        help="the engine whose costs are calibrated and whose limits are kept",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="replicas of the twin (default: the endpoints in the journal)",
    )
    p.add_argument(
        "--fleet",
        type=int,
        default=None,
        metavar="K",
        help="the processes that will each run the settings, as a service's K workers: "
        "every candidate is replayed as K independent runtimes on the twin (default: the "
        "journals' runtimes that ran jobs at once, told apart by their runtime_id; jobs "
        "dealt as recorded, or round-robin by arrival for another K)",
    )
    p.add_argument(
        "--gateway",
        default=None,
        metavar="PEER",
        help="the router the agents call through, modelled in front of the twin's "
        "replicas (e.g. vllm-router:consistent_hash; agentrt sim serve --gateway list): "
        "every setting is replayed behind it",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=150,
        metavar="JOBS",
        help="jobs per replay: a window of consecutive arrivals",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        metavar="N",
        help="windows the finalists are replayed on (their spread: the confidence)",
    )
    p.add_argument(
        "--top", type=int, default=3, metavar="N", help="coarse settings kept for the fine round"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="JOBS",
        help="jobs replayed before each window to load the cluster, not counted "
        "(default: a third of --sample)",
    )
    p.add_argument(
        "--gpu-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks per replica of the engines the journal ran on (vLLM logs "
        "'# GPU blocks: N'; default: --endpoint's metrics, else the preset's)",
    )
    p.add_argument(
        "--host-blocks",
        type=int,
        default=None,
        metavar="N",
        help="host-tier KV blocks per replica (default: the preset's)",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="N",
        help="processes the replays run on (auto: one per core; 1: in this process)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="tune journals shorter than one --sample anyway (one replay per setting: "
        "confidence low); without it they are refused at once, saying what would help",
    )


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="coding",
        choices=tuple(WORKLOADS),
        metavar="NAME",
        help="the jobs to run (listed above)",
    )
    p.add_argument("--jobs", type=int, default=40, metavar="N", help="number of jobs")
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
    p.add_argument("--replicas", type=int, default=4, metavar="N", help="embedded engine replicas")
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
    _engine_args(p, serve=False)
    p.add_argument(
        "--endpoint",
        action="append",
        dest="endpoints",
        default=[],
        metavar="URL",
        help="a real server's base URL (repeatable; default: the embedded cluster)",
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
        "--workers",
        type=_workers,
        default="auto",
        metavar="N",
        help="embedded runs: replay the clients (and the solo runs) side by side on N "
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
    _output_args(p, "results")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="agentrt",
        formatter_class=_Formatter,
        description="agentrt: jobs, sessions and tool waits for LLM calls. Compare a plain "
        "client with agentrt on an embedded engine cluster, benchmark workloads, read "
        "journals, or serve simulated replicas.",
        epilog=_examples(
            "agentrt demo                    # the main job: plain client vs agentrt",
            "agentrt sim serve               # an OpenAI-compatible server on :8000",
            "agentrt report journal.jsonl    # JCT tables from a Runtime's journal",
        ),
    )
    parser.add_argument("--version", action="version", version=f"agentrt {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_text: str, description: str, epilog: str) -> _Parser:
        p: _Parser = sub.add_parser(
            name,
            help=help_text,
            description=description,
            epilog=epilog,
            formatter_class=_Formatter,
        )
        return p

    demo = command(
        "demo",
        "compare a plain client and agentrt on an embedded cluster",
        "Runs agentic coding jobs (drawn from a fit to 710 Claude Code sessions: long "
        "shared system prompts, contexts growing turn by turn, tool waits, sub-agents in "
        "a few sessions) on an embedded cluster of simulated H100-class replicas in "
        "virtual time, once through a plain openai client and once through agentrt, and "
        "prints the comparison, a summary figure and where the results are. No server "
        "and no GPU are needed.",
        _examples(
            "agentrt demo",
            "agentrt demo --out /tmp/demo --no-plots",
            "agentrt bench                       # coding jobs through three clients",
        ),
    )
    _output_args(demo, "results/demo")

    bench = command(
        "bench",
        "run a workload through several clients, side by side",
        "Runs the same jobs through each client (--client) on a fresh embedded cluster in "
        "virtual time, or against real servers (--endpoint) in wall-clock time, and "
        "prints JCT, call latency, TTFT and cache hits per client.\n\nworkloads:\n"
        + _listing(WORKLOADS),
        _examples(
            "agentrt bench --workload coding --jobs 32 --rate 0.2 --replicas 8",
            "agentrt bench --client plain --client agentrt:plas+session@auto",
            "agentrt bench --client plain --client agentrt:defaults --fleet 4",
            "agentrt bench --endpoint http://127.0.0.1:8000/v1 --workload react --jobs 8",
        ),
    )
    _bench_args(bench)

    report = command(
        "report",
        "tables and plots from journals (Runtime(journal=...))",
        "Per job name: JCT percentiles beside per-call latency, where the time went "
        "(queue, LLM critical path, tools), cache share, retries, session moves and "
        "errors. Several journals are pooled unless --compare. Needs the report extra: "
        "pip install 'agentjct[report]'.",
        _examples(
            "agentrt report results/demo/journal-agentrt_session.jsonl",
            "agentrt report --compare A.jsonl B.jsonl",
            "agentrt report journal.jsonl --png plots/ --html report.html",
        ),
    )
    report.add_argument(
        "journals", nargs="+", type=Path, metavar="JOURNAL", help="journal files (JSON lines)"
    )
    report.add_argument(
        "--compare",
        action="store_true",
        help="two journals A and B side by side per job name, with ratios B/A",
    )
    report.add_argument(
        "--png",
        type=Path,
        metavar="DIR",
        help="write jct_cdf.png, breakdown.png, timeline.png, jobs.png",
    )
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="write one self-contained HTML page"
    )
    report.add_argument(
        "--job",
        metavar="ID",
        help="the job whose timeline and critical path are shown (default: the slowest)",
    )

    tune = command(
        "tune",
        "pick the best settings for the workload in journals",
        "Turns journals (Runtime(journal=...)) into a workload, calibrates the embedded "
        "engine to the journal's latencies (or to a probe of --endpoint), replays the "
        "workload in virtual time under a grid of settings (routing, policy, "
        "concurrency limit, priority pass-through, learned tool waits) at the observed "
        "load and at 1.5x and 2x it, prints them ranked by predicted JCT against the "
        "settings the journal was recorded with, and writes the best as Runtime keyword "
        "arguments to a TOML file (docs/tune.md). Each candidate is replayed as a fleet of "
        "K processes each running it, K the journals' runtimes that ran at once or "
        "--fleet: what is best for one process can be worst for 16.",
        _examples(
            "agentrt tune runs.jsonl",
            "agentrt tune day1.jsonl day2.jsonl --out tuned.toml",
            "agentrt tune runs.jsonl --endpoint http://127.0.0.1:8000/v1",
            "agentrt tune runs.jsonl --sample 100 --seeds 2 --workers 2",
            "agentrt tune worker-*.jsonl              # one journal per worker: a fleet",
            "agentrt tune runs.jsonl --fleet 16       # settings for 16 processes",
        ),
    )
    _tune_args(tune)

    sim = command(
        "sim",
        "the embedded engine",
        "The embedded engine: simulated vLLM-like replicas (docs/sim.md).",
        _examples("agentrt sim serve --replicas 2"),
    )
    sim.set_defaults(run=lambda _: _print_help(sim))
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    serve: _Parser = sim_sub.add_parser(
        "serve",
        help="serve simulated replicas over HTTP (the OpenAI API)",
        description="Serves simulated replicas in wall-clock time with the OpenAI API "
        "(chat and text completions, streaming, /v1/models, /metrics), for agent code and "
        "frameworks to run against. Prints the URLs it serves. Needs the serve extra: pip "
        "install 'agentjct[serve]'.",
        epilog=_examples(
            "agentrt sim serve",
            "agentrt sim serve --replicas 2 --port 8100 --replies agent",
            "agentrt sim serve --gpu-blocks 2048 --host-blocks 8192 --tool-wait-policy pin",
            "agentrt sim serve --replicas 4 --gateway vllm-router:cache_aware",
        ),
        formatter_class=_Formatter,
    )
    serve.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas served")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on; 0 picks a free one"
    )
    serve.add_argument(
        "--replies",
        choices=("filler", "agent"),
        default="filler",
        help="filler: random words; agent: follow CALL/ANSWER directives in the last user "
        "message and answer tools=[...] with tool calls, so agents run real tool loops "
        "(docs/sim.md)",
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model names requests may ask for, as vLLM's option (the first is listed "
        "by /v1/models); others get 404 model_not_found (default: the preset's model name)",
    )
    serve.add_argument(
        "--gateway",
        default=None,
        metavar="PEER",
        help="a modelled router at the front door /v1 instead of round-robin, e.g. "
        "vllm-router:cache_aware (docs/sim.md, Peers; the list: --gateway list)",
    )
    _engine_args(serve, serve=True)
    _traces_args(command)
    parser.set_defaults(run=lambda _: _print_help(parser))
    demo.set_defaults(run=_demo)
    bench.set_defaults(run=_bench)
    report.set_defaults(run=_report)
    tune.set_defaults(run=_tune)
    serve.set_defaults(run=_sim_serve)
    return parser


def _traces_args(command: Callable[[str, str, str, str], _Parser]) -> None:
    """``agentrt traces fetch``: the full Claude Code traces (agentrt/bench/_traces.py)."""
    traces = command(
        "traces",
        "get the Claude Code traces (bench --workload claude-code)",
        "The Claude Code traces (callanjfox/kv-cache-tester on GitHub, Apache-2.0): the "
        "package ships a sample of 40; 'fetch' downloads the repository at a pinned commit, "
        "checks every trace against its git hash and writes the 710 under 4 MiB, which "
        "agentrt bench then reads by default.",
        _examples(
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
        help="where to write them (default: ~/.cache/agentrt/traces/claude-code)",
    )
    traces.add_argument(
        "--archive",
        type=Path,
        default=None,
        metavar="FILE",
        help="check and unpack this archive of the repository instead of downloading it",
    )
    traces.add_argument("--url", default=None, help="download the archive from here instead")
    traces.add_argument("--all", action="store_true", help="also the 29 traces of 4 MiB or more")
    traces.set_defaults(run=_traces_fetch)


def _traces_fetch(args: argparse.Namespace) -> int:
    from .bench._traces import TARBALL_URL, FetchError, fetch

    try:
        fetch(args.out, url=args.url or TARBALL_URL, archive=args.archive, include_large=args.all)
    except FetchError as exc:
        raise _CommandError(str(exc)) from None
    return 0


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentjct")  # the distribution's name on PyPI
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


def _workers(text: str) -> int | str:
    """``--workers``: checked here, so a bad value is a usage error."""
    from .bench._parallel import parse_workers

    try:
        return parse_workers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(value: int | float | None, option: str) -> None:
    if value is not None and value <= 0:
        raise _CommandError(f"{option} must be positive, got {value}")


def _run_bench(
    cfg: BenchConfig, out: Path, plots: bool, title: str, journal: bool, workers: Workers = 1
) -> int:
    from .bench._output import print_table, run_with_progress

    if journal:
        cfg.journal_dir = out
    result = run_with_progress(cfg, workers=workers)
    clock = "virtual time" if result.virtual_time else "wall-clock time"
    print_table(
        result,
        f"{title} ({result.calls} calls per client, {clock}, {result.wall_s:.1f} s wall)",
    )
    from .bench._output import terminal_width
    from .bench._takeaway import takeaway

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
            from .bench._output import plot

            paths = [str(p) for p in plot(result, out)]
        except ImportError:
            print("plots: install the report extra for PNG plots: pip install 'agentjct[report]'")
        else:
            print("plots: " + ", ".join(paths))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .bench._demo import run_demo

    return run_demo(
        args.out,
        plots=not args.no_plots,
        journal=not args.no_journal,
        seed=args.seed,
        started=_STARTED,
    )


def _bench(args: argparse.Namespace) -> int:
    from .bench._runner import BenchConfig
    from .bench._workloads import TraceOptions

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
        _positive(value, option)
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
    return _run_bench(cfg, args.out, not args.no_plots, title, not args.no_journal, args.workers)


def _gateway_name(name: str | None) -> str | None:
    if name is None:
        return None
    from .sim.peers import peer_name

    try:
        return peer_name(name)
    except ValueError as exc:
        raise _CommandError(f"--gateway: {exc}") from None


def _tune(args: argparse.Namespace) -> int:
    from .tune._command import TuneOptions, tune

    for option, value in (
        ("--replicas", args.replicas),
        ("--fleet", args.fleet),
        ("--sample", args.sample),
        ("--seeds", args.seeds),
        ("--top", args.top),
        ("--gpu-blocks", args.gpu_blocks),
        ("--host-blocks", args.host_blocks),
    ):
        _positive(value, option)
    if args.sample < 2:
        raise _CommandError(f"--sample must be at least 2 jobs, got {args.sample}")
    if args.out.is_dir():
        raise _CommandError(f"--out {args.out} is a directory; give a file name")
    opts = TuneOptions(
        journals=tuple(args.journals),
        out=args.out,
        endpoint=args.endpoint,
        model=args.model,
        preset=args.preset,
        replicas=args.replicas,
        sample=args.sample,
        seeds=args.seeds,
        top=args.top,
        warmup=args.warmup,
        gpu_blocks=args.gpu_blocks,
        host_blocks=args.host_blocks,
        workers=args.workers,
        fleet=args.fleet,
        force=args.force,
        gateway=_gateway_name(args.gateway),
    )
    tune(opts)
    return 0


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
    _positive(args.replicas, "--replicas")
    _positive(args.gpu_blocks, "--gpu-blocks")
    if args.host_blocks is not None and args.host_blocks < 0:
        raise _CommandError(f"--host-blocks must be 0 or more, got {args.host_blocks}")
    if not 0 <= args.port <= 65535:
        raise _CommandError(f"--port must be between 0 and 65535, got {args.port}")
    gateway = None
    if args.gateway is not None:
        from .sim.peers import PEERS, peer_name

        if args.gateway == "list":
            print("\n".join(sorted(PEERS)))
            return 0
        try:
            gateway = peer_name(args.gateway)
        except ValueError as exc:
            raise _CommandError(f"--gateway: {exc}") from None
    import uvicorn  # noqa: F401  # the serve extra: a one-line error below when missing

    from .sim import ServedURLs, serve
    from .sim._config import resolve_config

    given = {
        "num_gpu_blocks": args.gpu_blocks,
        "num_host_blocks": args.host_blocks,
        "tool_wait_policy": args.tool_wait_policy,
        "final_policy": args.final_policy,
        "retention_directives": args.retention_directives or None,
    }
    config = resolve_config(args.preset)
    names = tuple(args.served_model_name or (config.model_name,))
    config = config.replace(
        model_name=names[0],
        served_model_names=names,
        replies=args.replies,
        scheduling=args.scheduling,
        **{name: value for name, value in given.items() if value is not None},
    )

    def ready(urls: ServedURLs) -> None:
        print("serving (Ctrl-C to stop):", flush=True)
        for line in urls.lines():
            print(f"  {line}", flush=True)

    try:
        serve(
            args.replicas,
            args.host,
            args.port,
            config,
            log_level="warning",
            on_ready=ready,
            gateway=gateway,
        )
    except RuntimeError as exc:  # the server did not start (the reason is one line)
        raise _CommandError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise _CommandError(
                f"port {args.port} on {args.host} is in use; pick another with --port"
            ) from None
        raise _CommandError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        pass
    return 0


def _missing_extra(exc: ModuleNotFoundError) -> str:
    module = (exc.name or "").split(".")[0]
    extra = _EXTRAS.get(module)
    if extra is None:
        return f"{exc}; reinstall agentrt: pip install --force-reinstall agentjct"
    return f"this command needs {module}, from the {extra} extra: pip install 'agentjct[{extra}]'"


def _unreachable(exc: BaseException) -> bool:
    """A server that could not be reached (httpx's or httpx2's connect errors, raised by
    a command that talks to a server the user named)."""
    return type(exc).__module__.split(".")[0] in ("httpx", "httpx2") and type(exc).__name__ in (
        "ConnectError",
        "ConnectTimeout",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit status (0 on success, 2 on an error)."""
    args = _parser().parse_args(argv)  # --help and bad options exit here, fast
    from ._errors import AgentrtError  # (imports openai: after the parse)

    try:
        status: int = args.run(args)
    except ModuleNotFoundError as exc:
        message = _missing_extra(exc)
    except (_CommandError, AgentrtError, ValueError, FileNotFoundError, ImportError) as exc:
        message = str(exc)  # agentrt's errors say what to do (a server not there: its URL)
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as exc:
        if os.environ.get("AGENTRT_TRACEBACK"):
            raise
        if _unreachable(exc):
            url = getattr(getattr(exc, "request", None), "url", None)
            where = f" at {url}" if url is not None else ""
            message = (
                f"could not connect{where} ({type(exc).__name__}: {exc}); is the server "
                "running there? Check the URL (scheme, host, port and path)"
            )
        else:
            message = (
                f"unexpected {type(exc).__name__}: {exc} (a bug: please report it; "
                "AGENTRT_TRACEBACK=1 shows where)"
            )
    else:
        return status
    from ._config import redact_userinfo  # (stdlib only: no cost at start-up)

    print(f"agentrt: error: {redact_userinfo(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
