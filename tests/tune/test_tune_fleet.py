"""agentrt tune and fleets: the fleet size K comes from the journals' runtimes (those that
ran jobs at once, told apart by ``runtime_id``) or ``--fleet``; every candidate is
replayed as K runtimes, the jobs dealt as recorded; the header, the result and the file
say K and where it came from; old journals without ``runtime_id`` are one runtime."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agentrt.bench._fleet import assign_members
from agentrt.bench._plan import JobPlan
from agentrt.bench._runner import BenchConfig, ClientRun, PartResult, prepare
from agentrt.cli import main
from agentrt.sim import PRESETS
from agentrt.tune import _search, tune
from agentrt.tune._search import Setting, Twin
from agentrt.tune._workload import load, to_plans
from tests.tune._helpers import record_journal

K = 3
JOBS = 12


@pytest.fixture(scope="module")
def fleet_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A journal written by K runtimes (a bench fleet, jobs dealt by a hash of their
    name, so not round-robin)."""
    return record_journal(
        tmp_path_factory.mktemp("fleet"), "react", JOBS, fleet=K, fleet_assign="hash"
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _groups(names: list[str], members: list[int]) -> set[frozenset[str]]:
    """The jobs each member ran, as a set of groups (the members' numbers aside)."""
    by: dict[int, set[str]] = {}
    for name, m in zip(names, members, strict=True):
        by.setdefault(m, set()).add(name)
    return {frozenset(g) for g in by.values()}


def _recording(path: Path) -> set[frozenset[str]]:
    """Which jobs ran together on one member in the bench that wrote ``path``."""
    plans = prepare(BenchConfig(workload="react", jobs=JOBS, rate=0.5, seed=4))
    return _groups([p.name for p in plans], assign_members(plans, K, "hash"))


def _plans_of(journal: Path) -> list[JobPlan]:
    """The journal's jobs, each with the fleet member that ran it."""
    observed = load([journal])
    return to_plans(observed.reports, observed.runtimes)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[BenchConfig, list[JobPlan], PartResult]]:
    """Record every replay the twin makes (its config, jobs and result)."""
    seen: list[tuple[BenchConfig, list[JobPlan], PartResult]] = []
    real: Callable[[BenchConfig, list[JobPlan], int], PartResult] = _search.replay_part

    def spy(cfg: BenchConfig, plans: list[JobPlan], part: int) -> PartResult:
        result = real(cfg, plans, part)
        seen.append((cfg, plans, result))
        return result

    monkeypatch.setattr(_search, "replay_part", spy)
    return seen


def test_k_is_the_runtimes_that_wrote_the_journal(fleet_journal: Path) -> None:
    observed = load([fleet_journal])
    assert len(set(observed.runtimes)) == K and observed.fleet == K
    plans = to_plans(observed.reports, observed.runtimes)
    assert {p.worker for p in plans} == set(range(K))
    # Each plan's worker is the runtime that ran it: the bench's hash dealing, as groups.
    by_name = {f"{r.name}-{i}": r.metadata["plan"] for i, r in enumerate(observed.reports)}
    names = [by_name[p.name] for p in plans]
    assert _groups(names, [p.worker or 0 for p in plans]) == _recording(fleet_journal)
    # Without the runtimes (the old call): no workers, the same jobs at the same times.
    plain = to_plans(observed.reports)
    assert all(p.worker is None for p in plain)
    assert [p.arrival_s for p in plain] == pytest.approx([p.arrival_s for p in plans])


