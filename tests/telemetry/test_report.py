"""`agentrt report`: tables, plots, one self-contained HTML page, --compare, clear errors.

The journals come from a real run: a Runtime against the embedded engine (agentrt.sim) in
virtual time, with two job names, tool waits, concurrent sessions and a concurrency limit
that makes calls queue. Ratios and the time breakdown are checked on constructed journals.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from trio.testing import MockClock

import agentrt
import agentrt.report
from agentrt.cli import main
from agentrt.report import breakdown, compare, critical_path, summarize
from agentrt.report._timeline import phases
from agentrt.sim import PRESETS, Cluster
from agentrt.telemetry import JobReport, read_journal
from tests.telemetry._jobs import job_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The numbers and the errors need nothing more; the table and plots need the report extra
# (the openai 2.x run of scripts/test.sh installs without it).
needs_extra = pytest.mark.skipif(
    find_spec("rich") is None or find_spec("matplotlib") is None,
    reason='needs the report extra: pip install "agentjct[report]"',
)


async def _run(path: Path, concurrency: int) -> None:
    async with (
        Cluster(2, PRESETS["h100-8b"]) as cluster,
        agentrt.Runtime(
            list(cluster.base_urls),
            transport=cluster.transport(),
            journal=path,
            otel=False,
            concurrency=concurrency,
        ) as rt,
    ):

        async def react(i: int) -> None:
            async with rt.job("react") as job, job.session("main") as s:
                msgs: list[dict[str, Any]] = [{"role": "user", "content": f"task {i} " * 40}]
                for _ in range(3):
                    await s.chat(model="m", messages=msgs, max_tokens=48)
                    msgs.append({"role": "assistant", "content": "looking it up"})
                    async with s.tool("search"):
                        await anyio.sleep(0.4 + 0.1 * i)
                    msgs.append({"role": "user", "content": "result"})

        async def fanout(i: int) -> None:
            async with rt.job("fanout") as job:

                async def worker(k: int) -> None:
                    async with job.session(f"worker-{k}") as s:
                        content = f"part {i} {k} " * 30
                        await s.chat(
                            model="m",
                            messages=[{"role": "user", "content": content}],
                            max_tokens=96,
                        )
                        async with s.tool("exec"):
                            await anyio.sleep(0.2 * (k + 1))
                        await s.chat(
                            model="m",
                            messages=[{"role": "user", "content": "again"}],
                            max_tokens=16,
                        )

                async with anyio.create_task_group() as tg:
                    for k in range(3):
                        tg.start_soon(worker, k)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(react, i)
                tg.start_soon(fanout, i)


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of the same workload: A with 2 calls in flight per replica, B with 8."""
    folder = tmp_path_factory.mktemp("journals")
    a, b = folder / "tight.jsonl", folder / "roomy.jsonl"
    trio.run(_run, a, 2, clock=MockClock(autojump_threshold=0))
    trio.run(_run, b, 8, clock=MockClock(autojump_threshold=0))
    return a, b


def _job(
    name: str,
    jct: float,
    calls: Sequence[tuple[str, float, float, float]] = (),
    tools: Sequence[tuple[str, float, float]] = (),
    **fields: Any,
) -> JobReport:
    """A report: calls as (session, start, queue, latency), tools as (session, start, s);
    ``fields`` as :func:`job_report` takes them."""
    held = [(s, start, 0.0, queue, latency) for s, start, queue, latency in calls]
    return job_report(name, jct, held, tools, **fields)


def _write(path: Path, reports: Sequence[JobReport]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in reports))
    return path


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC


# --- the numbers -------------------------------------------------------------------------


def test_the_real_run_has_queues_tools_concurrent_sessions_and_cache(
    journals: tuple[Path, Path],
) -> None:
    reports = read_journal(journals[0])
    assert {r.name for r in reports} == {"react", "fanout"}
    assert len(reports) == 8
    assert any(r.queue_s > 0 for r in reports)
    assert all(r.tool_waits == 3 for r in reports)
    assert all(r.sessions == 3 for r in reports if r.name == "fanout")
    assert sum(r.cached_tokens for r in reports if r.name == "react") > 0
    for r in reports:
        parts = breakdown(r)
        assert parts.total_s == pytest.approx(r.jct_s)
        assert parts.queue_s >= 0 and parts.tool_s >= 0 and parts.other_s >= 0


