"""What the metrics polls of a fleet cost: K runtimes polling 8 replicas (issue 24).

K Runtimes in one virtual-time loop, each running agent sessions (a call, a 2-8 s tool
wait, again) against 8 embedded replicas for 300 virtual seconds, under
``poll_metrics_s="auto"`` (the default), ``1.0`` (a fixed second) and ``None``. Counts
the ``GET /metrics`` each replica receives per second and the process CPU of the
replay (the replicas' model included, the same work in every mode).

    python benchmarks/fleet_polls.py            # K = 16 and 64; results/fleet_polls.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx

from agentrt import Runtime
from agentrt.bench._clock import VirtualTimeLoop
from agentrt.sim import PRESETS, Cluster

SECONDS = 300.0
REPLICAS = 8
MSG: Any = [{"role": "user", "content": "context " * 400}]


class Counting:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gets = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/metrics":
            self.gets += 1
        return await self.inner.handle_async_request(request)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        pass


async def _worker(rt: Runtime, rng: random.Random, end: float) -> None:
    while anyio.current_time() < end:
        async with rt.job("agent") as job, job.session() as s:
            for _ in range(rng.randint(3, 8)):
                await s.chat(model="sim-llama-3.1-8b", messages=MSG, max_tokens=64)
                async with s.tool("tool"):
                    await anyio.sleep(rng.uniform(2.0, 8.0))
        await anyio.sleep(rng.uniform(0.0, 10.0))  # the worker waits for its next job


async def _run(k: int, poll: float | str | None) -> dict[str, Any]:
    async with Cluster(REPLICAS, PRESETS["h100-8b"]) as cluster:
        counting = Counting(cluster.transport())
        rng = random.Random(k)
        cpu = time.process_time()
        t0 = anyio.current_time()
        runtimes = [
            Runtime(cluster.base_urls, transport=counting, poll_metrics_s=poll)  # type: ignore[arg-type]
            for _ in range(k)
        ]
        async with AsyncExitStack() as stack:
            for rt in runtimes:
                await stack.enter_async_context(rt)
            async with anyio.create_task_group() as tg:
                for rt in runtimes:
                    tg.start_soon(_worker, rt, random.Random(rng.random()), SECONDS)
        elapsed = anyio.current_time() - t0  # the last jobs end after SECONDS
        calls = sum(len(r.call_reports) for rt in runtimes for r in rt.reports())
        cpu = time.process_time() - cpu
    return {
        "fleet": k,
        "poll": poll,
        "gets_per_s_per_endpoint": counting.gets / elapsed / REPLICAS,
        "virtual_s": elapsed,
        "calls": calls,
        "cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", nargs="+", type=int, default=[16, 64])
    ap.add_argument("--out", type=Path, default=Path("results/fleet_polls.json"))
    args = ap.parse_args(argv)
    rows = []
    print(f"{'K':>3} {'poll':>6} {'GET/s/endpoint':>15} {'calls':>6} {'CPU s':>6}")
    for k in args.fleets:
        for poll in ("auto", 1.0, None):
            row = anyio.run(_run, k, poll, backend_options={"loop_factory": VirtualTimeLoop})
            rows.append(row)
            print(
                f"{k:>3} {poll!s:>6} {row['gets_per_s_per_endpoint']:>15.2f} "
                f"{row['calls']:>6} {row['cpu_s']:>6.1f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
