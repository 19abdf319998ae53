"""`agentrt demo` and the bench's output: tables that fit 80 columns (no cell cut with
an ellipsis, on a terminal and piped), rows that differ, sentences that name the ratios
measured, a progress bar that counts jobs, one summary figure.

The demo runs for real (the embedded cluster in virtual time) with fewer jobs.
"""

from __future__ import annotations

import json
import math
import re
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from agentrt.bench import BenchConfig, run_bench
from agentrt.bench._demo import (
    DEMO_CLIENTS,
    demo_config,
    demo_table,
    headline,
    run_demo,
    summary,
    wrap,
)
from agentrt.bench._output import bench_table, print_table, progress_bar, show_tables

HAVE_RICH = find_spec("rich") is not None
HAVE_MATPLOTLIB = find_spec("matplotlib") is not None
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
JOBS = 10


def _check_width(out: str, width: int) -> list[str]:
    lines = [ANSI.sub("", line) for line in out.splitlines()]
    too_long = [line for line in lines if len(line.rstrip()) > width]
    assert not too_long, too_long
    assert "…" not in out and "..." not in out
    return lines


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small demo run, piped (not a terminal), at 80 columns."""
    out = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "80")
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = run_demo(out, plots=HAVE_MATPLOTLIB, journal=True, seed=0, _jobs=JOBS)
    return {"rc": rc, "out": out, "text": buf.getvalue()}


def test_the_demo_fits_80_columns_and_cuts_no_cell(demo_run: dict[str, Any]) -> None:
    assert demo_run["rc"] == 0
    lines = _check_width(demo_run["text"], 80)
    for header in ("JCT mean", "JCT p50", "JCT p90", "TTFT p50", "cache hit"):
        assert any(header in line for line in lines), header
    assert any("agentrt / plain" in line for line in lines)


def _row(lines: list[str], label: str) -> list[str]:
    """The table row whose first cell is ``label``: its other cells."""
    for line in lines:
        cells = [c.strip() for c in re.split(r"│|┃|\s{2,}", line) if c.strip()]
        if len(cells) == 6 and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r}")


def test_plain_and_agentrt_rows_differ_and_agentrt_wins(demo_run: dict[str, Any]) -> None:
    lines = demo_run["text"].splitlines()
    plain, agentrt = _row(lines, "plain"), _row(lines, "agentrt")
    assert len(plain) == len(agentrt) == 5
    assert plain != agentrt
    result = json.loads((demo_run["out"] / "results.json").read_text())
    p, a = result["clients"]
    assert [p["client"], a["client"]] == list(DEMO_CLIENTS)
    # the same jobs, and agentrt keeps sessions' contexts: more cache hits, sooner tokens
    assert p["jobs"] == a["jobs"] == JOBS
    assert a["prefix_cache_hit_rate"] > p["prefix_cache_hit_rate"]
    assert a["ttft"]["p50"] < p["ttft"]["p50"]


def test_the_sentences_name_the_ratios_measured(demo_run: dict[str, Any]) -> None:
    result = json.loads((demo_run["out"] / "results.json").read_text())
    p, a = result["clients"]
    text = " ".join(demo_run["text"].split())
    shares = {c: _journal_share(demo_run["out"] / f"journal-{c}.jsonl") for c in JOURNALS}
    hit_p, hit_a = shares["plain"], shares["agentrt_session"]
    ratios = {
        "JCT p50": a["jct"]["p50"] / p["jct"]["p50"],
        "TTFT p50": a["ttft"]["p50"] / p["ttft"]["p50"],
        "cache hit": hit_a / hit_p,
    }
    assert f"median job completion time is {ratios['JCT p50']:.2f}x plain's" in text
    assert f"median time to first token {ratios['TTFT p50']:.2f}x" in text
    assert f"prefix-cache hit rate {ratios['cache hit']:.2f}x" in text
    assert f"({a['jct']['p50']:.0f} s against {p['jct']['p50']:.0f} s)" in text
    assert f"({hit_a:.0%} against {hit_p:.0%})" in text
    assert "plain is a bare openai client" in text and "round-robin" in text
    assert "session routing" in text
    # the ratio row shows the same numbers
    row = " ".join(x for x in demo_run["text"].splitlines() if "agentrt / plain" in x)
    for value in ratios.values():
        assert f"{value:.2f}x" in row


def test_the_footer_says_wall_and_cpu_once_and_names_the_files(
    demo_run: dict[str, Any],
) -> None:
    text = " ".join(demo_run["text"].split())
    assert len(re.findall(r"s wall", text)) == 1
    result = json.loads((demo_run["out"] / "results.json").read_text())
    done = re.search(
        r"Done in ([0-9.]+) s wall, [0-9.]+ s of CPU .*the replays alone ([0-9.]+) s", text
    )
    assert done, text
    assert done[2] == f"{result['wall_s']:.1f}"  # the figure results.json holds
    assert float(done[1]) >= float(done[2])  # the command's wall time includes the replays
    out: Path = demo_run["out"]
    assert f"results: {out / 'results.json'}" in text
    for name in ("journal-plain.jsonl", "journal-agentrt_session.jsonl"):
        assert str(out / name) in text
        assert len((out / name).read_text().splitlines()) == JOBS
    if HAVE_MATPLOTLIB:
        figure = out / "demo.png"
        assert f"figure: {figure}" in text
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


JOURNALS = ("plain", "agentrt_session")


def _journal_share(path: Path) -> float:
    from agentrt.telemetry import read_journal

    reports = read_journal(path)
    return sum(r.cached_tokens for r in reports) / sum(r.prompt_tokens for r in reports)


def test_the_demo_and_agentrt_report_show_one_cache_figure(demo_run: dict[str, Any]) -> None:
    """The demo's cache column is the share `agentrt report` computes from the same
    journals (every plain call asked for its usage, streams included), and it names the
    moves the report counts."""
    from agentrt.report._stats import summarize
    from agentrt.telemetry import read_journal

    out: Path = demo_run["out"]
    lines = demo_run["text"].splitlines()
    for client, label in zip(JOURNALS, ("plain", "agentrt"), strict=True):
        reports = read_journal(out / f"journal-{client}.jsonl")
        assert all(c.prompt_tokens is not None for r in reports for c in r.call_reports)
        (row,) = summarize(reports)
        assert row.cache_share is not None
        assert _row(lines, label)[4] == f"{row.cache_share:.0%}"
    moves = sum(r.session_moves for r in read_journal(out / "journal-agentrt_session.jsonl"))
    assert f"{moves} of its " in " ".join(demo_run["text"].split())


def test_the_figure_s_cache_bars_are_the_table_s_and_its_title_s(
    demo_run: dict[str, Any],
) -> None:
    """One source for every cache figure shown together (issue 35, item 12): the bars,
    the panel's title ratio and the table's column all read the journals' share, not the
    engines' counters (which here are made to differ)."""
    from types import SimpleNamespace

    from agentrt.bench._demo import _x, cache_bars, headline

    out: Path = demo_run["out"]
    lines = demo_run["text"].splitlines()
    clients = [
        SimpleNamespace(
            journal=str(out / f"journal-{client}.jsonl"),
            prefix_cache_hit_rate=_journal_share(out / f"journal-{client}.jsonl") + 0.03,
            jct={"mean": 1.0, "p50": 1.0, "p90": 1.0},
            ttft=None,
        )
        for client in JOURNALS
    ]
    result: Any = SimpleNamespace(clients=clients)
    bars = cache_bars(result)
    for bar, client, label in zip(bars, JOURNALS, ("plain", "agentrt"), strict=True):
        assert bar == pytest.approx(100 * _journal_share(out / f"journal-{client}.jsonl"))
        assert _row(lines, label)[4] == f"{bar:.0f}%"
    assert _x(headline(result).cache_hit) == _x(bars[1] / bars[0])