def test_one_journal_per_worker_is_the_same_fleet(fleet_journal: Path, tmp_path: Path) -> None:
    lines = _lines(fleet_journal)
    ids = sorted({line["runtime"]["runtime_id"] for line in lines})
    files = [
        _write(
            tmp_path / f"worker-{i}.jsonl", [x for x in lines if x["runtime"]["runtime_id"] == rid]
        )
        for i, rid in enumerate(ids)
    ]
    whole, split = load([fleet_journal]), load(files)
    assert split.fleet == K and len(split.reports) == len(whole.reports) == JOBS
    assert {r.job_id for r in split.reports} == {r.job_id for r in whole.reports}
    # Virtual time (a bench's started_at is the wall clock's): arrivals kept as recorded.
    arrivals = sorted(p.arrival_s for p in to_plans(split.reports, split.runtimes))
    assert arrivals == pytest.approx(sorted(p.arrival_s for p in to_plans(whole.reports)))


def _wall_clock(lines: list[dict[str, Any]], opened: datetime, rid: str) -> list[dict[str, Any]]:
    """The lines as a runtime ``rid`` opened at ``opened`` in wall-clock time wrote them."""
    out = []
    for line in lines:
        line = {**line, "runtime": {**line["runtime"], "runtime_id": rid}}
        line["started_at"] = (opened + timedelta(seconds=line["arrival_s"])).isoformat()
        out.append(line)
    return out


@pytest.mark.parametrize(("later_s", "fleet"), [(3600.0, 1), (5.0, 2)], ids=["restart", "two"])
def test_runtimes_one_after_another_are_one_process(
    tmp_path: Path, later_s: float, fleet: int
) -> None:
    """Two wall-clock journals: the second runtime opened an hour later (a restarted
    process: one member) or 5 s later (two processes at once); their arrivals on one
    clock either way."""
    lines = _lines(record_journal(tmp_path, "react", 4))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = _write(tmp_path / "day1.jsonl", _wall_clock(lines, t0, "aa"))
    second = _write(
        tmp_path / "day2.jsonl", _wall_clock(lines, t0 + timedelta(seconds=later_s), "bb")
    )
    observed = load([first, second])
    assert observed.fleet == fleet and len(set(observed.runtimes)) == 2
    plans = to_plans(observed.reports, observed.runtimes)
    base = sorted(float(x["arrival_s"]) for x in lines)
    want = sorted([t - base[0] for t in base] + [t - base[0] + later_s for t in base])
    assert sorted(p.arrival_s for p in plans) == pytest.approx(want, abs=1e-3)
    assert {p.worker for p in plans} == set(range(fleet))


