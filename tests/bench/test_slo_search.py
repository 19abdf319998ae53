"""Throughput at SLO (benchmarks/_slo.py, alternatives.py's search): the rate search, and
a small real run on the embedded cluster in virtual time (about 20 replays of 32 ReAct
jobs)."""

from __future__ import annotations

import functools
import importlib
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _bench() -> ModuleType:
    return importlib.import_module("benchmarks._slo")


def _search(bench: ModuleType, stretch: Any, **kw: Any) -> Any:
    search = bench.Search(**kw)
    while (rate := search.next_rate()) is not None:
        assert rate not in search.tried
        search.tried[rate] = stretch(rate)
    return search


@pytest.mark.parametrize("start", [0.01, 1.7, 300.0])
def test_the_search_brackets_then_narrows_to_the_slo(start: float) -> None:
    bench = _bench()

    def stretch(rate: float) -> float:  # crosses 2 at rate 2
        return 1 + rate**2 / 4

    search = _search(bench, stretch, start=start, tol=1.05, max_tries=20)
    lo, hi = search.bracket()
    assert stretch(lo) <= bench.SLO < stretch(hi)
    assert hi / lo <= 1.05
    assert lo <= search.rate() <= hi
    assert search.rate() == pytest.approx(2.0, rel=0.01)


def test_the_search_stops_at_its_limits() -> None:
    bench = _bench()
    never = _search(bench, lambda r: 1.5, start=1.0, ceiling=64.0)
    assert never.bracket() == (64.0, None) and never.rate() == 64.0
    always = _search(bench, lambda r: 9.0, start=1.0, floor=0.1)
    assert always.bracket() == (None, 0.125) and always.rate() == 0.0
    capped = _search(bench, lambda r: 1 + r**2 / 4, start=1e-3, max_tries=3)
    assert len(capped.tried) == 3 and capped.bracket()[1] is None


def test_a_failed_job_counts_as_an_infinite_stretch() -> None:
    bench = _bench()
    # a client's job rows (ClientResult.job_rows), as run_study gives them
    jobs = [{"name": f"j{i}", "jct_s": 2.0, "status": "ok"} for i in range(9)]
    jobs.append({"name": "j9", "jct_s": 1.0, "status": "error"})
    alone = {f"j{i}": 1.0 for i in range(10)}
    p50, p90 = bench.p90_stretch(jobs, alone)
    assert p50 == 2.0 and p90 == 2.0
    jobs[0] = {"name": "j0", "jct_s": 2.0, "status": "error"}
    assert bench.p90_stretch(jobs, alone)[1] == math.inf


@pytest.mark.timeout(600)  # ~15 s of CPU; far more wall time on a busy shared machine
def test_a_small_run_finds_each_rate_and_session_routing_sustains_plains() -> None:
    bench = _bench()
    # 32 ReAct jobs with short tool waits (0.2 s median) on 2 replicas of 1,200 KV
    # blocks each, so that a few dozen jobs load them.
    setup = bench.Setup(
        workloads={"react": {"jobs": 32, "start": 1.0}},
        clients=("plain", "agentrt:session", "agentrt:session+mlfq"),
        seeds=(0,),
        replicas=2,
        tool_wait_s=0.2,
        gpu_blocks=1200,
        tol=1.3,
        max_tries=5,
    )
    rounds: list[dict[str, Any]] = []
    result = bench.measure(setup, checkpoint=rounds.append)
    assert rounds and rounds[-1] == result
    runs = result["react"]["0"]
    for client, run in runs.items():
        tries = run["tries"]
        by_rate = {t["rate"]: t["p90_stretch"] for t in tries}
        lo, hi = run["lo"], run["hi"]
        # The rate found meets the SLO, and a higher rate tried misses it.
        assert lo is not None and hi is not None and lo < hi, client
        assert by_rate[lo] <= 2.0 < by_rate[hi], client
        assert lo <= run["rate"] <= hi, client
        assert all(s <= 2.0 for r, s in by_rate.items() if r < lo), client
        # Stretch grows with the rate (not strictly: p90 over 32 jobs is noisy).
        first, last = tries[0], tries[-1]
        assert first["p90_stretch"] <= 2.0 < last["p90_stretch"], client
        assert first["p50_stretch"] < last["p50_stretch"], client
    # Session routing keeps each conversation's prefix cached on one replica: at least
    # plain's rate (round-robin over the replicas).
    assert runs["agentrt:session"]["rate"] >= runs["plain"]["rate"]
    # Without a client-side cap nothing waits in agentrt's queue, so the ordering policy
    # has nothing to order: the same replays as fcfs.
    assert runs["agentrt:session+mlfq"]["tries"] == runs["agentrt:session"]["tries"]
