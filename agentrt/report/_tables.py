"""The report's tables: built once as text cells, shown in the terminal (rich) or in HTML."""

from __future__ import annotations

import html
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ._deps import require
from ._stats import ComparisonRow, NameSummary

__all__ = [
    "SUMMARY_HEADERS",
    "TextTable",
    "comparison_table",
    "html_table",
    "print_tables",
    "summary_table",
]

SUMMARY_HEADERS = (
    "job",
    "jobs",
    "JCT p50",
    "JCT p90",
    "JCT p99",
    "call p50",
    "call p99",
    "queue",
    "LLM",
    "tool",
    "cached",
    "retries",
    "moves",
    "errors",
)
SUMMARY_CAPTION = (
    "Times in seconds. JCT: job completion time; call: per-call latency. queue, LLM, tool: "
    "shares of JCT spent only queued in agentrt, with a call being served (the LLM critical "
    "path), in tool waits only. cached: prompt tokens served from the prefix cache."
)


@dataclass(frozen=True)
class TextTable:
    """A table of preformatted cells; the first ``label_columns`` columns are labels."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    label_columns: int = 1


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    if value is None or math.isnan(value):
        return "-"
    return fmt.format(value)


def _share(value: float | None) -> str:
    return _num(value, "{:.0%}") if value is None or value >= 0.01 or value == 0 else "<1%"


def summary_table(summaries: Sequence[NameSummary], title: str) -> TextTable:
    rows = tuple(
        (
            s.name,
            str(s.jobs),
            _num(s.jct_p50),
            _num(s.jct_p90),
            _num(s.jct_p99),
            _num(s.call_p50, "{:.3f}"),
            _num(s.call_p99, "{:.3f}"),
            _share(s.queue_share),
            _share(s.llm_share),
            _share(s.tool_share),
            _share(s.cache_share),
            str(s.retries),
            str(s.session_moves),
            str(s.errors),
        )
        for s in summaries
    )
    return TextTable(title, SUMMARY_HEADERS, rows, SUMMARY_CAPTION)


def _value(value: float | None, kind: str) -> str:
    if kind == "share":
        return _share(value)
    if kind == "count":
        return _num(value, "{:.0f}")
    return _num(value, "{:.3f}")


def comparison_table(rows: Sequence[ComparisonRow], a: str, b: str) -> TextTable:
    cells = []
    previous = None
    for r in rows:
        ratio = r.ratio
        cells.append(
            (
                r.name if r.name != previous else "",
                r.metric,
                _value(r.a, r.kind),
                _value(r.b, r.kind),
                "-" if ratio is None else f"{ratio:.2f}x",
            )
        )
        previous = r.name
    return TextTable(
        f"B / A: {b} over {a}",
        ("job", "metric", "A", "B", "B/A"),
        tuple(cells),
        "B/A below 1: B is lower (for times and shares of time: faster).",
        label_columns=2,
    )


def print_tables(tables: Sequence[TextTable]) -> None:
    """Print with rich: full width when stdout is not a terminal (logs, CI, pipes)."""
    require("rich")
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    for t in tables:
        table = Table(
            title=t.title, title_justify="left", caption=t.caption or None, caption_justify="left"
        )
        for i, h in enumerate(t.headers):
            table.add_column(h, justify="left" if i < t.label_columns else "right")
        for row in t.rows:
            table.add_row(*row)
        console.print(table)


def html_table(t: TextTable) -> str:
    """The table as an HTML ``<table>`` (cells escaped)."""
    head = "".join(
        f'<th class="{"label" if i < t.label_columns else "num"}">{html.escape(h)}</th>'
        for i, h in enumerate(t.headers)
    )
    body = []
    for row in t.rows:
        cells = "".join(
            f'<td class="{"label" if i < t.label_columns else "num"}">{html.escape(c)}</td>'
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    caption = f"<p class=caption>{html.escape(t.caption)}</p>" if t.caption else ""
    return (
        f"<h2>{html.escape(t.title)}</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n"
        f"<tbody>\n{chr(10).join(body)}\n</tbody>\n</table>\n{caption}"
    )
