"""Does the default concurrency cap (``concurrency="engine"``) help or hurt?

One embedded replica (``h100-8b`` with an 8-sequence batch, so a queue forms), a mixed
workload of short and long agent jobs (tool waits between turns) arriving as a Poisson
process, replayed in virtual time (trio's MockClock) for each client configuration on a
fresh replica: no cap (``None``), the adaptive default (``"engine"``, polling the
replica's ``/metrics`` every 0.5 s), and a fixed cap of 4, each with ``fcfs`` and
``mlfq``. Prints JCT p50 / p90 / mean and the short jobs' mean, as ratios to
``fcfs`` with no cap in the same run, and writes them to a JSON file.

    .venv/bin/python benchmarks/adaptive_cap.py --out results/adaptive_cap.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import trio
from _harness import write_result
from trio.testing import MockClock

from agentrt import Runtime
from agentrt.sim import PRESETS, Cluster

CONFIGS: list[tuple[str, Any]] = [
    ("fcfs", None),
    ("fcfs", "engine"),
    ("mlfq", None),
    ("mlfq", "engine"),
    ("mlfq", 4),
]


def plan(seed: int, jobs: int, rate: float) -> list[tuple[float, bool, list[tuple[int, float]]]]:
    """Per job: arrival, short?, and per turn (output tokens, tool wait after)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(jobs):
        t += rng.expovariate(rate)
        short = rng.random() < 0.8
        turns = rng.randint(2, 4) if short else rng.randint(10, 20)
        tokens = (30, 80) if short else (200, 400)
        out.append(
            (
                t,
                short,
                [(rng.randint(*tokens), rng.uniform(0.5, 3.0)) for _ in range(turns)],
            )
        )
    return out


async def replay(jobs: list[Any], policy: str, concurrency: Any) -> dict[str, Any]:
    engine = PRESETS["h100-8b"].replace(max_num_seqs=8)
    jct: list[tuple[bool, float]] = []
    async with Cluster(1, engine) as cluster:
        async with Runtime(
            cluster.base_urls,
            transport=cluster.transport(),
            policy=policy,
            concurrency=concurrency,
            poll_metrics_s=0.5,
            otel=False,
        ) as rt:
            t0 = trio.current_time()

            async def job(i: int, at: float, short: bool, turns: list[tuple[int, float]]) -> None:
                await trio.sleep_until(t0 + at)
                async with rt.job(f"j{i}") as j, j.session() as s:
                    for n, (tokens, wait) in enumerate(turns):
                        words = "w " * (400 + 150 * n)
                        msg = [{"role": "user", "content": f"job {i} " + words}]
                        await s.chat(model="m", messages=msg, max_tokens=tokens)
                        async with s.tool("t"):
                            await trio.sleep(wait)
                jct.append((short, j.report.jct_s))

            async with trio.open_nursery() as nursery:
                for i, (at, short, turns) in enumerate(jobs):
                    nursery.start_soon(job, i, at, short, turns)
            queued = sum(a.queued_total for a in rt.admission_statistics())
    all_jct = sorted(x for _, x in jct)
    return {
        "p50": statistics.median(all_jct),
        "p90": all_jct[int(0.9 * (len(all_jct) - 1))],
        "mean": statistics.fmean(all_jct),
        "short_mean": statistics.fmean(x for s, x in jct if s),
        "queued": queued,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=150)
    ap.add_argument("--rates", default="0.6,1.2", help="jobs per second, comma-separated")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/adaptive_cap.json"))
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for rate in (float(r) for r in args.rates.split(",")):
        for seed in range(args.seeds):
            jobs = plan(seed, args.jobs, rate)
            base: dict[str, Any] | None = None
            for policy, conc in CONFIGS:
                res = trio.run(replay, jobs, policy, conc, clock=MockClock(autojump_threshold=0))
                base = base or res
                row = {"rate": rate, "seed": seed, "policy": policy, "concurrency": conc, **res}
                for k in ("p50", "p90", "mean", "short_mean"):
                    row[f"{k}_x"] = res[k] / base[k]
                rows.append(row)
                print(
                    f"rate {rate:4.2f} seed {seed} {policy}@{conc!s:<6} "
                    f"p50 {res['p50']:7.1f} ({row['p50_x']:.2f}x) "
                    f"p90 {res['p90']:7.1f} ({row['p90_x']:.2f}x) "
                    f"mean {row['mean_x']:.2f}x short {row['short_mean_x']:.2f}x "
                    f"queued {res['queued']}",
                    flush=True,
                )
    print(f"wall {time.perf_counter() - started:.0f} s")
    write_result(args.out, rows, __doc__)


if __name__ == "__main__":
    main()