def test_llm_time_excludes_queueing_in_agentrt_everywhere(journals: tuple[Path, Path]) -> None:
    """The report's ``critical_llm_s`` (the summary's "LLM") is the report's LLM share:
    time with a call being served, not waiting in agentrt's admission queue."""
    reports = read_journal(journals[0])
    assert any(r.queue_s > 0.1 * r.jct_s for r in reports)
    for r in reports:
        assert r.critical_llm_s == pytest.approx(breakdown(r).llm_s, abs=1e-6), r.name
        assert r.critical_llm_s + breakdown(r).queue_s <= r.jct_s + 1e-6


def test_breakdown_partitions_the_jct_and_the_critical_path_walks_back() -> None:
    # a: queued 0-1, served 1-4; tool 4-6 in a; b: served 5-7; nothing after 7 (JCT 10).
    job = _job("x", 10.0, calls=[("a", 0.0, 1.0, 4.0), ("b", 5.0, 0.0, 2.0)], tools=[("a", 4, 2)])
    parts = breakdown(job)
    assert (parts.llm_s, parts.queue_s, parts.tool_s, parts.other_s) == pytest.approx(
        (5.0, 1.0, 1.0, 3.0)
    )
    path = critical_path(job)
    # from the end: b's call ended last (7); before its start (5) the last to end is a's
    # call (4): the tool (4-6) was still running at 5.
    assert [(p.session, p.kind, p.start_s, p.end_s) for p in path] == [
        ("a", "call", 0.0, 4.0),
        ("b", "call", 5.0, 7.0),
    ]
    chain = _job("y", 6.0, calls=[("a", 0, 0, 2), ("a", 3, 0.5, 3)], tools=[("a", 2, 1)])
    assert [p.kind for p in critical_path(chain)] == ["call", "tool", "call"]


def test_summaries_per_job_name() -> None:
    reports = [
        _job("a", float(i), calls=[("s", 0.0, 0.0, 0.1 * i)], prompt=100, cached=50)
        for i in range(1, 11)
    ]
    reports.append(_job("b", 3.0, status="error", retries=2))
    a, b = summarize(reports)
    assert (a.name, a.jobs, a.errors, a.jct_p50, a.jct_p90, a.jct_p99) == ("a", 10, 0, 5, 9, 10)
    assert a.call_p50 == pytest.approx(0.5)
    assert a.cache_share == pytest.approx(0.5)
    assert (b.name, b.errors, b.retries) == ("b", 1, 2)
    assert b.other_share == 1.0


# --- the terminal table ------------------------------------------------------------------


@needs_extra
def test_the_table_shows_each_job_name_and_its_numbers(
    journals: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(journals[0])]) == 0
    out = capsys.readouterr().out
    summaries = {s.name: s for s in summarize(read_journal(journals[0]))}
    for header in ("JCT p50", "JCT p99", "call p50", "queue", "LLM", "tool", "cached", "moves"):
        assert header in out
    for name, s in summaries.items():
        # the row (split over two tables where 80 columns cannot hold it)
        line = " ".join(x for x in out.splitlines() if f" {name} " in x)
        assert f"{s.jct_p50:.2f}" in line and f"{s.jct_p99:.2f}" in line
        assert f"{s.call_p50:.3f}" in line
        share = s.queue_share
        # a share below 1% but above 0 prints as "<1%" (the fixture's queue time varies)
        assert (f"{share:.0%}" if share == 0 or share >= 0.01 else "<1%") in line
    assert "8 jobs from" in out


@needs_extra
def test_the_terminal_split_adds_up_to_the_jct(capsys: pytest.CaptureFixture[str]) -> None:
    """queue, LLM, tool and other: the four shares of the JCT, in the terminal too."""
    # queued 0-1, served 1-4; tool 4-6; nothing 6-10: 10% + 30% + 20% + 40%
    job = _job("x", 10.0, calls=[("a", 0.0, 1.0, 4.0)], tools=[("a", 4, 2)])
    from agentrt.report._tables import print_tables, summary_table

    print_tables([summary_table(summarize([job]), "t")], width=200)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "JCT p50" in line)
    row = next(line for line in out.splitlines() if " x " in line)
    cells = dict(
        zip(
            [h.strip() for h in header.strip("┃│ ").split("┃")],
            [c.strip() for c in row.strip("│ ").split("│")],
            strict=True,
        )
    )
    assert [cells[k] for k in ("queue", "LLM", "tool", "other")] == ["10%", "30%", "20%", "40%"]


