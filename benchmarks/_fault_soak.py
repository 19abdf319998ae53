"""Healthy replicas must stay up: agent jobs with sub-agents against two sim servers.

A benchmark script, not a test. It starts two ``agentrt sim serve``
processes (one replica each, uvicorn on loopback, its default 5 s keep-alive), then runs
``--jobs`` agent jobs on trio and again on asyncio through one ``Runtime`` with both
replicas as its endpoints (its defaults otherwise: ``session_affinity``, 3 attempts).
Each job is a root session that makes a call, spawns ``--children`` sub-agent sessions
(``parent=``, ``blocks_parent=True``) that run at once, each making ``--turns`` calls
with a tool wait of 0 to ``--tool-max-s`` seconds before each later call (idle
connections around uvicorn's keep-alive expiry: the stale-connection race), half of
them streamed and half through ``rt.openai()``, then the root's last call
(``final=True``). ``--concurrency`` jobs run at once.

Counted per backend: the endpoints marked down (the health tracker's transitions, per
endpoint) and readmitted, the session moves (``JobReport.session_moves``, and the
``SessionMoved`` events by reason), the failed attempts (``AttemptFailed`` events, by
endpoint and error), the jobs that did not end ``ok``, and the requests resent at once
after a reused keep-alive connection turned out closed (``agentrt.transport`` DEBUG
lines; those are not failures), and the client's event-loop lag (a 0.1 s sleep's
overshoot: on a loaded machine a connect can time out in the client's own loop). With
healthy replicas the goal is zero down and zero moves off an unavailable replica
(``"unavailable"``); ``"retention"`` moves are the router's choice for a session idle
past its replica's likely cache retention (docs/routing.md, rule 0), not faults.

    python -m benchmarks faults            # results/fault_soak.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from openai import AsyncStream

import agentrt
from agentrt.telemetry import AttemptFailed, Event, SessionMoved

from ._harness import add_run_args, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MAX_TOKENS = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def sim_servers(n: int) -> Iterator[list[str]]:
    """``n`` ``agentrt sim serve`` processes of one replica each; their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(n):
            port = _free_port()
            cmd = [sys.executable, "-m", "agentrt", "sim", "serve", "--port", str(port)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=ROOT))
            urls.append(f"http://127.0.0.1:{port}/v1")
        for url, proc in zip(urls, procs, strict=True):
            port = int(url.split(":")[2].split("/")[0])
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"sim serve on {port} exited ({proc.returncode})")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sim serve on {port} did not start") from None
                    time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Tally:
    """What the runtime's events and logs said."""

    def __init__(self) -> None:
        self.failed: Counter[tuple[str, str]] = Counter()
        self.moves: Counter[str] = Counter()

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptFailed):
            kind = event.error.split(":")[0]
            self.failed[(event.endpoint, kind)] += 1
        elif isinstance(event, SessionMoved):
            self.moves[event.reason] += 1


