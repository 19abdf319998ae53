"""The report's plots (matplotlib, drawn on the Agg canvas, no global pyplot state).

- :func:`jct_cdf`: the JCT distribution per job name (and run).
- :func:`breakdown_bars`: each job name's mean JCT split into LLM, queue, tool and other
  (and held, where load control held calls).
- :func:`job_strips`: chosen jobs (a run's slowest and median) as one bar each, on one
  time axis: where each one's time went, LLM, queued, held, tool or other, as it happened.
- :func:`timeline`: one job as a Gantt chart: sessions as rows, calls (their queue part
  and their time held by load control hatched) and tool waits as bars, the critical path
  outlined and repeated on a top row.

Time held by load control has its own colour and hatch (purple, slanted against the
queue's grey), drawn and named in a legend only where some call was held.

Names (jobs, sessions, clients) are the user's text and are drawn as written: every figure
is built and saved under :func:`plain_text`, so ``$`` is a dollar sign, never TeX.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..telemetry import JobReport
from ._deps import require
from ._stats import NameSummary
from ._timeline import Activity, activities, critical_path, phases

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "breakdown_bars",
    "jct_cdf",
    "job_strips",
    "log_x",
    "plain_text",
    "png_bytes",
    "timeline",
]

LLM = "#4c78a8"
QUEUE = "#b8b8b8"
HELD = "#b279a2"
HELD_HATCH = "\\\\\\"
TOOL = "#f58518"
OTHER = "#e8e8e8"
FAILED = "#e45756"
CRITICAL = "#d62728"
DPI = 110


@contextmanager
def plain_text() -> Iterator[None]:
    """Draw text as it is written while the block runs: a name with two ``$`` in it is
    not read as TeX (which failed to parse, or drew the name garbled), whatever the
    user's matplotlibrc says. Build *and* save a figure inside it: matplotlib reads the
    setting when it makes each text, and makes tick labels while it draws."""
    require("matplotlib")
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


def log_x(ax: Axes) -> None:
    """A log-scale x axis labelled in plain numbers (10, 100, 1000, and 20, 30 where
    a decade is all there is): matplotlib's own log labels are TeX, which
    :func:`plain_text` turns off."""
    from matplotlib.ticker import LogFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(LogFormatter())
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def _figure(width: float, height: float) -> Figure:
    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as a PNG (no software tag in its metadata)."""
    buf = io.BytesIO()
    with plain_text():
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


