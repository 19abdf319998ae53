"""Parallel replays: a study's replays on a process pool give the results of one by one."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt.bench import BenchConfig, BenchResult, run_bench, run_study
from agentrt.bench._parallel import default_workers, parse_workers
from agentrt.bench._runner import ALONE, ClientRun, prepare, run_parts
from agentrt.cli import main


def grid() -> list[BenchConfig]:
    """A small fixed-seed grid: two loads of one workload (the jobs are shared), a KV
    policy, stretch on and off, clients that route and queue differently."""
    return [
        BenchConfig(
            workload="react",
            jobs=6,
            rate=0.5,
            seed=7,
            replicas=2,
            clients=("plain", "agentrt:session", "agentrt:plas+round_robin@2"),
            api="http",
        ),
        BenchConfig(
            workload="react",
            jobs=6,
            rate=0.5,
            seed=7,
            replicas=2,
            clients=("agentrt:session,declare=oracle",),
            tool_wait_policy="pin",
            stretch=False,
            api="http",
        ),
        BenchConfig(
            workload="mixed",
            jobs=6,
            rate=2.0,
            seed=3,
            replicas=2,
            clients=("plain", "agentrt:mlfq@4"),
            api="http",
        ),
    ]


def comparable(result: BenchResult) -> dict[str, Any]:
    """Everything a result says except how long it took here."""
    out = dataclasses.asdict(result)
    assert out.pop("wall_s") >= 0
    return out


def test_pool_gives_the_results_of_one_by_one() -> None:
    one_by_one = run_study(grid(), workers=1)
    pooled = run_study(grid(), workers=2)
    assert [comparable(r) for r in pooled] == [comparable(r) for r in one_by_one]
    # The grid is not degenerate: its configurations differ, every job ran.
    first, second, third = one_by_one
    assert [c.client for c in first.clients] == [
        "plain",
        "agentrt:session",
        "agentrt:plas+round_robin@2",
    ]
    assert all(c.failed == 0 and c.jobs == 6 for r in one_by_one for c in r.clients)
    assert first.clients[0].stretch is not None and second.clients[0].stretch is None
    assert first.clients[1].jct != second.clients[0].jct
    assert third.calls != first.calls
    # A run's result does not depend on the study around it.
    alone = run_bench(grid()[1])
    assert comparable(alone) == comparable(second)


def test_run_bench_on_a_pool_matches_in_process() -> None:
    cfg = grid()[2]
    assert comparable(run_bench(cfg, workers=2)) == comparable(run_bench(cfg))


def test_run_parts_replays_a_grid_of_given_jobs() -> None:
    # The tuner's grid: jobs made by the caller (here: the first four of a workload),
    # one client per configuration, the solo runs once; pool and one by one agree.
    cfg, other = grid()[0], grid()[1]
    plans = prepare(cfg)[:4]
    parts = [(cfg, plans, ALONE), (cfg, plans, 1), (other, plans, 0)]
    got: dict[int, dict[int, object]] = {1: {}, 2: {}}
    for workers in (1, 2):
        run_parts(parts, lambda i, r, w=workers: got[w].__setitem__(i, r), workers=workers)
    assert set(got[1]) == set(got[2]) == {0, 1, 2}
    assert got[1][0] == got[2][0]  # each job's JCT alone
    for index in (1, 2):
        one, pooled = got[1][index], got[2][index]
        assert isinstance(one, ClientRun) and isinstance(pooled, ClientRun)
        assert len(one.results) == 4 and all(r.status == "ok" for r in one.results)
        assert without_session_ids(one) == without_session_ids(pooled)
    alone = got[1][0]
    assert isinstance(alone, dict) and sorted(alone) == sorted(p.name for p in plans)


def without_session_ids(run: ClientRun) -> dict[str, Any]:
    """A client's run but the session ids (random: drawn afresh by every runtime)."""
    out = dataclasses.asdict(run)
    for job in out["results"]:
        for item in job["calls"] + job["tools"]:
            item.pop("session_id")
    return out


