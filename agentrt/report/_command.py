"""``agentrt report``: journals in, tables out (and PNGs, and one HTML page).

Several journals are pooled into one run unless ``compare`` is set, which reads exactly two
(A and B) and adds a table of B over A per job name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .._stats import rank
from ..telemetry import JobReport
from ..telemetry._journal import scan_journal
from ._stats import NameSummary, compare, held_any, summarize
from ._tables import TextTable, comparison_table, print_tables, summary_table
from ._timeline import critical_path

__all__ = ["ReportError", "Run", "load_run", "report"]

PNG_NAMES = ("jct_cdf.png", "breakdown.png", "timeline.png", "jobs.png")
CRITICAL_ROWS = 15
"""The critical path's longest activities the HTML page lists (the terminal lists all)."""
SNIFF_LINES = 5
"""A file whose first this many non-empty lines are none a job report is not a journal."""
MAX_WARNINGS = 5
"""Invalid lines of a journal warned of one by one; the rest are counted in one line."""


class ReportError(ValueError):
    """A journal or an option the report cannot use (the message names it)."""


@dataclass(frozen=True)
class Run:
    """The jobs of one or more journals, read as one run."""

    label: str
    paths: tuple[Path, ...]
    reports: tuple[JobReport, ...]


def _sniff(path: Path) -> None:
    """Raise :class:`ReportError` when the first :data:`SNIFF_LINES` non-empty lines of
    ``path`` hold no job report (a README, a results file given by mistake)."""
    head = scan_journal(path, stop_after_invalid=SNIFF_LINES)
    if not head.reports and len(head.invalid) >= SNIFF_LINES:
        number, reason = head.invalid[0]
        raise ReportError(
            f"{path} is not an agentrt journal: its first {len(head.invalid)} lines are "
            f"not job reports (line {number}: {reason}; a journal is one JSON JobReport "
            "per line, as Runtime(journal=...) and agentrt bench write)"
        )


def _read(path: Path, warn: Callable[[str], None]) -> list[JobReport]:
    if not path.exists():
        raise ReportError(f"journal {path}: no such file")
    if path.is_dir():
        raise ReportError(f"journal {path}: is a directory")
    try:
        _sniff(path)
        scan = scan_journal(path)
    except OSError as exc:
        raise ReportError(f"journal {path}: {exc.strerror or exc}") from exc
    problem = scan.no_report()
    if problem is not None:
        raise ReportError(problem)
    for number, reason in scan.invalid[:MAX_WARNINGS]:
        warn(f"{path}:{number}: not a valid job report ({reason}); skipped")
    if len(scan.invalid) > MAX_WARNINGS:
        warn(f"{path}: {len(scan.invalid)} lines in all were not valid job reports; skipped")
    return scan.reports


def load_run(
    paths: Sequence[str | os.PathLike[str]],
    label: str = "",
    warn: Callable[[str], None] = lambda message: None,
) -> Run:
    """Read journals into one run. Corrupt lines go to ``warn`` and are skipped; a missing
    or empty journal raises :class:`ReportError`."""
    ps = tuple(Path(p) for p in paths)
    reports = [r for p in ps for r in _read(p, warn)]
    return Run(label, ps, tuple(reports))


def _labels(a: Path, b: Path) -> tuple[str, str]:
    if a.stem != b.stem:
        return a.stem, b.stem
    if a.name != b.name:
        return a.name, b.name
    return str(a), str(b)


def _find(runs: Sequence[Run], job_id: str | None) -> tuple[Run, JobReport]:
    if job_id is None:
        return max(((run, r) for run in runs for r in run.reports), key=lambda p: p[1].jct_s)
    for run in runs:
        for r in run.reports:
            if r.job_id == job_id:
                return run, r
    count = sum(len(run.reports) for run in runs)
    raise ReportError(f"--job {job_id}: no job with that id in the journals ({count} jobs)")


def _critical_table(run: Run, job: JobReport, top: int | None = None) -> TextTable:
    """The job's critical path in time order; with ``top``, only its ``top`` longest
    activities (still in time order), the caption saying how much of the path they are."""
    where = f" [{run.label}]" if run.label else ""
    path = critical_path(job)
    shown = path
    note = ""
    if top is not None and len(path) > top:
        longest = sorted(path, key=lambda a: a.end_s - a.start_s, reverse=True)[:top]
        keep = set(map(id, longest))
        shown = [a for a in path if id(a) in keep]
        total = sum(a.end_s - a.start_s for a in path)
        part = sum(a.end_s - a.start_s for a in shown)
        note = (
            f" Shown: the {top} longest of its {len(path)} activities, "
            f"{part / total:.0%} of their time."
            if total > 0
            else f" Shown: {top} of its {len(path)} activities."
        )
    held = any(a.held_s > 0 for a in path)  # a column only where load control held
    rows = tuple(
        (
            a.session,
            a.kind,
            a.label,
            f"{a.start_s:.3f}",
            f"{a.end_s:.3f}",
            f"{a.end_s - a.start_s:.3f}",
            *((f"{a.held_s:.3f}" if a.kind == "call" else "",) if held else ()),
            f"{a.queue_s:.3f}" if a.kind == "call" else "",
        )
        for a in shown
    )
    return TextTable(
        f"Critical path of {job.name} {job.job_id}{where} (JCT {job.jct_s:.2f} s)",
        ("session", "kind", "activity", "start", "end", "length")
        + (("held", "queued") if held else ("queued",)),
        rows,
        "Walking back from the job's end, the activity that ended last; then the one that "
        "ended last before it started; and so on. Seconds since the job started." + note,
        label_columns=3,
    )