@plain_text()
def jct_cdf(series: Sequence[tuple[str, Sequence[float]]]) -> Figure:
    """Fraction of jobs done by each JCT, one line per ``(label, jcts)``."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    lo, hi = math.inf, 0.0
    lines, labels = [], []
    for label, values in series:
        jcts = sorted(v for v in values if v > 0)
        if not jcts:
            continue
        lo, hi = min(lo, jcts[0]), max(hi, jcts[-1])
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        lines += ax.step([jcts[0], *jcts], [0.0, *ys], where="post")
        labels.append(label)
    if hi > 0 and hi / lo > 20:
        log_x(ax)
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.set_title("JCT CDF per job name")
    ax.grid(alpha=0.3)
    # the labels given, not label=: matplotlib leaves out of its legend a label that
    # starts with "_", and a job's name may
    ax.legend(lines, labels, fontsize="small")
    return fig


@plain_text()
def breakdown_bars(series: Sequence[tuple[str, NameSummary]]) -> Figure:
    """Each ``(label, summary)``'s mean JCT as a bar split into LLM, queue, tool, other
    (and held, after queue, where some job was held)."""
    fig = _figure(7, max(3.2, 0.55 * len(series) + 2.0))
    ax = fig.add_subplot()
    held = any(s.hold_max > 0 for _, s in series)
    parts = (
        ("LLM (critical path)", "llm_share", LLM, None),
        ("queue (agentrt)", "queue_share", QUEUE, "///"),
        *((("held (load control)", "held_share", HELD, HELD_HATCH),) if held else ()),
        ("tool", "tool_share", TOOL, None),
        ("other", "other_share", OTHER, None),
    )
    labels = [label for label, _ in series]
    ys = list(range(len(series)))
    left = [0.0] * len(series)
    for name, field, color, hatch in parts:
        widths = []
        for _, s in series:
            share = getattr(s, field)
            widths.append(0.0 if math.isnan(share) else share * s.jct_mean)
        ax.barh(ys, widths, left=left, color=color, hatch=hatch, edgecolor="white", label=name)
        for y, x0, w, (_, s) in zip(ys, left, widths, series, strict=True):
            if s.jct_mean > 0 and w / s.jct_mean >= 0.08:
                ax.text(
                    x0 + w / 2,
                    y,
                    f"{w / s.jct_mean:.0%}",
                    ha="center",
                    va="center",
                    fontsize="small",
                )
        left = [x0 + w for x0, w in zip(left, widths, strict=True)]
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xlabel("mean JCT (s)")
    ax.set_title("Where the time goes: shares of mean JCT")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(parts))
    return fig


def _bar(ax: Axes, a: Activity, row: int, outline: bool) -> None:
    """One activity on row ``row``: a tool wait, or a call (its time held and its queue
    part hatched)."""
    height = 0.6
    y = (row - height / 2, height)
    if a.kind == "tool":
        ax.broken_barh([(a.start_s, a.end_s - a.start_s)], y, color=TOOL)
    else:
        if a.held_s > 0:
            ax.broken_barh(
                [(a.start_s, a.held_s)],
                y,
                facecolor=HELD,
                hatch=HELD_HATCH,
                edgecolor="#777777",
                linewidth=0,
            )
        waited = a.held_s + a.queue_s
        if a.queue_s > 0:
            ax.broken_barh(
                [(a.start_s + a.held_s, a.queue_s)],
                y,
                facecolor=QUEUE,
                hatch="///",
                edgecolor="#777777",
                linewidth=0,
            )
        ax.broken_barh(
            [(a.start_s + waited, a.end_s - a.start_s - waited)],
            y,
            color=LLM if a.status == "ok" else FAILED,
        )
    if outline:
        ax.broken_barh(
            [(a.start_s, a.end_s - a.start_s)],
            y,
            facecolor="none",
            edgecolor=CRITICAL,
            linewidth=1.6,
        )


@plain_text()
def timeline(report: JobReport, label: str = "") -> Figure:
    """One job's Gantt chart (see the module's doc)."""
    from matplotlib.patches import Patch

    acts = activities(report)
    path = critical_path(report)
    on_path = set(map(id, path))
    rows: dict[str, int] = {}
    names: list[str] = ["critical path"]
    for a in acts:
        if a.session_id not in rows:
            rows[a.session_id] = len(names)
            name = a.session if len(a.session) <= 24 else a.session[:23] + "…"
            names.append(name)
    fig = _figure(10, min(30.0, max(3.0, 0.42 * len(names) + 1.8)))
    ax = fig.add_subplot()
    for a in acts:
        _bar(ax, a, rows[a.session_id], id(a) in on_path)
    for a in path:
        _bar(ax, a, 0, True)
    failed = any(a.kind == "call" and a.status != "ok" for a in acts)
    held = any(a.held_s > 0 for a in acts)
    ax.axvline(report.jct_s, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.4, -0.6)
    ax.set_xlim(0, max([report.jct_s, *(a.end_s for a in acts)]) * 1.02 or 1.0)
    ax.set_xlabel("seconds since the job started")
    on = sum(a.end_s - a.start_s for a in path)
    where = f" [{label}]" if label else ""
    ax.set_title(
        f"{report.name} {report.job_id}{where}: JCT {report.jct_s:.2f} s, "
        f"{on:.2f} s of it on the critical path's calls and tools",
        fontsize="medium",
    )
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        handles=[
            Patch(color=LLM, label="call (served)"),
            *(
                [Patch(facecolor=HELD, hatch=HELD_HATCH, edgecolor="#777777", label="call (held)")]
                if held
                else []
            ),
            Patch(facecolor=QUEUE, hatch="///", edgecolor="#777777", label="call (queued)"),
            Patch(color=TOOL, label="tool wait"),
            *([Patch(color=FAILED, label="failed call")] if failed else []),
            Patch(facecolor="none", edgecolor=CRITICAL, label="critical path"),
        ],
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    return fig


_PHASE_STYLE: dict[str, tuple[str, str, str | None]] = {
    "llm": ("LLM (a call served)", LLM, None),
    "queued": ("queued in agentrt", QUEUE, "///"),
    "held": ("held by load control", HELD, HELD_HATCH),
    "tool": ("tool wait", TOOL, None),
    "other": ("other (agent code, think time)", OTHER, None),
}


@plain_text()
def job_strips(rows: Sequence[tuple[str, JobReport]], title: str = "") -> Figure:
    """Each ``(label, job)`` as one bar from its start to its end, coloured by what its time
    went to at each moment (:func:`~agentrt.report._timeline.phases`), all on one axis so
    that lengths compare; each bar's shares are written after it."""
    from matplotlib.patches import Patch

    fig = _figure(11, 0.62 * len(rows) + 1.5)
    ax = fig.add_subplot()
    longest = max([r.jct_s for _, r in rows] + [1e-9])
    held = False
    for y, (_, job) in enumerate(rows):
        totals = dict.fromkeys(_PHASE_STYLE, 0.0)
        for kind, spans in _by_kind(job).items():
            held = held or kind == "held"
            _, color, hatch = _PHASE_STYLE[kind]
            ax.broken_barh(
                spans,
                (y - 0.32, 0.64),
                facecolor=color,
                hatch=hatch,
                edgecolor="#777777" if hatch else color,
                linewidth=0,
            )
            totals[kind] = sum(w for _, w in spans)
        jct = max(job.jct_s, 1e-9)
        shares = ", ".join(
            f"{name.split(' ')[0]} {totals[kind] / jct:.0%}"
            for kind, (name, _, _) in _PHASE_STYLE.items()
            if totals[kind] / jct >= 0.005
        )
        ax.text(
            job.jct_s + longest * 0.01,
            y,
            f"{job.jct_s:,.1f} s  ({shares})",
            va="center",
            fontsize="small",
        )
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, longest * 1.42)
    ax.set_xlabel("seconds since the job started")
    ax.grid(axis="x", alpha=0.3)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if title:
        ax.set_title(title, fontsize="medium", loc="left", pad=24)
    ax.legend(
        handles=[
            Patch(facecolor=color, hatch=hatch, edgecolor="#777777" if hatch else color, label=n)
            for kind, (n, color, hatch) in _PHASE_STYLE.items()
            if held or kind != "held"
        ],
        fontsize="small",
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=5 if held else 4,
        frameon=False,
        borderaxespad=0.2,
    )
    return fig


def _by_kind(job: JobReport) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for p in phases(job):
        out.setdefault(p.kind, []).append((p.start_s, p.end_s - p.start_s))
    return out
