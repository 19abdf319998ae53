"""Parallel replays: a 4-configuration study one by one, then on the process pool.

The study is four KV policies (lru, pin, offload, drop) on the ``react-longtail`` workload
(2 replicas with their KV cut as in benchmarks/kv_policy.py, one agentrt client each, no
solo runs): four independent replays. Each round runs the study with ``workers=1`` (one
by one in this process) and with ``--workers`` (default: one per core) side by side, and
checks that both give the same results. Per run: wall time, CPU time (this process and its
finished workers) and the load average before and after (the machine may be shared). Each
round starts with a control: a pure CPU loop run twice one after the other, then twice side
by side on two spawned processes: the parallelism this machine gives the study right now
(on a machine shared with other sessions, Linux shares the cores between sessions, and a
pool gets no more than its session's share).

    .venv/bin/python benchmarks/parallel_study.py          # results/parallel_study.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from agentrt.bench import BenchConfig, BenchResult, Workers, run_study
from agentrt.bench._parallel import default_workers, parse_workers

POLICIES = ("lru", "pin", "offload", "drop")


def study(jobs: int) -> list[BenchConfig]:
    return [
        BenchConfig(
            workload="react-longtail",
            jobs=jobs,
            rate=0.4,
            replicas=2,
            clients=("agentrt:session",),
            stretch=False,
            api="http",
            tool_wait_policy=policy,
            gpu_blocks=8192,
            host_blocks=4 * 8192,
        )
        for policy in POLICIES
    ]


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's, once joined
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def burn(n: int) -> float:
    """A pure CPU loop; returns its CPU seconds."""
    start = time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    return time.process_time() - start


def control(n: int) -> dict[str, float]:
    """The loop twice one after the other, then twice side by side: their wall ratio."""
    wall0 = time.perf_counter()
    burn(n), burn(n)
    one_by_one = time.perf_counter() - wall0
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        pool.submit(burn, 1).result()  # the workers started before the clock
        pool.submit(burn, 1).result()
        wall0 = time.perf_counter()
        list(pool.map(burn, [n, n]))
        side_by_side = time.perf_counter() - wall0
    return {
        "one_by_one_s": one_by_one,
        "side_by_side_s": side_by_side,
        "speedup": one_by_one / side_by_side,
    }


def measure(jobs: int, workers: Workers) -> tuple[dict[str, Any], list[BenchResult]]:
    load0 = os.getloadavg()[0]
    wall0, cpu0 = time.perf_counter(), _cpu()
    results = run_study(study(jobs), workers=workers)
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    row = {
        "workers": workers,
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }
    return row, results


def _same(a: list[BenchResult], b: list[BenchResult]) -> bool:
    def strip(r: BenchResult) -> dict[str, Any]:
        out = dataclasses.asdict(r)
        out.pop("wall_s")
        return out

    return [strip(r) for r in a] == [strip(r) for r in b]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=120, help="jobs per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="side-by-side rounds")
    parser.add_argument(
        "--workers", type=parse_workers, default="auto", help="the pool: auto, N or ray"
    )
    parser.add_argument(
        "--loop", type=int, default=20_000_000, help="iterations of the control's CPU loop"
    )
    parser.add_argument("--out", type=Path, default=Path("results/parallel_study.json"))
    args = parser.parse_args()
    pool: Workers = default_workers() if args.workers == "auto" else args.workers
    print(f"{len(POLICIES)} configurations of {args.jobs} jobs; pool: {pool} workers; ", end="")
    print(f"{default_workers()} cores")
    rows: list[dict[str, Any]] = []
    controls: list[dict[str, float]] = []
    for i in range(args.rounds):
        # Alternate the order, so neither side always runs first.
        order: list[Workers] = [1, pool] if i % 2 == 0 else [pool, 1]
        check = control(args.loop)
        controls.append(check)
        print(
            f"  round {i} control: two CPU loops {check['one_by_one_s']:.1f} s one after "
            f"the other, {check['side_by_side_s']:.1f} s side by side: "
            f"{check['speedup']:.2f}x"
        )
        got: dict[str, list[BenchResult]] = {}
        for workers in order:
            row, results = measure(args.jobs, workers)
            row["round"] = i
            rows.append(row)
            got[str(workers)] = results
            print(
                f"  round {i} workers={workers!s:>4}: {row['wall_s']:6.1f} s wall, "
                f"{row['cpu_s']:6.1f} s CPU, load {row['load_before']:.1f} -> "
                f"{row['load_after']:.1f}"
            )
        one, many = got["1"], got[str(pool)]
        if not _same(one, many):
            print("  DIFFERENT RESULTS: the pool must give the results of one by one")
            return 1
    calls = sum(r.calls for r in one)
    seq = [r["wall_s"] for r in rows if r["workers"] == 1]
    par = [r["wall_s"] for r in rows if r["workers"] != 1]
    ratios = [s / p for s, p in zip(seq, par, strict=True)]
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    summary = {
        "autogroup": autogroup.read_text().strip() == "1" if autogroup.exists() else None,
        "configurations": len(POLICIES),
        "jobs": args.jobs,
        "calls": calls,
        "workers": pool,
        "cores": default_workers(),
        "wall_one_by_one_median_s": statistics.median(seq),
        "wall_pool_median_s": statistics.median(par),
        "speedup_median": statistics.median(ratios),
        "control_speedup_median": statistics.median(c["speedup"] for c in controls),
        "identical": True,
    }
    print(
        f"{calls} calls in all; median wall: one by one {summary['wall_one_by_one_median_s']:.1f}"
        f" s, pool {summary['wall_pool_median_s']:.1f} s: {summary['speedup_median']:.2f}x "
        f"faster (control: {summary['control_speedup_median']:.2f}x); results identical"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"summary": summary, "runs": rows, "controls": controls}, indent=1)
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
