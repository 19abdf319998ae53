"""The command line of ``agentrt tune``: its arguments and what it runs
(:func:`agentrt.tune.tune`, imported when it runs; the command prints its table and
writes its file)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._cliparts import Command, CommandError, examples, positive
from ..bench._cli import workers_option
from ..sim._cli import PRESETS, gateway_name

__all__ = ["add_tune", "tune_args"]


def tune_args(p: argparse.ArgumentParser) -> None:
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
        type=workers_option,
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


def add_tune(command: Command) -> None:
    """``agentrt tune``."""
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
        examples(
            "agentrt tune runs.jsonl",
            "agentrt tune day1.jsonl day2.jsonl --out tuned.toml",
            "agentrt tune runs.jsonl --endpoint http://127.0.0.1:8000/v1",
            "agentrt tune runs.jsonl --sample 100 --seeds 2 --workers 2",
            "agentrt tune worker-*.jsonl              # one journal per worker: a fleet",
            "agentrt tune runs.jsonl --fleet 16       # settings for 16 processes",
        ),
    )
    tune_args(tune)
    tune.set_defaults(run=_tune)


def _tune(args: argparse.Namespace) -> int:
    from . import tune

    for option, value in (
        ("--replicas", args.replicas),
        ("--fleet", args.fleet),
        ("--sample", args.sample),
        ("--seeds", args.seeds),
        ("--top", args.top),
        ("--gpu-blocks", args.gpu_blocks),
        ("--host-blocks", args.host_blocks),
    ):
        positive(value, option)
    if args.sample < 2:
        raise CommandError(f"--sample must be at least 2 jobs, got {args.sample}")
    if args.out.is_dir():
        raise CommandError(f"--out {args.out} is a directory; give a file name")
    result = tune(
        args.journals,
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
        gateway=gateway_name(args.gateway),
        progress=None,  # a bar on a terminal
        echo=print,
    )
    for line in result.table():
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(result.to_toml())
    print(f"best settings: {args.out}")
    return 0
