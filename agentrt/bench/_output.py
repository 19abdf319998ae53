"""Showing results: a terminal table (rich if installed) and PNG plots (matplotlib)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._runner import BenchResult

__all__ = ["plot", "print_table", "progress_bar", "table_rows"]

HEADERS = (
    "client",
    "JCT mean",
    "JCT p50",
    "JCT p90",
    "JCT p99",
    "stretch p50",
    "stretch p90",
    "call p50",
    "call p99",
    "TTFT p50",
    "jobs/s",
    "cache hit",
    "imbalance",
    "util",
)


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def table_rows(result: BenchResult) -> list[list[str]]:
    rows = []
    for c in result.clients:
        rows.append(
            [
                c.client,
                _f(c.jct["mean"]),
                _f(c.jct["p50"]),
                _f(c.jct["p90"]),
                _f(c.jct["p99"]),
                _f(c.stretch["p50"] if c.stretch else None),
                _f(c.stretch["p90"] if c.stretch else None),
                _f(c.call_latency["p50"], "{:.3f}"),
                _f(c.call_latency["p99"], "{:.3f}"),
                _f(c.ttft["p50"] if c.ttft else None, "{:.3f}"),
                _f(c.jobs_per_s, "{:.3f}"),
                _f(c.prefix_cache_hit_rate, "{:.1%}"),
                _f(c.load_imbalance),
                _f(c.utilization, "{:.0%}"),
            ]
        )
    return rows


def print_table(result: BenchResult, title: str, echo: Callable[[str], None] = print) -> None:
    rows = table_rows(result)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        echo(title)
        echo("  ".join(h.rjust(w) for h, w in zip(HEADERS, widths, strict=True)))
        for r in rows:
            echo("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title, title_justify="left")
    for h in HEADERS:
        table.add_column(h, justify="left" if h == "client" else "right")
    for r in rows:
        table.add_row(*r)
    # A full-width table when the output is not a terminal (logs, CI, pipes).
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@contextmanager
def progress_bar(total: int, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A rich progress bar when rich is installed and ``enabled``; else nothing."""
    try:
        if not enabled:
            raise ImportError
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    except ImportError:
        yield lambda label: None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), transient=True
    ) as bar:
        task = bar.add_task("jobs", total=total)

        def advance(label: str) -> None:
            bar.update(task, advance=1, description=f"jobs ({label})")

        yield advance


def plot(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write the JCT CDF and the calls-vs-jobs scatter as PNGs. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in result.clients:
        jcts = sorted(r["jct_s"] for r in c.job_rows if r["status"] == "ok")
        if not jcts:
            continue
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step(jcts, ys, where="post", label=c.client)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF per client")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out_dir / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in result.clients:
        pts: list[Any] = [
            (r["call_latency_p50"], r["jct_s"])
            for r in c.job_rows
            if r["status"] == "ok" and not math.isnan(r["call_latency_p50"])
        ]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.6, label=c.client)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("median call latency of the job (s)")
    ax.set_ylabel("job completion time (s)")
    ax.set_title("Fast calls, slow jobs: per-call latency vs JCT")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out_dir / "calls_vs_jobs.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
