"""``agentrt report`` on journals with time held by load control: its own phase in the
split of each job's JCT, its own columns in the tables, colour in the plots and words in
the page; a journal without holds shows nothing new."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

import pytest

import agentrt.report
from agentrt.cli import main
from agentrt.report import activities, breakdown, compare, critical_path, summarize
from agentrt.report._tables import SUMMARY_HEADERS, summary_table, text_lines
from agentrt.report._timeline import phases
from agentrt.telemetry import JobReport
from tests.telemetry._jobs import job_report as job

needs_extra = pytest.mark.skipif(
    find_spec("rich") is None or find_spec("matplotlib") is None,
    reason='needs the report extra: pip install "agentjct[report]"',
)


# a: held 0-2, queued 2-3, served 3-6 (latency 6 from its start); tool 6-8; nothing 8-10
HELD = job("x", 10.0, calls=[("a", 0.0, 2.0, 1.0, 6.0)], tools=[("a", 6.0, 2.0)])
PLAIN = job("x", 10.0, calls=[("a", 0.0, 0.0, 1.0, 6.0)], tools=[("a", 6.0, 2.0)])


def write(path: Path, reports: Sequence[JobReport]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in reports))
    return path


def test_held_is_a_phase_of_its_own_before_queued_then_llm() -> None:
    parts = breakdown(HELD)
    assert (parts.held_s, parts.queue_s, parts.llm_s, parts.tool_s, parts.other_s) == (
        pytest.approx((2.0, 1.0, 3.0, 2.0, 2.0))
    )
    assert parts.total_s == pytest.approx(HELD.jct_s)
    ps = phases(HELD)
    assert [(p.kind, p.start_s, p.end_s) for p in ps] == [
        ("held", 0.0, 2.0),
        ("queued", 2.0, 3.0),
        ("llm", 3.0, 6.0),
        ("tool", 6.0, 8.0),
        ("other", 8.0, 10.0),
    ]
    (call,) = [a for a in activities(HELD) if a.kind == "call"]
    assert (call.held_s, call.queue_s, call.start_s, call.end_s) == (2.0, 1.0, 0.0, 6.0)
    # a job never held: the split of before, held 0
    plain = breakdown(PLAIN)
    assert (plain.held_s, plain.queue_s, plain.llm_s, plain.other_s) == pytest.approx(
        (0.0, 1.0, 5.0, 2.0)
    )


def test_a_call_being_served_or_queued_outranks_one_held() -> None:
    """Two sessions: b's call is held 0-4 while a's is queued 0-1 then served 1-3: only
    3-4 counts as held; the phases tile the JCT and add up to the breakdown."""
    j = job("y", 6.0, calls=[("a", 0.0, 0.0, 1.0, 3.0), ("b", 0.0, 4.0, 0.0, 5.0)])
    parts = breakdown(j)
    assert (parts.queue_s, parts.llm_s, parts.held_s, parts.other_s) == pytest.approx(
        (1.0, 3.0, 1.0, 1.0)
    )
    ps = phases(j)
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(ps))
    total = {k: sum(p.end_s - p.start_s for p in ps if p.kind == k) for k in ("held", "llm")}
    assert total == pytest.approx({"held": parts.held_s, "llm": parts.llm_s})


def test_the_summary_and_the_comparison_show_held_only_where_jobs_were_held() -> None:
    (s,) = summarize([HELD, PLAIN])
    assert s.held_share == pytest.approx(2.0 / 20.0)
    assert s.hold_max == 2.0
    assert s.held_share + s.queue_share + s.llm_share + s.tool_share + s.other_share == (
        pytest.approx(1.0)
    )
    table = summary_table([s], "t")
    assert table.headers.index("held") == table.headers.index("queue") - 1
    row = dict(zip(table.headers, table.rows[0], strict=True))
    assert (row["held"], row["queue"], row["hold max"]) == ("10%", "10%", "2.00")
    assert "held by load control" in table.caption
    (plain,) = summarize([PLAIN])
    assert plain.held_share == 0.0 and plain.hold_max == 0.0
    bare = summary_table([plain], "t")
    assert bare.headers == SUMMARY_HEADERS and "load control" not in bare.caption
    # a comparison: the held rows where either run was held, none where neither was
    metrics = {r.metric for r in compare([PLAIN], [HELD])}
    assert {"held share", "hold max"} <= metrics
    rows = {r.metric: r for r in compare([PLAIN], [HELD])}
    assert (rows["held share"].a, rows["held share"].b) == (0.0, pytest.approx(0.2))
    assert not {"held share", "hold max"} & {r.metric for r in compare([PLAIN], [PLAIN])}


def test_the_critical_path_table_has_a_held_column_only_where_held() -> None:
    from agentrt.report._command import Run, _critical_table

    run = Run("", (), (HELD,))
    table = _critical_table(run, HELD)
    assert table.headers[-2:] == ("held", "queued")
    assert [a.kind for a in critical_path(HELD)] == ["call", "tool"]
    assert table.rows[0][-2:] == ("2.000", "1.000")
    assert "held" not in _critical_table(run, PLAIN).headers


@needs_extra
def test_the_terminal_and_the_page_show_the_time_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "held.jsonl", [HELD, job("z", 3.0, [("s", 0.0, 0.0, 0.0, 1.0)])])
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page), "--png", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hold max" in out and "held by load control" in " ".join(out.split())
    text = page.read_text()
    assert '<th class="num">held</th>' in text and '<th class="num">hold max</th>' in text
    assert "purple while calls were only held by load control" in text
    assert "only held by load control" in text  # the breakdown's caption
    assert "the purple part held by load control" in text  # the slowest job's timeline
    assert all((tmp_path / n).stat().st_size > 5_000 for n in ("jobs.png", "timeline.png"))


@needs_extra
def test_a_journal_without_holds_shows_nothing_new(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plain.jsonl", [PLAIN])
    page = tmp_path / "report.html"
    agentrt.report.report([path], html_path=page, echo=print)
    out = capsys.readouterr().out
    text = page.read_text()
    for shown in (out, text):
        assert "load control" not in shown and "hold max" not in shown
    assert '<th class="num">held</th>' not in text
    lines = text_lines(summary_table(summarize([PLAIN]), "t"), width=200)
    assert " held " not in lines[1]
