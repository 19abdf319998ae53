"""A fresh client's first burst: N calls at once, each the first its client sends.

A benchmark script, not a test. An ``openai.AsyncOpenAI`` client finds its platform tag
(its ``X-Stainless-OS`` header) in a worker thread on its first request, and again on
every request sent before that thread returns: N first calls at once make N thread hops,
40 at a time. agentrt finds the tag once per process and gives it to the clients it
builds (agentrt/_platform.py). Each variant runs in its own fresh process (the tag is
kept per process), in alternating order (ABC CBA ...), against an instant in-process
server (``httpx.MockTransport``), on asyncio:

- ``openai``: a bare ``openai.AsyncOpenAI`` (max_retries=0), N ``chat.completions.create``;
- ``agentrt``: a ``Runtime`` with its defaults, N jobs of one ``session.chat`` each;
- ``agentrt-unshared``: the same jobs and sessions, each call through an
  ``openai.AsyncOpenAI`` the caller built over ``rt.http_client()`` (agentrt's path, but
  a client agentrt did not build: it finds its tag itself, as agentrt's own clients did
  before agentrt shared it).

Reported per variant: the median over rounds of the calls' median and maximum latency
(each call's wall time as its caller saw it) and of the burst's wall time.

    python -m benchmarks load burst            # ~1 min; results/first_burst.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from typing import Any

import anyio
import httpx
import openai

import agentrt

from ._harness import ROOT, add_run_args, again, interleaved, quantile, write_result

VARIANTS = ("openai", "agentrt", "agentrt-unshared")
BODY: dict[str, Any] = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def _reply(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=BODY)


async def _burst(variant: str, n: int) -> dict[str, float]:
    latencies: list[float] = []
    transport = httpx.MockTransport(_reply)

    async def timed(call: Any) -> None:
        t = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    if variant == "openai":
        async with httpx.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(
                base_url="http://e/v1",
                api_key="x",
                http_client=http,  # type: ignore[arg-type,unused-ignore]
                max_retries=0,
            )
            create = client.chat.completions.create
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(timed, lambda: create(model="m", messages=MESSAGES))
    else:
        async with agentrt.Runtime(["http://e/v1"], transport=transport, otel=False) as rt:
            own = openai.AsyncOpenAI(
                base_url="http://e/v1",
                api_key="x",
                http_client=rt.http_client(),  # type: ignore[arg-type,unused-ignore]
                max_retries=0,
            )

            async def one() -> None:
                async with rt.job("burst") as job, job.session("s") as s:
                    if variant == "agentrt-unshared":  # the session's block: its turn
                        create = own.chat.completions.create
                        await timed(lambda: create(model="m", messages=MESSAGES))
                    else:
                        await timed(lambda: s.chat(model="m", messages=MESSAGES))

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(one)
    wall = time.perf_counter() - t0
    return {
        "p50_ms": quantile(latencies, 0.5) * 1e3,
        "max_ms": max(latencies) * 1e3,
        "wall_s": wall,
    }


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=1000, help="calls in the burst")
    add_run_args(parser, out="first_burst.json", rounds=3)
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.one:  # a child: one burst in this fresh process
        print(json.dumps(anyio.run(_burst, args.one, args.calls)))
        return
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _, variant in interleaved(args.rounds, VARIANTS, abba=True):
        cmd = again("--one", variant, "--calls", str(args.calls))
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        runs[variant].append(json.loads(out.strip().splitlines()[-1]))
    summary = {
        v: {k: statistics.median(x[k] for x in rs) for k in ("p50_ms", "max_ms", "wall_s")}
        for v, rs in runs.items()
    }
    print(f"{args.calls} first calls at once, median of {args.rounds} rounds (fresh processes)")
    print(f"{'client':<18}{'call p50 ms':>12}{'call max ms':>12}{'burst wall s':>14}")
    for v, s in summary.items():
        print(f"{v:<18}{s['p50_ms']:>12.1f}{s['max_ms']:>12.1f}{s['wall_s']:>14.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"calls": args.calls, "rounds": args.rounds, "openai": openai.__version__}
    write_result(args.out, {"config": meta, "summary": summary, "runs": runs}, __doc__, indent=2)
    print(f"results: {args.out}")