@needs_extra
def test_names_print_as_written_not_as_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Job and session names, and the journal's path, are the user's text: rich shows them
    as they are (``triage[v2]`` stayed ``triage``; ``[/]`` crashed the command;
    ``deploy:rocket:`` was drawn with an emoji)."""
    names = ["triage[v2]", "[/]", "[bold]loud[/bold]", "deploy:rocket:"]
    folder = tmp_path / "runs[1]"
    folder.mkdir()
    jobs = [
        _job(n, 1.0 + i, calls=[("[red]s", 0.0, 0.0, 0.5)], job_id=f"j{i}")
        for i, n in enumerate(names)
    ]
    path = _write(folder / "journal.jsonl", jobs)
    assert main(["report", str(path), "--job", "j2"]) == 0
    out = capsys.readouterr().out
    for name in names:
        assert f" {name} " in out
    # The path may be folded at the terminal's width (its length is pytest's).
    assert "runs[1]" in "".join(out.split()) and "[red]s" in out
    assert "Critical path of [bold]loud[/bold] j2" in " ".join(out.split())


@needs_extra
def test_names_are_drawn_as_written_not_as_tex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Names are the user's text in the plots too: two ``$`` are two dollar signs, not
    TeX (``sum_$a_$b`` failed --png and --html with matplotlib's parse error; ``price $5
    or $6`` was drawn in math italics), and a name starting with ``_`` is not left out of
    the legend."""
    from matplotlib.text import Text

    from agentrt.report._command import PNG_NAMES
    from agentrt.report._plots import breakdown_bars, jct_cdf, png_bytes, timeline

    names = ["sum_$a_$b", "price $5 or $6", "_internal"]
    jobs = [
        _job(n, 1.0 + i, calls=[("$s$", 0.0, 0.1, 0.5)], tools=[("$s$", 0.6, 0.2)], job_id=f"j{i}")
        for i, n in enumerate(names)
    ]
    path = _write(tmp_path / "j.jsonl", jobs)
    out, page = tmp_path / "png", tmp_path / "r.html"
    assert main(["report", str(path), "--png", str(out), "--html", str(page)]) == 0
    assert all(_is_png(out / name) for name in PNG_NAMES)
    assert "sum_$a_$b" in page.read_text()

    cdf = jct_cdf([(n, [1.0 + i, 2.0 + i]) for i, n in enumerate(names)])
    bars = breakdown_bars([(s.name, s) for s in summarize(jobs)])
    gantt = timeline(jobs[0])
    for fig in (cdf, bars, gantt):
        png_bytes(fig)  # drawn, so the tick labels exist
        assert [t.get_text() for t in fig.findobj(Text) if t.get_parse_math()] == []
    legend = cdf.axes[0].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == names
    assert {t.get_text() for t in bars.axes[0].get_yticklabels()} == set(names)
    assert "$s$" in {t.get_text() for t in gantt.axes[0].get_yticklabels()}
    # a log axis (JCTs over more than 20x) is labelled in plain numbers, not TeX
    wide = jct_cdf([("a", [1.0, 30.0, 400.0])])
    png_bytes(wide)
    ticks = [t.get_text() for t in wide.axes[0].get_xticklabels() if t.get_text()]
    assert "10" in ticks and "100" in ticks and not any("$" in t for t in ticks)


@needs_extra
def test_several_journals_are_pooled(
    journals: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *map(str, journals)]) == 0
    out = capsys.readouterr().out
    assert "16 jobs from" in out
    assert re.search(r" react\s+.\s+8 ", out)


