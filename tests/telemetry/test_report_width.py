"""`agentrt report`'s tables fit the terminal: at 80 and 100 columns, piped or on a
terminal, no line is wider and no cell is cut with an ellipsis (long job names fold, wide
tables split with the job column repeated). Plain-text rendering does the same."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path

import pytest

from agentrt.cli import main
from agentrt.report._tables import SUMMARY_HEADERS, TextTable, fit_width, text_lines
from agentrt.telemetry import CallReport, JobReport, ToolReport

needs_rich = pytest.mark.skipif(
    find_spec("rich") is None,
    reason='the terminal tables need rich: pip install "agentjct[report]"',
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NAMES = ("summarize", "claude-code-replay-of-a-long-refactoring-session", "react")


def _job(name: str, i: int) -> JobReport:
    calls = [
        CallReport(
            call_id=f"c{k}",
            session_id=f"s{k % 2}",
            session_name="main-session-with-a-long-name",
            turn=k,
            path="/chat/completions",
            start_s=k * 2.0,
            queue_s=0.25 * k,
            latency_s=1.5 + i,
        )
        for k in range(3)
    ]
    tools = [ToolReport(session_id="s0", name="run_tests", start_s=1.7, duration_s=0.3)]
    return JobReport(
        job_id=f"job-{name}-{i}",
        name=name,
        program_id="p",
        status="ok",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        jct_s=10.0 + 7 * i,
        llm_s=3 * (1.5 + i),
        critical_llm_s=2.0,
        queue_s=0.75,
        tool_s=0.3,
        calls=3,
        tool_waits=1,
        sessions=2,
        prompt_tokens=1000,
        completion_tokens=100,
        cached_tokens=250 * i,
        retries=i % 2,
        call_reports=calls,
        tool_reports=tools,
    )


@pytest.fixture
def journals(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "run-a.jsonl", tmp_path / "run-b.jsonl"
    a.write_text("".join(_job(n, i).model_dump_json() + "\n" for n in NAMES for i in range(3)))
    b.write_text("".join(_job(n, i + 1).model_dump_json() + "\n" for n in NAMES for i in range(3)))
    return a, b


def _check(out: str, width: int) -> list[str]:
    lines = [ANSI.sub("", line).rstrip() for line in out.splitlines()]
    assert all(len(line) <= width for line in lines), [x for x in lines if len(x) > width]
    assert "…" not in out and "..." not in out
    return lines


def _first_cells(lines: list[str]) -> str:
    """The first column's text, folded cells joined back (rich tables)."""
    return "".join(line.split("│")[1].strip() for line in lines if line.startswith("│"))


@needs_rich
@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("terminal", [False, True])
def test_the_summary_fits_and_keeps_every_name_and_number(
    journals: tuple[Path, Path],
    width: int,
    terminal: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert main(["report", str(journals[0])]) == 0
    out = capsys.readouterr().out
    lines = _check(out, width)
    joined = _first_cells(lines)
    for name in NAMES:
        assert name in joined
    for header in SUMMARY_HEADERS:
        assert header in out
    if width == 100:  # the short names are whole on their rows (`sum…` before)
        assert any(re.match(r"│ summarize\s+│", line) for line in lines)


@needs_rich
@pytest.mark.parametrize("width", [80, 100])
def test_compare_and_the_critical_path_fit(
    journals: tuple[Path, Path],
    width: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["report", "--compare", *map(str, journals)]) == 0
    lines = _check(capsys.readouterr().out, width)
    assert "claude-code-replay-of-a-long-refactoring-session" in _first_cells(lines)
    job = "job-claude-code-replay-of-a-long-refactoring-session-2"
    assert main(["report", str(journals[0]), "--job", job]) == 0
    out = capsys.readouterr().out
    _check(out, width)
    assert job in " ".join(out.split())


def test_fit_width_splits_columns_and_repeats_the_labels() -> None:
    rows = (("a-rather-long-job-name", *(f"{k}.{k}{k}" for k in range(len(SUMMARY_HEADERS) - 1))),)
    t = TextTable("title", SUMMARY_HEADERS, rows, "caption")
    parts = fit_width(t, 80)
    assert len(parts) >= 2
    assert [p.headers[0] for p in parts] == ["job"] * len(parts)
    assert [h for p in parts for h in p.headers[1:]] == list(SUMMARY_HEADERS[1:])
    assert parts[0].title == "title" and parts[-1].caption == "caption"
    assert all(not p.title for p in parts[1:]) and all(not p.caption for p in parts[:-1])
    assert fit_width(t, 400) == [t]


@pytest.mark.parametrize("width", [60, 80, 100])
def test_plain_text_fits_and_folds_long_labels(width: int) -> None:
    rows = tuple(
        (name, *(f"{k * 11.111:.2f}" for k in range(len(SUMMARY_HEADERS) - 1)))
        for name in (*NAMES, "x" * 90)
    )
    lines = text_lines(TextTable("a title " * 20, SUMMARY_HEADERS, rows, "a caption " * 30), width)
    _check("\n".join(lines), width)
    # labels have no spaces: the first word of each line is the label column's text
    text = "".join(line.split(" ", 1)[0] for line in lines)
    for name in (*NAMES, "x" * 90):
        assert name in text
    assert "\n".join(lines).count("133.33") == len(rows)  # every number once, whole


TITLE = "agentrt bench: coding (362 calls per client, virtual time, 5.9 s wall)"
CAPTION = "Times in seconds. JCT: job completion time; call: per-call latency. " * 3


def test_titles_wrap_between_phrases() -> None:
    from agentrt.report._tables import wrap_title

    assert wrap_title(TITLE, 80) == [TITLE]
    assert wrap_title(TITLE, 60) == [
        "agentrt bench: coding (362 calls per client, virtual time,",
        "5.9 s wall)",
    ]
    assert wrap_title(TITLE, 30) == [
        "agentrt bench: coding",
        "(362 calls per client,",
        "virtual time, 5.9 s wall)",
    ]
    assert wrap_title("", 80) == []


@needs_rich
@pytest.mark.parametrize("width", [60, 80, 100])
def test_titles_and_captions_span_the_terminal_not_the_table_and_end_in_no_space(
    width: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bench title wrapped at its narrow table's width, mid-phrase ("5.9 s" / "wall)"),
    and rich padded titles and captions with spaces to the table's width."""
    from agentrt.report._tables import print_tables, wrap_title

    narrow = TextTable(TITLE, ("client", "JCT"), (("plain", "1.00"), ("agentrt", "0.50")), CAPTION)
    print_tables([narrow], width=width)
    lines = capsys.readouterr().out.splitlines()
    title = wrap_title(TITLE, width)
    assert lines[: len(title)] == title
    assert "5.9 s wall)" in lines[len(title) - 1]
    assert not [line for line in lines if line != line.rstrip()]
    caption = [line for line in lines if not line.startswith(("┏", "┃", "┡", "│", "└"))]
    caption = caption[len(title) :]
    assert " ".join(caption) == CAPTION.strip()
    assert max(len(line) for line in caption) > 40  # the terminal's width, not the table's


def test_plain_text_titles_wrap_between_phrases_too() -> None:
    lines = text_lines(TextTable(TITLE, ("client", "JCT"), (("plain", "1.00"),)), 60)
    assert lines[:2] == [
        "agentrt bench: coding (362 calls per client, virtual time,",
        "5.9 s wall)",
    ]
