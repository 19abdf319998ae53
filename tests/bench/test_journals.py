"""Benchmark runs leave journals, for plain and agentrt clients alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.bench import BenchConfig, run_bench
from agentrt.bench._runner import journal_paths
from agentrt.cli import main
from agentrt.telemetry import JobReport, read_journal


@pytest.mark.parametrize("api", ["openai", "http"])
def test_a_bench_run_leaves_a_journal_per_client(tmp_path: Path, api: str) -> None:
    cfg = BenchConfig(
        workload="mixed",
        jobs=6,
        rate=1.0,
        seed=2,
        replicas=2,
        clients=("plain", "agentrt:session"),
        stretch=False,
        api=api,  # type: ignore[arg-type]
        journal_dir=tmp_path,
    )
    result = run_bench(cfg)
    assert [c.journal for c in result.clients] == [
        str(tmp_path / "journal-plain.jsonl"),
        str(tmp_path / "journal-agentrt_session.jsonl"),
    ]
    for client in result.clients:
        assert client.journal is not None
        reports = read_journal(client.journal)
        assert len(reports) == client.jobs == 6
        rows = {r["name"]: r for r in client.job_rows}
        # Jobs are named by kind; the plan's name is in the metadata.
        assert {r.metadata["plan"] for r in reports} == set(rows)
        for report in reports:
            row = rows[report.metadata["plan"]]
            assert report.status == "ok" and report.name == row["kind"]
            assert report.metadata["client"] == client.client
            assert report.jct_s == pytest.approx(row["jct_s"])
            assert report.calls == row["calls"] == len(report.call_reports)
            assert 0 < report.critical_llm_s <= report.jct_s + 1e-9
            assert report.llm_s >= report.critical_llm_s - 1e-9
            assert report.sessions >= 1
            assert all(c.endpoint for c in report.call_reports)
        assert sum(r.tool_waits for r in reports) > 0
        # Non-streamed replies carry usage; the embedded engine reports exact counts.
        assert sum(r.prompt_tokens for r in reports) > 0
    plain, agentrt = (read_journal(c.journal or "") for c in result.clients)

    # The same jobs, the same shape, whoever ran them.
    def shape(reports: list[JobReport]) -> dict[str, tuple[str, int, int, int]]:
        return {r.metadata["plan"]: (r.name, r.calls, r.tool_waits, r.sessions) for r in reports}

    assert shape(plain) == shape(agentrt)

    # A second run replaces the journals (they do not accumulate).
    run_bench(cfg)
    assert all(len(read_journal(c.journal or "")) == 6 for c in result.clients)


def test_journal_names_are_safe_and_distinct(tmp_path: Path) -> None:
    cfg = BenchConfig(
        clients=("agentrt:plas+round_robin@auto", "agentrt:plas+round_robin@auto", "plain"),
        journal_dir=tmp_path,
    )
    assert [p.name if p else None for p in journal_paths(cfg)] == [
        "journal-agentrt_plas_round_robin_auto.jsonl",
        "journal-agentrt_plas_round_robin_auto-2.jsonl",
        "journal-plain.jsonl",
    ]
    assert journal_paths(BenchConfig()) == [None, None, None]


def test_cli_bench_writes_journals_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--workload", "react", "--jobs", "2", "--replicas", "1", "--no-plots"]
    args += ["--no-stretch", "--client", "plain", "--client", "agentrt:session"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "journals: " in capsys.readouterr().out
    for name in ("journal-plain.jsonl", "journal-agentrt_session.jsonl"):
        assert len(read_journal(tmp_path / "a" / name)) == 2
    assert main([*args, "--out", str(tmp_path / "b"), "--no-journal"]) == 0
    assert not list((tmp_path / "b").glob("journal-*"))
