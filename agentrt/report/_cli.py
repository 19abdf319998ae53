"""The command line of ``agentrt report``: its arguments and what it runs (``_command``,
imported when it runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._cliparts import Command, examples

__all__ = ["add_report"]


def add_report(command: Command) -> None:
    """``agentrt report``."""
    report = command(
        "report",
        "tables and plots from journals (Runtime(journal=...))",
        "Per job name: JCT percentiles beside per-call latency, where the time went "
        "(queue, LLM critical path, tools; time held by load control where any), cache "
        "share, retries, session moves and errors. Several journals are pooled unless "
        "--compare. Needs the report extra: pip install 'agentjct[report]'.",
        examples(
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

    report.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    from ._command import report

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