def test_progress_counts_every_job_of_every_replay() -> None:
    seen: list[str] = []
    run_study(grid()[2:], workers=2, progress=seen.append)
    assert sorted(seen) == sorted(["alone"] * 6 + ["plain"] * 6 + ["agentrt:mlfq@4"] * 6)


def test_a_bad_configuration_fails_before_anything_runs_or_alone() -> None:
    bad = dataclasses.replace(grid()[2], clients=("fast",))
    with pytest.raises(ValueError, match="client"):
        run_study([grid()[1], bad], workers=2)
    good, error = run_study([grid()[1], bad], workers=2, return_exceptions=True)
    assert isinstance(error, ValueError) and "client" in str(error)
    assert isinstance(good, BenchResult) and good.clients[0].failed == 0
    with pytest.raises(ValueError, match="workers"):
        run_study(grid(), workers=0)
    with pytest.raises(ValueError, match="workers"):
        run_study(grid(), workers="many")  # type: ignore[arg-type]


def test_an_error_in_a_worker_reaches_the_caller() -> None:
    failing = dataclasses.replace(grid()[2], kv_sample_s=0.0)  # fails in its replays
    with pytest.raises(ValueError, match="kv_sample_s"):
        run_study([failing, grid()[1]], workers=2)
    error, good = run_study([failing, grid()[1]], workers=2, return_exceptions=True)
    assert isinstance(error, ValueError) and "kv_sample_s" in str(error)
    assert isinstance(good, BenchResult) and comparable(good) == comparable(run_bench(grid()[1]))


def test_journals_are_written_by_the_workers(tmp_path: Path) -> None:
    cfgs = grid()[:1]
    cfgs[0].journal_dir = tmp_path / "pool"
    (pooled,) = run_study(cfgs, workers=2)
    for c in pooled.clients:
        assert c.journal is not None
        lines = Path(c.journal).read_text().splitlines()
        assert len(lines) == 6 and all(json.loads(line) for line in lines)
    # Two configurations of one study must not append to the same journal.
    twice = [dataclasses.replace(cfgs[0]), dataclasses.replace(cfgs[0])]
    with pytest.raises(ValueError, match="journal"):
        run_study(twice, workers=2)


def test_parse_workers() -> None:
    assert parse_workers("3") == 3 and parse_workers("auto") == "auto"
    assert parse_workers("ray") == "ray"
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(ValueError, match="workers"):
            parse_workers(bad)
    assert default_workers() >= 1


@pytest.mark.anyio
async def test_a_study_runs_off_the_event_loop() -> None:
    # From async code: in a worker thread, the pool's processes started from there.
    cfgs = grid()[2:]
    pooled = await anyio.to_thread.run_sync(lambda: run_study(cfgs, workers=2))
    assert pooled[0].clients[0].failed == 0 and len(pooled[0].clients) == 2


def test_cli_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--workload", "react", "--jobs", "4", "--api", "http", "--no-plots"]
    assert main([*args, "--out", str(tmp_path / "a"), "--workers", "1"]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--workers", "2"]) == 0
    a, b = (json.loads((tmp_path / x / "results.json").read_text()) for x in "ab")
    for data in (a, b):
        data.pop("wall_s")
        data["config"].pop("journal_dir")
        for c in data["clients"]:
            c.pop("journal")
    assert a == b and [c["failed"] for c in a["clients"]] == [0, 0, 0]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--workers", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--workers" in err and "auto or ray" in err


def test_ray_missing_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as without the extra
    with pytest.raises(ModuleNotFoundError, match=r"ray extra: pip install '.*\[ray\]'"):
        run_study(grid()[1:2], workers="ray")
    argv = ["bench", "--jobs", "2", "--workers", "ray", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "[ray]'" in err and "ray extra" in err