def test_the_demo_config_is_what_the_docs_say() -> None:
    cfg = demo_config()
    assert cfg.workload == "coding" and cfg.clients == DEMO_CLIENTS
    assert (cfg.jobs, cfg.rate, cfg.replicas, cfg.gpu_blocks) == (32, 0.2, 8, 16_384)
    assert not cfg.stretch and cfg.preset == "h100-8b"


def test_wrap_keeps_numbers_with_their_units() -> None:
    text = "agentrt took 185 s against 350 s and 15 min, client-side"
    for width in range(12, 40):
        lines = wrap(text, width)
        assert " ".join(lines) == text
        assert not any(line.endswith(("185", "350", "15")) for line in lines)


# --- agentrt bench's table ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_result() -> Any:
    cfg = BenchConfig(
        workload="coding",
        jobs=4,
        clients=("plain", "agentrt:plas+round_robin@auto", "agentrt:session"),
        replicas=2,
        stretch=True,
    )
    return run_bench(cfg)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_bench_table_fits_as_plain_text(
    bench_result: Any, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    lines: list[str] = []
    print_table(bench_result, "agentrt bench: coding", echo=lines.append)
    _check_width("\n".join(lines), width)
    text = "\n".join(lines)
    for c in bench_result.clients:  # every client and every number, whole
        assert c.client in text
        assert f"{c.jct['p99']:.2f}" in text
        assert f"{c.prefix_cache_hit_rate:.1%}" in text


@pytest.mark.skipif(not HAVE_RICH, reason="the rich table needs rich (the report extra)")
@pytest.mark.parametrize("terminal", [False, True])
def test_the_bench_table_fits_with_rich(
    bench_result: Any,
    terminal: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    if terminal:  # rich then renders as for a terminal (colours, its own width logic)
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    print_table(bench_result, "agentrt bench: coding")
    out = capsys.readouterr().out
    lines = _check_width(out, 80)
    # split in two or more tables, each with the whole client name (folded if need be)
    first = "".join(line.split("│")[1].strip() for line in lines if line.startswith("│"))
    assert first.count("agentrt:plas+round_robin@auto") >= 2
    for c in bench_result.clients:
        assert f"{c.call_latency['p99']:.3f}" in out


def test_show_tables_without_an_echo_uses_rich_or_text(
    bench_result: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    show_tables([bench_table(bench_result, "t")])
    _check_width(capsys.readouterr().out, 80)


def test_the_progress_bar_counts_jobs_per_run() -> None:
    seen: list[str] = []
    with progress_bar(4, enabled=False) as advance:
        advance("plain")
        seen.append("ok")
    assert seen == ["ok"]
    if not HAVE_RICH:
        return
    from rich.progress import Progress

    totals: list[tuple[str, float | None, float]] = []
    real_stop = Progress.stop

    def stop(self: Progress) -> None:
        totals.extend((t.description, t.total, t.completed) for t in self.tasks)
        real_stop(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Progress, "stop", stop)
        with progress_bar(4) as advance:
            for label in ("plain", "plain", "agentrt:session", "plain", "plain", "alone"):
                advance(label)
    assert totals[0] == ("plain", 4, 4)
    assert totals[1] == ("agentrt:session", 4, 1)
    assert totals[2][1:] == (4, 1)


def test_run_labels_show_as_written_in_the_progress_bar() -> None:
    """A client's label is user text (a spec, a file name): rich shows it, never reads it
    as markup (``[/]`` raised MarkupError) nor as an emoji code (``:rocket:``)."""
    if not HAVE_RICH:
        return
    from rich.progress import Progress

    shown: list[str] = []
    real_stop = Progress.stop

    def stop(self: Progress) -> None:  # the bar's own first column: the label
        shown.extend(self.columns[0].render(t).plain for t in self.tasks)  # type: ignore[union-attr]
        real_stop(self)

    labels = ["[/]", "agentrt:config=tuned[v2].toml", "[bold]x", "plain>:rocket:"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Progress, "stop", stop)
        with progress_bar(2) as advance:
            for label in labels:
                advance(label)
    assert shown == labels


def test_headline_ratios_and_summary_follow_the_numbers(bench_result: Any) -> None:
    h = headline(bench_result)
    p, a = bench_result.clients[0], bench_result.clients[1]
    assert h.jct_p50 == pytest.approx(a.jct["p50"] / p.jct["p50"])
    assert math.isfinite(h.cache_hit)
    assert f"{h.jct_p50:.2f}x" in " ".join(summary(bench_result))


def test_without_rich_the_demo_table_is_plain_text(
    bench_result: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain `pip install` has no rich: the table prints as text and still fits."""
    for name in ("rich", "rich.console", "rich.table", "rich.progress"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails
    monkeypatch.setenv("COLUMNS", "80")
    show_tables([demo_table(bench_result, "title")])
    with progress_bar(4) as advance:  # no bar, no error
        advance("plain")
    lines = _check_width(capsys.readouterr().out, 80)
    assert lines[0] == "title"
    assert re.match(r"client\s+JCT mean\s+JCT p50\s+JCT p90\s+TTFT p50\s+cache hit$", lines[1])
    assert _row(lines, "agentrt / plain")[0].endswith("x")


# --- the figures: one colour per client, user text as written --------------------------


def _legend_colours(ax: Any) -> dict[str, str]:
    from matplotlib.colors import to_hex

    legend = ax.get_legend()
    labels = [t.get_text().split(" (median")[0] for t in legend.get_texts()]
    return {
        label: to_hex(h.get_color()) for label, h in zip(labels, legend.legend_handles, strict=True)
    }


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The figures the bench draws, kept (pyplot.close is where each one ends)."""
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        real_close(fig)


def _steady_result(clients: tuple[str, ...], modes: tuple[str, ...]) -> dict[str, Any]:
    rows = [
        {
            "kv": "ample",
            "mode": mode,
            "client": client,
            "throughput": 0.01 * (k + 1),
            "jct": {"p90": [100.0 + k, 90.0 + k, 110.0 + k]},
        }
        for mode in modes
        for client in clients
        for k in range(3)
    ]
    return {"rows": rows, "capacity": {}, "config": {"workload": "coding"}}


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="the figures need matplotlib")
def test_each_client_has_one_colour_in_every_figure(
    bench_result: Any, tmp_path: Path, figures: list[Any]
) -> None:
    """plain was grey in the bench's CDF and blue in the steady-state plot; agentrt
    (session routing) blue in the demo's figure, orange in the bench's, brown in the
    steady-state plot: the colour followed the client's place in the figure."""
    from dataclasses import replace

    from matplotlib.colors import to_hex

    from agentrt.bench._demo import demo_figure
    from agentrt.bench._output import client_styles, plot
    from agentrt.bench._steady import plot as steady_plot

    plain, session = bench_result.clients[0], bench_result.clients[2]
    assert session.client == "agentrt:session"
    plot(bench_result, tmp_path)
    demo_figure(replace(bench_result, clients=[plain, session]), tmp_path / "demo.png")
    steady_plot(_steady_result(("agentrt:session", "plain"), ("closed",)), tmp_path / "s.png")
    bench_fig, demo_fig, steady_fig = figures
    bench = _legend_colours(bench_fig.axes[0])
    demo = _legend_colours(demo_fig.axes[0])
    steady = {c.get_label(): to_hex(c.lines[0].get_color()) for c in steady_fig.axes[0].containers}
    grey, blue = to_hex("tab:gray"), to_hex("tab:blue")
    assert bench["plain"] == demo["plain"] == steady["plain"] == grey
    assert bench["agentrt:session"] == demo["agentrt"] == steady["agentrt:session"] == blue
    assert len(set(bench.values())) == 3  # no two clients of one figure alike
    # the demo's bars are the clients' colours too
    bars = [to_hex(p.get_facecolor()) for p in demo_fig.axes[1].patches]
    assert bars == [grey, blue]
    # a known client's style does not depend on the others in its figure (the steady-state
    # study's peers among them); an unknown one's is drawn from its name; none alike
    names = ["plain>llm-d", "agentrt:defaults", "plain>dynamo:affinity", "plain", "x"]
    alone = {n: client_styles([n])[0] for n in names}
    assert dict(zip(names, client_styles(names), strict=True)) == alone
    assert client_styles(["agentrt:mlfq@16"]) == client_styles(["agentrt:mlfq@16"])
    many = client_styles([*names, "agentrt:session", "agentrt:round-robin", "y", "z", "w"])
    assert len(set(many)) == len(many)


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="the figures need matplotlib")
def test_the_steady_state_plot_draws_only_the_modes_that_ran(
    tmp_path: Path, figures: list[Any]
) -> None:
    """Without --loads the study runs closed loop only: no empty open-loop panel."""
    from agentrt.bench._steady import plot as steady_plot

    steady_plot(_steady_result(("plain",), ("closed",)), tmp_path / "closed.png")
    steady_plot(_steady_result(("plain",), ("closed", "open")), tmp_path / "both.png")
    closed, both = figures
    assert [ax.get_title().split(", ")[-1] for ax in closed.axes] == ["closed loop (N agents)"]
    assert len(both.axes) == 2 and all(ax.containers for ax in both.axes)


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="the figures need matplotlib")
def test_client_names_with_dollar_signs_are_drawn_as_written(
    bench_result: Any, tmp_path: Path, figures: list[Any]
) -> None:
    """A client named by its settings file may hold "$": drawn as written, not as TeX."""
    from dataclasses import replace

    from agentrt.bench._output import plot

    odd = "agentrt:config=$HOME/a_$b.toml"
    clients = [bench_result.clients[0], replace(bench_result.clients[1], client=odd)]
    (path,) = plot(replace(bench_result, clients=clients), tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    legend = fig.axes[0].get_legend()
    texts = [t for t in legend.get_texts()]
    assert [t.get_text() for t in texts] == ["plain", odd]
    assert not any(t.get_parse_math() for t in texts)


def test_bench_prints_the_kv_view_only_when_asked(
    bench_result: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's KV view against the engines' is for who asks (--show-view); it is in
    results.json either way."""
    from dataclasses import replace

    from agentrt.bench._output import view_lines
    from agentrt.cli import _parser

    view = {
        "resident": {
            "estimate_mean": 62e3,
            "real_mean": 67e3,
            "mae": 13e3,
            "rel_error": 0.2,
            "correlation": 0.79,
        },
        "over": {"client": 0.19, "engine": 0.22, "false_over": 0.12, "missed_over": 0.14},
        "capacity": {"assumed_mean": 84e3, "assumed_min": 31e3, "real": 426e3, "sources": {}},
    }
    clients = [bench_result.clients[0], replace(bench_result.clients[2], kv_view=view)]
    result = replace(bench_result, clients=clients)
    monkeypatch.setenv("COLUMNS", "80")
    quiet: list[str] = []
    print_table(result, "agentrt bench: coding", echo=quiet.append)
    asked: list[str] = []
    print_table(result, "agentrt bench: coding", echo=asked.append, view=True)
    assert asked[: len(quiet)] == quiet
    shown = " ".join(" ".join(asked[len(quiet) :]).split())
    assert "KV cache against the engines'" in shown
    assert "62k tokens per replica on average, against 67k really cached" in shown
    assert "where each holds 426k" in shown
    assert not any("KV" in line or "MAE" in line or "r=" in line for line in quiet)
    assert view_lines(result, 80)[0].startswith("Each agentrt client's picture")
    assert _parser().parse_args(["bench", "--show-view"]).show_view
    assert not _parser().parse_args(["bench"]).show_view
