"""The report's tables: built once as text cells, shown in the terminal (rich) or in HTML."""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from ._deps import require
from ._stats import ComparisonRow, NameSummary

__all__ = [
    "SUMMARY_HEADERS",
    "TextTable",
    "comparison_table",
    "fit_width",
    "html_table",
    "print_tables",
    "summary_table",
    "text_lines",
    "wrap",
    "wrap_title",
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
    "other",
    "cached",
    "cache wr",
    "reasoning",
    "retries",
    "moves",
    "errors",
)
_TIMES_CAPTION = "Times in seconds. JCT: job completion time; call: per-call latency. "
_TOKENS_CAPTION = (
    "cached: prompt tokens served from the prefix cache; cache wr: prompt tokens written to "
    "it, where the server says; reasoning: the completion tokens spent reasoning, where the "
    "server says."
)
SUMMARY_CAPTION = (
    _TIMES_CAPTION
    + "queue, LLM, tool, other: shares of JCT spent only queued in agentrt, with a call "
    "being served (the LLM critical path), in tool waits only, and in none (the agent's "
    "own code); they add up to 100%. " + _TOKENS_CAPTION
)
HELD_CAPTION = (
    _TIMES_CAPTION
    + "held, queue, LLM, tool, other: shares of JCT spent only held by load control at a "
    "session's tool boundary (its replica's KV full of other sessions' contexts), only "
    "queued in agentrt, with a call being served (the LLM critical path), in tool waits "
    "only, and in none (the agent's own code); they add up to 100%. hold max: the "
    "longest one call was held. " + _TOKENS_CAPTION
)
"""The caption when the table shows the held columns."""


_UNIT = re.compile(r"(\d) (s|ms|min|tok|jobs)\b")
_PHRASE = re.compile(r"(?<=[,:;]) | (?=\()")


def wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped to ``width``, with no break between a number and its unit nor at
    a hyphen, and no line ending in spaces."""
    held = _UNIT.sub("\\1\x00\\2", text)
    lines = textwrap.wrap(held, width, break_on_hyphens=False)
    return [line.replace("\x00", " ") for line in lines]


def wrap_title(text: str, width: int) -> list[str]:
    """A title wrapped to ``width`` between its phrases (after a comma, colon or
    semicolon, before a parenthesis) as long as each phrase fits a line, so that
    "5.9 s wall" or "calls per client" stay together; else as :func:`wrap`."""
    lines: list[str] = []
    for phrase in _PHRASE.split(text) if text else []:
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        elif len(phrase) <= width:
            lines.append(phrase)
        else:
            lines.extend(wrap(phrase, width))
    return lines


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


def summary_table(
    summaries: Sequence[NameSummary], title: str, *, held: bool | None = None
) -> TextTable:
    """One row per job name. ``held``: show the columns of time held by load control
    (``held`` before ``queue``, ``hold max`` after ``other``); None: where any name's jobs
    were held (a run without load control gets no column of zeros)."""
    if held is None:
        held = any(s.hold_max > 0 for s in summaries)
    rows = tuple(
        (
            s.name,
            str(s.jobs),
            _num(s.jct_p50),
            _num(s.jct_p90),
            _num(s.jct_p99),
            _num(s.call_p50, "{:.3f}"),
            _num(s.call_p99, "{:.3f}"),
            *((_share(s.held_share),) if held else ()),
            _share(s.queue_share),
            _share(s.llm_share),
            _share(s.tool_share),
            _share(s.other_share),
            *((_num(s.hold_max),) if held else ()),
            _share(s.cache_share),
            _share(s.cache_write_share),
            _share(s.reasoning_share),
            str(s.retries),
            str(s.session_moves),
            str(s.errors),
        )
        for s in summaries
    )
    if not held:
        return TextTable(title, SUMMARY_HEADERS, rows, SUMMARY_CAPTION)
    headers = list(SUMMARY_HEADERS)
    headers.insert(headers.index("other") + 1, "hold max")
    headers.insert(headers.index("queue"), "held")
    return TextTable(title, tuple(headers), rows, HELD_CAPTION)


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


def _width(cells: Sequence[str]) -> int:
    return max((len(line) for c in cells for line in c.splitlines() or [""]), default=0)


def fit_width(t: TextTable, width: int, *, per_column: int = 3) -> list[TextTable]:
    """``t`` as one or more tables no wider than ``width`` characters: the label columns
    repeated in each, the other columns kept in order and spread evenly over as few tables
    as fit (contiguous, the widest as narrow as it can be); the title goes on the first,
    the caption on the last. ``per_column`` is what
    each column costs beside its cells (rich's borders and padding: 3; plain text's gap:
    2). A table that fits is returned as it is. When it does not, labels count as at most
    a quarter of ``width`` (longer ones fold in the renderer, nothing is cut)."""
    columns = list(zip(t.headers, *t.rows, strict=True))
    widths = [_width(c) + per_column for c in columns]
    if sum(widths) + 1 <= width or len(columns) <= t.label_columns + 1:
        return [t]
    cap = max(12, width // 4) + per_column
    label_w = sum(min(widths[i], cap) for i in range(t.label_columns))
    room = max(width - 1 - label_w, 1)
    rest = list(range(t.label_columns, len(columns)))

    def pack(capacity: int) -> list[list[int]]:
        groups: list[list[int]] = [[]]
        used = 0
        for i in rest:
            if groups[-1] and used + widths[i] > capacity:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += widths[i]
        return groups

    fewest = len(pack(room))
    if fewest == 1:
        return [t]
    # the narrowest capacity that still needs no more tables: even widths
    lo, hi = max(widths[i] for i in rest), max(room, max(widths[i] for i in rest))
    while lo < hi:
        mid = (lo + hi) // 2
        if len(pack(mid)) <= fewest:
            hi = mid
        else:
            lo = mid + 1
    groups = pack(lo)
    labels = list(range(t.label_columns))
    out = []
    for n, group in enumerate(groups):
        keep = labels + group
        out.append(
            TextTable(
                t.title if n == 0 else "",
                tuple(t.headers[i] for i in keep),
                tuple(tuple(row[i] for i in keep) for row in t.rows),
                t.caption if n == len(groups) - 1 else "",
                t.label_columns,
            )
        )
    return out


def _fold(cell: str, width: int) -> list[str]:
    lines = []
    for line in cell.splitlines() or [""]:
        while len(line) > width:
            lines.append(line[:width])
            line = line[width:]
        lines.append(line)
    return lines


def text_lines(t: TextTable, width: int = 80) -> list[str]:
    """``t`` as plain text no wider than ``width`` (tables split as :func:`fit_width`
    does; a label too long for its column folds onto more lines, nothing is cut)."""
    out: list[str] = []
    for part in fit_width(t, width, per_column=2):
        columns = list(zip(part.headers, *part.rows, strict=True))
        widths = [_width(c) for c in columns]
        over = sum(widths) + 2 * (len(widths) - 1) - width
        if over > 0:  # fold the widest label column
            i = max(range(part.label_columns), key=lambda k: widths[k])
            widths[i] = max(widths[i] - over, 4)
        if part.title:
            out.extend(wrap_title(part.title, width))
        for row in (part.headers, *part.rows):
            cells = [_fold(c, w) for c, w in zip(row, widths, strict=True)]
            for k in range(max(len(c) for c in cells)):
                line = []
                for i, (c, w) in enumerate(zip(cells, widths, strict=True)):
                    text = c[k] if k < len(c) else ""
                    line.append(text.ljust(w) if i < part.label_columns else text.rjust(w))
                out.append("  ".join(line).rstrip())
        if part.caption:
            out.extend(wrap(part.caption, width))
        out.append("")
    return out[:-1]


def print_tables(tables: Sequence[TextTable], width: int | None = None) -> None:
    """Print with rich, each table split to fit the console (``width``, else the
    terminal's or ``$COLUMNS``, else 80 when the output is not a terminal): labels fold
    rather than being cut with an ellipsis. Every cell, title and caption is shown as it
    is, never read as rich markup or emoji codes (job names and paths are the user's:
    ``triage[v2]``, ``deploy:rocket:``). Titles and captions are wrapped to the console
    (titles between phrases, :func:`wrap_title`), not to the table, and end in no
    spaces."""
    require("rich")
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(width=width)

    def lines(texts: list[str], style: str) -> None:
        for line in texts:
            console.print(Text(line, style=style), soft_wrap=True)

    for t in tables:
        for part in fit_width(t, console.width):
            lines(wrap_title(part.title, console.width), "table.title")
            table = Table()
            for i, h in enumerate(part.headers):
                label = i < part.label_columns
                table.add_column(
                    Text(h),
                    justify="left" if label else "right",
                    overflow="fold",
                    no_wrap=not label,
                )
            for row in part.rows:
                table.add_row(*(Text(cell) for cell in row))
            console.print(table)
            lines(wrap(part.caption, console.width), "table.caption")


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