@pytest.mark.parametrize("strip", ["runtime_id", "runtime"])
def test_old_journals_without_runtime_id_are_one_runtime_per_file(
    fleet_journal: Path, tmp_path: Path, strip: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _lines(fleet_journal)
    for line in lines:
        if strip == "runtime":
            line["runtime"] = None
        else:
            del line["runtime"]["runtime_id"]
    old = _write(tmp_path / "old.jsonl", lines)
    observed = load([old])
    assert observed.fleet == 1 and set(observed.runtimes) == {"file:0"}
    assert all(p.worker == 0 for p in to_plans(observed.reports, observed.runtimes))
    out = tmp_path / "tuned.toml"
    args = ["tune", str(old), "--out", str(out), "--sample", "4", "--seeds", "1"]
    assert main([*args, "--top", "1", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "fleet: 1 process, from the journal (the journal: 1 runtime)" in text
    assert "# chosen for a fleet of 1 process each running these settings" in out.read_text()


def test_the_twin_replays_every_setting_as_the_fleet(
    fleet_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = _plans_of(fleet_journal)
    seen = _spy(monkeypatch)
    twin = Twin(plans, PRESETS["h100-8b"], 2, JOBS, 1, fleet=K, fleet_assign="plan")
    twin.run([Setting(), Setting(routing="round_robin")], [(0, 1)])
    runs = [(cfg, jobs, r) for cfg, jobs, r in seen if isinstance(r, ClientRun)]
    assert len(runs) == 6  # two settings at three loads (and the jobs alone once)
    for cfg, jobs, run in runs:
        assert (cfg.fleet, cfg.fleet_assign) == (K, "plan")
        worker = {p.name: p.worker for p in jobs}
        # Each job ran on the member that ran it when recorded, all K of them busy.
        assert {r.name: r.worker for r in run.results} == worker
        assert {r.worker for r in run.results} == set(range(K))


def test_tune_records_the_fleet_and_its_source(
    fleet_journal: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = _spy(monkeypatch)
    out = tmp_path / "tuned.toml"
    result = tune([fleet_journal], sample=4, seeds=1, top=1, workers=1, echo=print)
    out.write_text(result.to_toml())
    text = capsys.readouterr().out
    assert (result.fleet, result.fleet_source) == (K, "journal")
    assert f"fleet: {K} processes, each with the settings, from the journal" in text
    assert f"(the journal: {K} runtimes); jobs dealt as recorded" in text
    fleets = {(c.fleet, c.fleet_assign) for c, _, r in seen if isinstance(r, ClientRun)}
    assert fleets == {(K, "plan")}
    comment = (
        f"# chosen for a fleet of {K} processes each running these settings (from the journal)"
    )
    assert comment in out.read_text().splitlines()
    tomllib.loads(out.read_text())

    # --fleet overrides it; the journal's dealing is for its own K: round-robin instead.
    seen.clear()
    args = ["tune", str(fleet_journal), "--out", str(out), "--sample", "4", "--seeds", "1"]
    assert main([*args, "--top", "1", "--workers", "1", "--fleet", "5"]) == 0
    text = capsys.readouterr().out
    assert "fleet: 5 processes, each with the settings, from --fleet" in text
    assert f"(the journal: {K} runtimes); jobs dealt round-robin by arrival" in text
    assert all(len(line) <= 80 for line in text.splitlines() if str(out) not in line)
    fleets = {(c.fleet, c.fleet_assign) for c, _, r in seen if isinstance(r, ClientRun)}
    assert fleets == {(5, "round_robin")}
    assert "# chosen for a fleet of 5 processes each running these settings (from --fleet)" in (
        out.read_text()
    )


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "--fleet must be positive, got 0"),
        ("-2", "--fleet must be positive"),
        ("two", "invalid int value: 'two'"),
        ("1.5", "invalid int value: '1.5'"),
    ],
)
def test_a_bad_fleet_is_one_line_before_any_replay(
    fleet_journal: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
    needle: str,
) -> None:
    seen = _spy(monkeypatch)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(fleet_journal), "--out", str(out), f"--fleet={value}"]
    if value.lstrip("-").isdigit():
        assert main(args) == 2
    else:  # argparse's (one line too)
        with pytest.raises(SystemExit, match="2"):
            main(args)
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not seen and not out.exists()


@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_tune_options_check_the_fleet(fleet_journal: Path, value: Any) -> None:
    with pytest.raises(ValueError, match="--fleet must be a whole number of processes >= 1"):
        tune(fleet_journal, fleet=value)


def test_plan_dealing_follows_each_jobs_worker() -> None:
    root = prepare(BenchConfig(workload="react", jobs=1))[0].root
    workers = [2, None, 0, 4, None]
    plans = [JobPlan(f"j{i}", "react", float(i), root, w) for i, w in enumerate(workers)]
    # Modulo the fleet; those without one round-robin by arrival among themselves.
    assert assign_members(plans, 3, "plan") == [2, 0, 0, 1, 1]


def test_two_twins_in_one_process_replay_their_own_jobs(
    fleet_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's jobs kept by key (one worker: the replays run here) are per twin."""
    plans = _plans_of(fleet_journal)
    seen = _spy(monkeypatch)
    engine = PRESETS["h100-8b"]
    for jobs in (plans[:2], plans[2:4]):
        seen.clear()
        Twin(jobs, engine, 2, 2, 1).run([Setting()], [(0, 1)])
        assert all({p.name for p in got} == {p.name for p in jobs} for _, got, _ in seen)