@needs_extra
def test_job_prints_its_critical_path(
    journals: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fastest = min(read_journal(journals[0]), key=lambda r: r.jct_s)
    assert main(["report", str(journals[0]), "--job", fastest.job_id]) == 0
    out = capsys.readouterr().out
    assert f"Critical path of {fastest.name} {fastest.job_id}" in out
    assert len(critical_path(fastest)) >= 2


# --- plots and the page ------------------------------------------------------------------


@needs_extra
def test_png_writes_four_plots(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plots"
    assert main(["report", str(journals[0]), "--png", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["breakdown.png", "jct_cdf.png", "jobs.png", "timeline.png"]
    for p in out.iterdir():
        assert _is_png(p), p
        assert p.stat().st_size > 5_000, p
    assert f"wrote {out / 'timeline.png'}" in capsys.readouterr().out


@needs_extra
def test_html_is_one_self_contained_page(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "out" / "report.html"
    assert main(["report", str(journals[0]), "--html", str(page)]) == 0
    capsys.readouterr()
    assert list(page.parent.iterdir()) == [page]
    text = page.read_text()
    assert not re.search(r"https?://", text)  # endpoints and tool URLs stay out too
    assert not re.search(r"<(script|link|iframe)\b|@import|url\(", text)
    assert re.findall(r'src="([^"]*)"', text) and all(
        src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', text)
    )
    assert text.count("data:image/png;base64,") == 4
    assert text.count("<table>") == 2  # the summary and the slowest job's critical path
    # Pictures first: the slowest and median jobs' strips lead, before any table.
    assert text.index("data:image/png;base64,") < text.index("<table>")
    assert "The slowest and the median job" in text
    for cell in ('<td class="label">react</td>', '<td class="label">fanout</td>', "JCT p99"):
        assert cell in text
    slowest = max(read_journal(journals[0]), key=lambda r: r.jct_s)
    assert f"Critical path of {slowest.name} {slowest.job_id}" in text


# --- compare -----------------------------------------------------------------------------


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    a = [
        _job("x", float(j), calls=[("s", 0.0, 0.0, 1.0)], prompt=100, cached=10)
        for j in (1, 2, 3, 4)
    ]
    b = [
        _job("x", 2.0 * j, calls=[("s", 0.0, 0.0, 0.5)], prompt=100, cached=30)
        for j in (1, 2, 3, 4)
    ]
    b.append(_job("only-b", 1.0))
    return _write(tmp_path / "base.jsonl", a), _write(tmp_path / "new.jsonl", b)


def test_compare_ratios(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    rows = {(r.name, r.metric): r for r in compare(read_journal(a), read_journal(b))}
    assert rows["x", "JCT p50"].ratio == pytest.approx(2.0)  # 4 over 2
    assert rows["x", "JCT p90"].ratio == pytest.approx(2.0)  # 8 over 4
    assert rows["x", "JCT p99"].ratio == pytest.approx(2.0)  # 8 over 4
    assert rows["x", "TTFT p50"].a is None or math.isnan(rows["x", "TTFT p50"].a)
    assert rows["x", "TTFT p50"].ratio is None  # nothing streamed
    assert rows["x", "call p50"].ratio == pytest.approx(0.5)
    assert rows["x", "cache share"].ratio == pytest.approx(3.0)
    assert rows["x", "jobs"].ratio == 1.0
    assert rows["x", "retries"].ratio is None  # 0 over 0
    assert rows["only-b", "JCT p50"].a is None and rows["only-b", "JCT p50"].ratio is None


@needs_extra
def test_compare_in_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _pair(tmp_path)
    assert main(["report", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "B / A: new over base" in out
    assert out.count("Times in seconds.") == 1  # the summaries' legend once, under A's
    assert re.search(r"JCT p50\s+.\s+2\.000\s+.\s+4\.000\s+.\s+2\.00x", out)
    assert re.search(r"cache share\s+.\s+10%\s+.\s+30%\s+.\s+3\.00x", out)
    assert re.search(r"call p50\s+.\s+1\.000\s+.\s+0\.500\s+.\s+0\.50x", out)


@needs_extra
def test_compare_real_runs_with_plots_and_page(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "compare.html"
    args = ["report", "--compare", *map(str, journals), "--png", str(tmp_path), "--html"]
    assert main([*args, str(page)]) == 0
    out = capsys.readouterr().out
    assert "B / A: roomy over tight" in out
    text = page.read_text()
    assert text.count("<table>") == 4  # A, B, B over A, the critical path
    assert text.count("Times in seconds.") == 1  # the summaries' legend once, under A's
    assert "roomy over tight" in text
    # The page leads with the strips of both sides, then the B/A table, then A's and B's.
    order = [
        text.index("The slowest and the median job of each side"),
        text.index("B / A: roomy over tight"),
        text.index("A: tight"),
        text.index("<details>"),
        text.index("Critical path of"),
    ]
    assert order == sorted(order)
    for metric in ("JCT p50", "JCT p90", "JCT p99", "TTFT p50", "TTFT p90", "TTFT p99"):
        assert f'<td class="label">{metric}</td>' in text
    assert all(_is_png(tmp_path / n) for n in ("jct_cdf.png", "breakdown.png", "timeline.png"))


# --- errors ------------------------------------------------------------------------------


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    for needle in needles:
        assert needle in captured.err


def test_errors_are_named_with_exit_code_2(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    _fails(["report", str(missing)], capsys, f"journal {missing}: no such file")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    _fails(["report", str(journals[0]), str(empty)], capsys, f"journal {empty} is empty")
    _fails(["report", str(tmp_path)], capsys, "is a directory")
    _fails(
        ["report", str(journals[0]), "--job", "job-nope"],
        capsys,
        "--job job-nope: no job with that id",
    )
    _fails(["report", "--compare", str(journals[0])], capsys, "--compare takes two journals")


@needs_extra
def test_a_corrupt_line_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "runs.jsonl", [_job("x", 1.0)])
    with path.open("a") as f:
        f.write('{"job_id": "cut sh\n')
    assert main(["report", str(path)]) == 0
    captured = capsys.readouterr()
    assert "agentrt: warning:" in captured.err and "runs.jsonl:2" in captured.err
    assert " x " in captured.out


@pytest.mark.parametrize("command", ["report", "tune"])
def test_a_journal_whose_every_line_is_invalid_says_what_is_wrong(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """Not "is empty" (report) nor a bare "no valid job report" (tune): how many lines,
    the first bad one and why."""
    path = tmp_path / "runs.jsonl"
    good = _job("x", 1.0).model_dump_json()
    path.write_text("\n" + good.replace('"jct_s"', '"jct"') + "\n" + good[:40] + "\n")
    monkeypatch.chdir(tmp_path)  # (where tune would write its file)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"journal {path} has no valid job report: none of its 2 lines is a JobReport" in err
    assert "(first: line 2, jct_s: Field required)" in err
    assert "is empty" not in err


def test_a_file_that_is_not_a_journal_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A README given by mistake printed a warning per line (~110) before "empty"."""
    path = tmp_path / "README.md"
    path.write_text("# agentrt\n\n" + "Some prose, not a job report.\n" * 110)
    assert main(["report", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "is not an agentrt journal" in lines[0], captured.err
    assert str(path) in lines[0] and "Runtime(journal=" in lines[0]


@needs_extra
def test_many_corrupt_lines_in_a_journal_are_a_few_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "runs.jsonl", [_job("x", 1.0)])
    with path.open("a") as f:
        f.write('{"job_id": "cut sh\n' * 40)
    assert main(["report", str(path)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert 2 <= len(warned) <= 6, warned
    assert "40 lines" in warned[-1] and "skipped" in warned[-1]


def test_without_the_extra_the_error_names_the_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "runs.jsonl", [_job("x", 1.0)])
    monkeypatch.setitem(sys.modules, "rich", None)
    _fails(["report", str(path)], capsys, 'pip install "agentjct[report]"')


def test_the_public_names_are_sorted_and_complete() -> None:
    names = agentrt.report.__all__
    assert names == sorted(names, key=lambda n: (not n[0].isupper(), n))
    assert all(hasattr(agentrt.report, n) for n in names)


def test_phases_tile_the_job_and_add_up_to_its_breakdown() -> None:
    job = _job(
        "x",
        10.0,
        calls=[("s", 0.0, 1.0, 3.0), ("t", 2.0, 0.0, 2.0), ("s", 7.0, 0.5, 1.5)],
        tools=[("s", 3.0, 3.5)],
    )
    ps = phases(job)
    assert ps[0].start_s == 0.0 and ps[-1].end_s == 10.0
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(ps))
    assert all(a.kind != b.kind for a, b in itertools.pairwise(ps))
    assert [(p.kind, p.start_s, p.end_s) for p in ps] == [
        ("queued", 0.0, 1.0),
        ("llm", 1.0, 4.0),
        ("tool", 4.0, 6.5),
        ("other", 6.5, 7.0),
        ("queued", 7.0, 7.5),
        ("llm", 7.5, 8.5),
        ("other", 8.5, 10.0),
    ]
    total = {k: sum(p.end_s - p.start_s for p in ps if p.kind == k) for k in _KINDS}
    b = breakdown(job)
    assert total == pytest.approx(
        {"llm": b.llm_s, "queued": b.queue_s, "tool": b.tool_s, "other": b.other_s}
    )


_KINDS = ("llm", "queued", "tool", "other")


@needs_extra
def test_the_page_folds_the_critical_path_to_its_longest_rows(tmp_path: Path) -> None:
    calls = [("s", float(2 * i), 0.0, 1.0 + (i % 7) * 0.1) for i in range(60)]
    long = _job("long", 121.0, calls=calls, tools=[("s", 2.0 * i + 1.7, 0.3) for i in range(60)])
    page = tmp_path / "r.html"
    agentrt.report.report(
        [_write(tmp_path / "j.jsonl", [long, _job("x", 1.0)])], html_path=page, echo=print
    )
    text = page.read_text()
    folded = text[text.index("<details>") : text.index("</details>")]
    assert "Critical path of long" in folded
    assert folded.count("<tr>") == 1 + 15  # the header and the 15 longest
    assert "the 15 longest of its 120 activities" in folded


# --- the page in a browser ---------------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    message = "chromium not installed (apt-get install -y chromium; scripts/test.sh does it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {message}", pytrace=False)
    pytest.skip(message)


@pytest.mark.browser
@needs_extra
def test_the_page_renders_in_headless_chromium(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chromium = _chromium()
    page = tmp_path / "report.html"
    assert main(["report", str(journals[0]), "--html", str(page)]) == 0
    shot = tmp_path / "shot.png"
    _screenshot(chromium, page, shot, 2000)
    assert _is_png(shot)
    assert shot.stat().st_size > 30_000
    from PIL import Image  # matplotlib's dependency

    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 100  # tables and plots, not a blank page


def _screenshot(chromium: str, page: Path, shot: Path, height: int) -> None:
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={shot.parent / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size=1280,{height}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=90,
    )


@pytest.mark.browser
@needs_extra
def test_the_compare_page_leads_with_the_jobs_timelines_at_1280_px(
    journals: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first screen of the comparison page (1280 x 800 px, as the docs' picture) is
    mostly the job strips: LLM blue and tool orange bars of four jobs, across the page."""
    chromium = _chromium()
    page = tmp_path / "compare.html"
    assert main(["report", "--compare", *map(str, journals), "--html", str(page)]) == 0
    capsys.readouterr()
    shot = tmp_path / "shot.png"
    _screenshot(chromium, page, shot, 800)
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 800)
        rgb = image.convert("RGB")
        width, height = rgb.size
        pixels = rgb.load()
        assert pixels is not None

        def near(p: tuple[int, int, int], color: tuple[int, int, int]) -> bool:
            return all(abs(a - b) <= 12 for a, b in zip(p, color, strict=True))

        llm, tool = (0x4C, 0x78, 0xA8), (0xF5, 0x85, 0x18)
        rows_with_llm = set()
        llm_px = tool_px = 0
        xs_llm = []
        for y in range(0, height, 2):
            for x in range(0, width, 2):
                p = pixels[x, y]
                if near(p, llm):
                    llm_px += 1
                    rows_with_llm.add(y // 20)
                    xs_llm.append(x)
                elif near(p, tool):
                    tool_px += 1
        # Bars of several jobs (not one), a good share of the screen, spread across it.
        assert len(rows_with_llm) >= 4
        assert llm_px * 4 > 0.02 * width * height and tool_px > 200
        assert max(xs_llm) - min(xs_llm) > width / 2