def _slowest_and_median(run: Run) -> list[tuple[str, JobReport]]:
    jobs = sorted(run.reports, key=lambda r: r.jct_s)
    median = jobs[rank(len(jobs), 0.5)]
    if median is jobs[-1]:  # one job
        return [("slowest", jobs[-1])]
    return [("slowest", jobs[-1]), ("median", median)]


def _strip_rows(runs: Sequence[Run]) -> list[tuple[str, JobReport]]:
    """A run's slowest and median jobs; in a comparison A's and B's slowest, then their
    medians, so each pair sits together."""
    if len(runs) == 1:
        return [(f"{which}\n{job.name}", job) for which, job in _slowest_and_median(runs[0])]
    picks = [_slowest_and_median(run) for run in runs]
    return [
        (f"{ab} {which}\n{job.name}", job)
        for i in range(2)
        for ab, run_picks in zip("AB", picks, strict=False)
        for which, job in run_picks[i : i + 1]
    ]


def _series(runs: Sequence[Run]) -> list[tuple[str, NameSummary, list[float]]]:
    out = []
    for run in runs:
        for s in summarize(run.reports):
            jcts = [r.jct_s for r in run.reports if r.name == s.name]
            label = f"{s.name} [{run.label}]" if len(runs) > 1 else s.name
            out.append((label, s, jcts))
    return out


def _write(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc


def report(
    journals: Sequence[str | os.PathLike[str]],
    *,
    compare_runs: bool = False,
    png_dir: str | os.PathLike[str] | None = None,
    html_path: str | os.PathLike[str] | None = None,
    job_id: str | None = None,
    echo: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
) -> list[Path]:
    """Print the tables; write the plots to ``png_dir`` and the page to ``html_path``.
    Returns the files written."""
    if not journals:
        raise ReportError("no journal given")
    if compare_runs:
        if len(journals) != 2:
            raise ReportError(f"--compare takes two journals (A and B), got {len(journals)}")
        a, b = Path(journals[0]), Path(journals[1])
        la, lb = _labels(a, b)
        runs = [load_run([a], la, warn), load_run([b], lb, warn)]
    else:
        runs = [load_run(journals, "", warn)]
    chosen_run, chosen = _find(runs, job_id)
    held = any(held_any(run.reports) for run in runs)  # load control held some call

    tables = [
        summary_table(
            summarize(run.reports),
            (f"{ab}: {run.label}, " if compare_runs else "")
            + f"{len(run.reports)} jobs from "
            + ", ".join(str(p) for p in run.paths),
            held=held,
        )
        for ab, run in zip("AB", runs, strict=False)
    ]
    if compare_runs:
        tables[1] = replace(tables[1], caption="")  # the legend once, under A's table
        tables.append(
            comparison_table(
                compare(runs[0].reports, runs[1].reports), runs[0].label, runs[1].label
            )
        )
    shown = [*tables, _critical_table(chosen_run, chosen)] if job_id else tables
    print_tables(shown)

    written: list[Path] = []
    if png_dir is None and html_path is None:
        return written
    from ._html import Folded, Image, html_page
    from ._plots import breakdown_bars, jct_cdf, job_strips, png_bytes, timeline

    series = _series(runs)
    sides = f"A = {runs[0].label}, B = {runs[1].label}: " if compare_runs and len(runs) == 2 else ""
    pngs = (
        png_bytes(jct_cdf([(label, jcts) for label, _, jcts in series])),
        png_bytes(breakdown_bars([(label, s) for label, s, _ in series])),
        png_bytes(timeline(chosen, chosen_run.label)),
        png_bytes(job_strips(_strip_rows(runs), f"{sides}where each job's time went")),
    )
    if png_dir is not None:
        for name, data in zip(PNG_NAMES, pngs, strict=True):
            _write(Path(png_dir) / name, data)
            written.append(Path(png_dir) / name)
    if html_path is not None:
        which = "the slowest job" if job_id is None else "the chosen job"
        strips = Image(
            (
                "The slowest and the median job of each side"
                if compare_runs
                else "The slowest and the median job"
            )
            + ", each from its start to its end on one time axis: blue while one of its "
            "calls was being served, grey while calls only waited in agentrt's queue, "
            + ("purple while calls were only held by load control, " if held else "")
            + "orange while it only waited for tools, light grey for the rest (the agent's "
            "own code, think time).",
            pngs[3],
            wide=True,
        )
        headline = tables[2:] if compare_runs else tables
        page = html_page(
            "agentrt report",
            f"{sum(len(r.reports) for r in runs)} jobs from "
            + ", ".join(str(p) for run in runs for p in run.paths),
            [
                strips,
                *headline,
                Image(
                    "JCT CDF: the fraction of jobs finished by each completion time, per job name.",
                    pngs[0],
                ),
                Image(
                    "Where the time goes: each job name's mean JCT, split into time with a "
                    "call being served (LLM critical path), only queued in agentrt, "
                    + ("only held by load control, " if held else "")
                    + "only in tool waits, and the rest (the agent's own code).",
                    pngs[1],
                ),
                *(tables[:2] if compare_runs else []),
                Folded(
                    f"Timeline and critical path of {which}: {chosen.name} {chosen.job_id}"
                    f" (JCT {chosen.jct_s:.2f} s)",
                    [
                        Image(
                            f"Timeline of {which}: sessions as rows, calls in blue (the hatched "
                            "part queued in agentrt"
                            + (", the purple part held by load control" if held else "")
                            + "), tool waits in orange; the critical path is outlined in red "
                            "and repeated on the top row.",
                            pngs[2],
                            wide=True,
                        ),
                        _critical_table(chosen_run, chosen, top=CRITICAL_ROWS),
                    ],
                ),
            ],
        )
        _write(Path(html_path), page.encode("utf-8"))
        written.append(Path(html_path))
    for path in written:
        echo(f"wrote {path}")
    return written
