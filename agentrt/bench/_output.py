"""Showing results: terminal tables that fit the terminal (rich if installed, else plain
text), a progress bar that counts jobs, and the JCT CDF plot (matplotlib)."""

from __future__ import annotations

import math
import shutil
import sys
import textwrap
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from ..report._tables import TextTable, text_lines
from ._parallel import Workers
from ._runner import BenchConfig, BenchResult, run_bench

__all__ = [
    "HEADERS",
    "KNOWN_CLIENTS",
    "PALETTE",
    "bench_table",
    "client_styles",
    "fleet_lines",
    "plot",
    "print_table",
    "progress_bar",
    "run_with_progress",
    "show_tables",
    "table_rows",
    "terminal_width",
]

HEADERS: Final = (
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
BENCH_CAPTION: Final = (
    "Times in seconds. JCT: job completion time; stretch: JCT over the same job's JCT "
    "alone on an idle cluster (1.0 is the limit); call: per-call latency; TTFT: time to "
    "first token of streamed calls; cache hit: prompt tokens served from the replicas' "
    "prefix caches; imbalance: the busiest replica's busy time over the mean; util: the "
    "replicas' busy share. Lower is better except jobs/s, cache hit (higher) and util."
)

LineStyle = str | tuple[int, tuple[int, ...]]

PALETTE: Final[tuple[tuple[str, LineStyle], ...]] = (
    ("tab:gray", "--"),
    ("tab:blue", "-"),
    ("tab:orange", "-."),
    ("tab:green", ":"),
    ("tab:red", (0, (5, 1))),
    ("tab:purple", (0, (3, 1, 1, 1))),
    ("tab:brown", (0, (1, 1))),
    ("tab:pink", (0, (5, 2, 1, 2))),
    ("tab:olive", (0, (8, 2))),
    ("tab:cyan", (0, (3, 1, 1, 1, 1, 1))),
    ("black", "-"),
    ("goldenrod", "--"),
    ("teal", "-."),
    ("navy", ":"),
    ("crimson", (0, (5, 1))),
    ("darkviolet", (0, (3, 1, 1, 1))),
)
"""Colours and line styles of the clients' lines (lines that coincide stay visible)."""
KNOWN_CLIENTS: Final = {
    "plain": 0,
    "agentrt:session": 1,
    "agentrt:defaults": 1,
    "agentrt:round-robin": 2,
    "plain>llm-d": 3,
    "plain>llm-d:ideal": 4,
    "plain>dynamo:affinity": 5,
    "plain>vllm-router:cache_aware": 6,
    "agentrt:defaults>llm-d": 7,
}
"""The clients every figure draws alike, as indices into :data:`PALETTE`: plain grey and
dashed, agentrt's defaults (session routing) blue, and the steady-state study's peers."""


def client_styles(clients: Sequence[str]) -> list[tuple[str, LineStyle]]:
    """Each client's colour and line style, the same in every figure: a known client's
    (:data:`KNOWN_CLIENTS`), else one drawn from a stable hash of its name among the
    styles no known client has. Two clients
    of one figure never share one (while the palette lasts): the later takes the next
    free style."""
    first = max(KNOWN_CLIENTS.values()) + 1  # the others' part of the palette
    used: set[int] = set()
    out = []
    for client in clients:
        k = KNOWN_CLIENTS.get(client)
        if k is None:
            k = first + zlib.crc32(client.encode()) % (len(PALETTE) - first)
        for step in range(len(PALETTE)):
            if (k + step) % len(PALETTE) not in used:
                k = (k + step) % len(PALETTE)
                break
        used.add(k)
        out.append(PALETTE[k])
    return out


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


def bench_table(result: BenchResult, title: str) -> TextTable:
    """The benchmark's table: one row per client, without the columns no client has
    (split in two or more tables by :func:`show_tables` where the terminal is too narrow
    for all the columns)."""
    rows = table_rows(result)
    # drop the columns no client has (stretch without solo runs, TTFT without streams)
    keep = [i for i in range(len(HEADERS)) if i == 0 or any(r[i] != "-" for r in rows)]
    return TextTable(
        title,
        tuple(HEADERS[i] for i in keep),
        tuple(tuple(r[i] for i in keep) for r in rows),
        BENCH_CAPTION,
    )


def terminal_width() -> int:
    """The terminal's width (``$COLUMNS`` first; 80 when the output is not a terminal)."""
    return shutil.get_terminal_size((80, 24)).columns


def show_tables(tables: Sequence[TextTable], echo: Callable[[str], None] | None = None) -> None:
    """Print the tables to fit the terminal, with rich where it is installed and no
    ``echo`` is given; else as plain text through ``echo`` (default ``print``)."""
    if echo is None:
        try:
            from ..report._tables import print_tables

            print_tables(tables)
            return
        except ImportError:
            pass
        echo = print
    width = terminal_width()
    for i, t in enumerate(tables):
        if i:
            echo("")
        for line in text_lines(t, width):
            echo(line)


def fleet_lines(result: BenchResult, width: int = 80) -> list[str]:
    """For a fleet run (``BenchConfig.fleet`` > 1): a line saying the fleet's size, then
    per client the sessions' first turns per replica and the calls' imbalance, wrapped to
    ``width``. Empty without a fleet."""
    fleet = max((c.fleet for c in result.clients), default=1)
    if fleet <= 1:
        return []
    assign = result.config.get("fleet_assign", "round_robin")
    lines = [
        f"fleet: each client ran as {fleet} independent clients on the same replicas "
        f"(jobs dealt {assign}); first turns: sessions started on each replica"
    ]
    for c in result.clients:
        if c.replicas:
            first = " ".join(str(int(r["first_turns"])) for r in c.replicas)
            imbalance = _f(c.call_imbalance)
            lines.append(f"{c.client}: first turns [{first}], calls/replica max/mean {imbalance}")
    wrap = textwrap.TextWrapper(width=width, subsequent_indent="  ", break_on_hyphens=False)
    return [part for line in lines for part in wrap.wrap(line)]


def view_lines(result: BenchResult, width: int = 80) -> list[str]:
    """Per agentrt client over several simulated replicas: what it believed about the
    replicas' KV cache against what the engines held (``ClientResult.kv_view``,
    bench/_view.py), in words, wrapped to ``width``. Empty without one. ``agentrt bench``
    prints them with ``--show-view``; results.json has the figures either way."""
    from ._view import format_view

    lines = [f"{c.client}: {format_view(c.kv_view)}" for c in result.clients if c.kv_view]
    if not lines:
        return []
    lines.insert(0, "Each agentrt client's picture of the replicas' KV cache against the engines':")
    wrap = textwrap.TextWrapper(width=width, subsequent_indent="  ", break_on_hyphens=False)
    return [part for line in lines for part in wrap.wrap(line)]


def print_table(
    result: BenchResult,
    title: str,
    echo: Callable[[str], None] | None = None,
    *,
    view: bool = False,
) -> None:
    """The benchmark's table (:func:`bench_table`), then a fleet's lines
    (:func:`fleet_lines`) and, with ``view``, the clients' views of the KV
    (:func:`view_lines`), through ``echo`` as :func:`show_tables`."""
    show_tables([bench_table(result, title)], echo)
    width = min(terminal_width(), 80)
    lines = fleet_lines(result, width) + (view_lines(result, width) if view else [])
    if lines:
        out = echo or print
        out("")
        for line in lines:
            out(line)


@contextmanager
def progress_bar(jobs: int, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A rich progress bar (when rich is installed and ``enabled``) that counts jobs: one
    bar per run (each client, and ``alone`` for the solo runs), each out of ``jobs``.
    Yields the callback :func:`~agentrt.bench.run_bench` calls with the run's label."""
    try:
        if not enabled:
            raise ImportError
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
    except ImportError:
        yield lambda label: None
        return
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def advance(label: str) -> None:
            if label not in tasks:
                name = "alone (each job on an idle cluster)" if label == "alone" else label
                tasks[label] = bar.add_task(name, total=jobs)  # not markup, not emoji
            bar.update(tasks[label], advance=1)

        yield advance


def run_with_progress(
    cfg: BenchConfig,
    labels: dict[str, str] | None = None,
    *,
    enabled: bool | None = None,
    workers: Workers = 1,
) -> BenchResult:
    """:func:`~agentrt.bench.run_bench` with a progress bar on stderr (when it is a
    terminal, or as ``enabled`` says): one bar per client (and one for the solo runs),
    each counting the run's ``cfg.jobs`` jobs. ``labels`` renames clients in the bars.
    ``workers``: as :func:`~agentrt.bench.run_bench` (a bar fills when its replay ends,
    when replays run in other processes)."""
    names = labels or {}
    on = sys.stderr.isatty() if enabled is None else enabled
    with progress_bar(cfg.jobs, enabled=on) as advance:
        return run_bench(cfg, lambda label: advance(names.get(label, label)), workers=workers)


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def plot(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write the JCT CDF (``jct_cdf.png``: one line per client, each in its own colour and
    line style (:func:`client_styles`), so clients with the same results stay visible).
    Needs matplotlib."""
    import matplotlib

    from ..report._plots import log_x, plain_text

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    with plain_text():  # client names as written: a config=FILE may hold "$"
        fig, ax = plt.subplots(figsize=(7, 4.5))
        styles = client_styles([c.client for c in result.clients])
        lines, labels = [], []
        for c, (color, style) in zip(result.clients, styles, strict=True):
            jcts = [r["jct_s"] for r in c.job_rows if r["status"] == "ok"]
            if not jcts:
                continue
            xs, ys = _cdf(jcts)
            lines += ax.step(xs, ys, where="post", color=color, linestyle=style, lw=2)
            labels.append(c.client)
        log_x(ax)
        ax.set_xlabel("job completion time (s, log scale)")
        ax.set_ylabel("fraction of jobs done")
        ax.set_title("JCT CDF per client (further left is faster)")
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(lines, labels)
        path = out_dir / "jct_cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return [path]
