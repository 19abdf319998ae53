"""Microbenchmark of the client-side scheduler: decision cost, admission fast path, memory.

For each ordering policy, 10,000 calls from 1,000 jobs wait in the queue; one decision is
a push (a call arrives) plus a pop (a call is admitted), timed in batches, the queue
staying at 10,000. Then the cost of ``Admission.admit`` + ``release`` when the call is
admitted at once (no limit; a limit with room), and the memory a policy holds for 10,000
idle jobs it has seen (after ``classify`` and ``on_call_end``), measured with tracemalloc.

    python -m benchmarks cost scheduler --out results/scheduler_micro.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any

from agentrt.scheduling import Admission, FixedLimit, Policy, Ticket, make_policy

from ._harness import add_run_args, write_result

POLICIES = ("fcfs", "plas", "atlas", "mlfq", "edf")
DECISION_GOAL_US = 20.0
MEMORY_GOAL_MB = 100.0


def make_ticket(rng: random.Random, i: int, jobs: int) -> Ticket:
    job = rng.randrange(jobs)
    return Ticket(
        call_id=f"call-{i}",
        job_id=f"job-{job}",
        program_id=f"prog-{job % (jobs // 4 or 1)}",
        session_id=f"job-{job}/s{rng.randrange(4)}",
        parent_session_id=f"job-{job}/s0",
        tokens=int(2 ** rng.uniform(4, 15)),
        deadline_at=rng.uniform(0, 1000) if rng.random() < 0.5 else None,
    )


def warm_policy(policy: Policy, rng: random.Random, jobs: int) -> None:
    """Give the jobs a spread of attained service, so the queues use several levels."""
    for i in range(jobs * 2):
        t = make_ticket(rng, i, jobs)
        policy.classify(t, 0.0)
        policy.on_call_end(t, rng.expovariate(1 / 8.0), int(rng.expovariate(1 / 3000.0)))


def bench_decisions(
    name: str, queued: int, jobs: int, batches: int, batch: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    policy = make_policy(name)
    warm_policy(policy, rng, jobs)
    pool = [make_ticket(rng, i, jobs) for i in range(queued + batches * batch)]
    now = 0.0
    for t in pool[:queued]:
        policy.classify(t, now)
        policy.push(t, now)
        now += 1e-3
    spare = pool[queued:]
    per_decision_us = []
    classify_us = []
    gc.disable()
    try:
        for b in range(batches):
            arrivals = spare[b * batch : (b + 1) * batch]
            t0 = time.perf_counter_ns()
            for t in arrivals:
                policy.push(t, now)
                policy.pop(now)
                now += 1e-3
            t1 = time.perf_counter_ns()
            per_decision_us.append((t1 - t0) / batch / 1e3)
            t0 = time.perf_counter_ns()
            for t in arrivals:
                policy.classify(t, now)
            classify_us.append((time.perf_counter_ns() - t0) / batch / 1e3)
    finally:
        gc.enable()
    assert len(policy) == queued
    per_decision_us.sort()
    return {
        "policy": name,
        "queued": queued,
        "jobs": jobs,
        "decision_us_median": statistics.median(per_decision_us),
        "decision_us_p99": per_decision_us[int(0.99 * (len(per_decision_us) - 1))],
        "classify_us_median": statistics.median(classify_us),
    }


async def _admit_release(adm: Admission, tickets: list[Ticket], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for t in tickets:
            await adm.admit(t)
            adm.release(t, latency_s=0.5, tokens=100, ok=True)
        out.append((time.perf_counter_ns() - t0) / len(tickets) / 1e3)
    return out


def bench_fast_path(rounds: int, batch: int) -> list[dict[str, Any]]:
    rng = random.Random(1)
    tickets = [make_ticket(rng, i, 1000) for i in range(batch)]
    rows = []
    cases: list[tuple[str, Admission]] = [
        ("no limit", Admission(make_policy("plas"))),
        ("limit 64, room", Admission(make_policy("plas"), FixedLimit(64))),
        (
            "limit 64 + token budget, room",
            Admission(make_policy("plas"), FixedLimit(64), token_budget=10**9),
        ),
    ]
    for label, adm in cases:
        gc.disable()
        try:
            samples = asyncio.run(_admit_release(adm, tickets, rounds))
        finally:
            gc.enable()
        rows.append({"case": label, "admit_release_us_median": statistics.median(samples)})
    return rows


def bench_memory(name: str, jobs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    policy = make_policy(name)
    for j in range(jobs):
        for s in range(2):  # a root session and one sub-agent
            t = Ticket(
                call_id=f"c{j}-{s}",
                job_id=f"job-{j}",
                program_id=f"job-{j}",
                session_id=f"job-{j}/s{s}",
                parent_session_id=f"job-{j}/s0" if s else None,
                tokens=1000,
            )
            policy.classify(t, 0.0)
            policy.on_call_end(t, rng.uniform(0.1, 5.0), 1000)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    for j in range(jobs):
        policy.on_job_end(f"job-{j}", f"job-{j}")
    gc.collect()
    after_end = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del policy
    return {
        "policy": name,
        "idle_jobs": jobs,
        "held_mb": held / 2**20,
        "after_job_end_mb": after_end / 2**20,
    }


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--idle-jobs", type=int, default=10_000)
    add_run_args(parser, out="scheduler_micro.json", seed=0)


def main(args: argparse.Namespace) -> int:

    decisions = [
        bench_decisions(n, args.queued, args.jobs, args.batches, args.batch, args.seed)
        for n in POLICIES
    ]
    fast = bench_fast_path(rounds=200, batch=1000)
    memory = [bench_memory(n, args.idle_jobs, args.seed) for n in POLICIES]

    print(f"decision cost, {args.queued} calls queued from {args.jobs} jobs (push + pop):")
    print(f"  {'policy':8} {'median µs':>10} {'p99 µs':>8} {'classify µs':>12}")
    for r in decisions:
        print(
            f"  {r['policy']:8} {r['decision_us_median']:10.2f} {r['decision_us_p99']:8.2f} "
            f"{r['classify_us_median']:12.2f}"
        )
    print("admission fast path (admit + release, asyncio):")
    for f in fast:
        print(f"  {f['case']:32} {f['admit_release_us_median']:6.2f} µs")
    print(f"memory held for {args.idle_jobs} idle jobs (2 sessions each):")
    for m in memory:
        print(
            f"  {m['policy']:8} {m['held_mb']:7.2f} MB   "
            f"after on_job_end: {m['after_job_end_mb']:.3f} MB"
        )
    worst = max(r["decision_us_median"] for r in decisions)
    worst_mem = max(m["held_mb"] for m in memory)
    met = "met" if worst < DECISION_GOAL_US else "MISSED"
    met_mem = "met" if worst_mem < MEMORY_GOAL_MB else "MISSED"
    print(
        f"goals: decision < {DECISION_GOAL_US} µs: {met} (worst median {worst:.2f}); "
        f"memory < {MEMORY_GOAL_MB} MB: {met_mem} (worst {worst_mem:.2f})"
    )
    result = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "settings": vars(args) | {"out": str(args.out)},
        "decisions": decisions,
        "fast_path": fast,
        "memory": memory,
        "goals": {"decision_us": DECISION_GOAL_US, "memory_mb": MEMORY_GOAL_MB},
    }
    write_result(args.out, result, __doc__, indent=2)
    return 0