class LogCount(logging.Handler):
    """Counts ``agentrt.transport`` DEBUG lines that say a stale connection was resent."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.resent = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "kept-alive connection" in record.getMessage():
            self.resent += 1


async def _turn(
    rt: agentrt.Runtime, s: Any, model: str, i: int, rng: random.Random, final: bool = False
) -> None:
    messages: Any = [{"role": "user", "content": f"step {i}: " + "context " * rng.randint(8, 64)}]
    stream = rng.random() < 0.5
    if rng.random() < 0.5 and not final:
        client = rt.openai()
        reply = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, stream=stream
        )
    else:
        reply = await s.chat(
            model=model, messages=messages, max_tokens=MAX_TOKENS, stream=stream, final=final
        )
    if isinstance(reply, AsyncStream):  # stream=True
        async for _ in reply:
            pass


async def _job(rt: agentrt.Runtime, args: argparse.Namespace, n: int, model: str) -> None:
    rng = random.Random(n)
    async with rt.job("soak") as job, job.session("root") as root:
        await _turn(rt, root, model, 0, rng)

        async def child(c: int) -> None:
            async with job.session(f"sub-{c}", parent=root, blocks_parent=True) as s:
                for t in range(args.turns):
                    if t:
                        wait = rng.uniform(0.0, args.tool_max_s)
                        async with s.tool("shell"):
                            await anyio.sleep(wait)
                    await _turn(rt, s, model, t, rng)

        async with anyio.create_task_group() as tg:
            for c in range(args.children):
                tg.start_soon(child, c)
        await _turn(rt, root, model, 1, rng, final=True)


async def run_backend(urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    logs = LogCount()
    log = logging.getLogger("agentrt.transport")
    log.addHandler(logs)
    log.setLevel(logging.DEBUG)
    limit = anyio.Semaphore(args.concurrency)
    errors: Counter[str] = Counter()
    t0 = time.monotonic()
    try:
        async with agentrt.Runtime(urls, otel=False, hooks=[tally], keep_reports=0) as rt:
            model = (await rt.openai().models.list()).data[0].id
            reports: list[agentrt.JobReport] = []

            async def one(n: int) -> None:
                async with limit:
                    try:
                        await _job(rt, args, n, model)
                    except Exception as exc:
                        errors[type(exc).__name__] += 1

            rt_hook = rt._core  # the health trackers' counters (no public accessor yet)
            lags: list[float] = []

            async def watch(scope: anyio.CancelScope) -> None:
                with scope:
                    while True:
                        t = time.monotonic()
                        await anyio.sleep(0.1)
                        lags.append(time.monotonic() - t - 0.1)

            watching = anyio.CancelScope()
            async with anyio.create_task_group() as outer:
                outer.start_soon(watch, watching)
                async with anyio.create_task_group() as tg:
                    for n in range(args.jobs):
                        tg.start_soon(one, n)
                watching.cancel()
            reports = rt.reports()
            health = {
                e.endpoint.url: {"downs": e.health.downs, "readmissions": e.health.readmissions}
                for e in rt_hook.endpoints
            }
    finally:
        log.removeHandler(logs)
        log.setLevel(logging.NOTSET)
    del reports
    failed: dict[str, dict[str, int]] = {}
    for (url, kind), count in sorted(tally.failed.items()):
        failed.setdefault(url, {})[kind] = count
    return {
        "jobs": args.jobs,
        "jobs_failed": dict(errors),
        "wall_s": round(time.monotonic() - t0, 1),
        "marked_down": sum(h["downs"] for h in health.values()),
        "readmissions": sum(h["readmissions"] for h in health.values()),
        "session_moves": sum(tally.moves.values()),
        "moves_by_reason": dict(tally.moves),
        "failed_attempts": sum(tally.failed.values()),
        "failed_attempts_by_endpoint": failed,
        "stale_connection_resends": logs.resent,
        "loop_lag_max_s": round(max(lags, default=0.0), 2),
        "loop_lag_p99_s": round(sorted(lags)[int(len(lags) * 0.99)] if lags else 0.0, 3),
        "health": health,
    }


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=500, help="jobs in flight")
    p.add_argument("--children", type=int, default=2, help="sub-agent sessions per job")
    p.add_argument("--turns", type=int, default=3, help="calls per sub-agent")
    p.add_argument("--tool-max-s", type=float, default=8.0, help="longest tool wait")
    p.add_argument("--backends", default="trio,asyncio")
    add_run_args(p, out="fault_soak.json")


def main(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {}
    with sim_servers(2) as urls:
        for backend in args.backends.split(","):
            results[backend] = anyio.run(run_backend, urls, args, backend=backend)
            print(backend, json.dumps(results[backend], indent=1), flush=True)
    out = {
        "benchmark": "fault_soak",
        "setup": {
            "replicas": "2 x agentrt sim serve (one replica each, uvicorn, keep-alive 5 s)",
            "jobs": args.jobs,
            "concurrency": args.concurrency,
            "children": args.children,
            "turns": args.turns,
            "tool_max_s": args.tool_max_s,
            "agentrt": agentrt.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "results": results,
    }
    write_result(args.out, out, __doc__, indent=2)
    print(f"wrote {args.out}")
    return 0
