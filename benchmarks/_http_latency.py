"""Per-call latency over HTTP against ``agentrt sim serve``: where a call's time goes.

Starts ``agentrt.sim.serve`` (2 ``h100-8b`` replicas) in a subprocess on a free loopback
port, then runs the same agent-like sessions through several clients, in interleaved
rounds (shuffled order per round) so that the machine's load drifts cancel:

- ``plain-rr``: a bare ``openai.AsyncOpenAI`` per replica, round-robin per call;
- ``plain-pin``: the same, each session pinned to one replica;
- ``agentrt-rr`` / ``agentrt-session``: ``rt.openai()`` inside ``rt.job``/``session``,
  dialect ``vllm``, routing round-robin / session affinity, tool waits declared (so the
  server gets a tool-start notice per wait);
- ``agentrt-rr-nonotice``: round-robin with nothing declared (no notices).

Each round: 8 concurrent sessions of 12 turns, a ~1,000-token system prompt shared by
all, a history growing by ~120 tokens a turn, 16 output tokens, a 10 ms tool wait after
each call. Clients and runtimes are built once, before a warm-up round. Per client: the
call latency's median and its ratio to ``plain-rr``; from the server's ``Server-Timing``
header, the median time the server's app spent on the call (``app``: request parsed to
reply ready, the modelled engine time included) and the median of each call's latency
minus its ``app`` (``outside``: HTTP both ways, uvicorn, the client's own work, and
waiting for a CPU); CPU time per call of the client process and of the server process.

    python -m benchmarks cost http            # ~2 min; results/http_latency.json
    python -m benchmarks cost http --pin      # server on CPU 1, client on CPU 0
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai

import agentrt

from ._harness import add_run_args, interleaved, plain_clients, quantile, write_result

SESSIONS = 8
TURNS = 12
TOOL_S = 0.01
OUTPUT_TOKENS = 16
MODEL = "sim-llama-3.1-8b"
SYSTEM = " ".join(f"sys{i:04d}" for i in range(800))

Record = tuple[float, float | None]
"""A call's latency (s) and its server ``app`` time (s) from ``Server-Timing``."""


def messages(run: str, sid: int, turn: int) -> list[dict[str, str]]:
    """Turn ``turn`` of session ``sid``: unique to ``run`` (a tag of fixed length, so that
    every client's prompts have the same size)."""
    history = " ".join(f"{run}s{sid}t{t}w{i:03d}" for t in range(turn + 1) for i in range(40))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": history}]


def app_seconds(headers: Mapping[str, str]) -> float | None:
    for part in headers.get("server-timing", "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == "app" and dur:
            return float(dur) / 1e3
    return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def call(client: openai.AsyncOpenAI, msgs: Any, out: list[Record]) -> None:
    start = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=OUTPUT_TOKENS
    )
    out.append((time.perf_counter() - start, app_seconds(raw.headers)))


async def run_plain(clients: list[openai.AsyncOpenAI], run: str, pin: bool) -> list[Record]:
    out: list[Record] = []
    turns = iter(range(10**9))
    prompts = [[messages(run, s, t) for t in range(TURNS)] for s in range(SESSIONS)]

    async def session(sid: int) -> None:
        for turn in range(TURNS):
            i = sid if pin else next(turns)
            await call(clients[i % len(clients)], prompts[sid][turn], out)
            await anyio.sleep(TOOL_S)

    async with anyio.create_task_group() as tg:
        for sid in range(SESSIONS):
            tg.start_soon(session, sid)
    return out


async def run_agentrt(
    rt: agentrt.Runtime, client: openai.AsyncOpenAI, run: str, declare: bool
) -> list[Record]:
    out: list[Record] = []
    prompts = [[messages(run, s, t) for t in range(TURNS)] for s in range(SESSIONS)]

    async def session(sid: int) -> None:
        async with rt.job(f"job-{sid}") as job, job.session("agent") as s:
            for turn in range(TURNS):
                await call(client, prompts[sid][turn], out)
                async with s.tool("tool", expected_s=TOOL_S if declare else None):
                    await anyio.sleep(TOOL_S)

    async with anyio.create_task_group() as tg:
        for sid in range(SESSIONS):
            tg.start_soon(session, sid)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, replicas: int, pin: bool) -> subprocess.Popen[bytes]:
    code = (
        "from agentrt.sim import serve; "
        f"serve({replicas}, '127.0.0.1', {port}, log_level='warning')"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if pin else None,
    )


async def wait_ready(origin: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(origin + "/")).status_code == 200:
                    return
            await anyio.sleep(0.05)
    raise RuntimeError("the server did not start")


async def measure(args: argparse.Namespace, server: subprocess.Popen[bytes], origin: str) -> Any:
    urls = [f"{origin}/replica-{i}/v1" for i in range(args.replicas)]
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=60)
        )
        plain = plain_clients(urls, http)
        rts = {}
        for routing, declare in (
            ("round_robin", True),
            ("session_affinity", True),
            ("round_robin", False),
        ):
            rt = await stack.enter_async_context(
                agentrt.Runtime(
                    urls, routing=routing, dialect="vllm", learn_waits=declare, keep_reports=0
                )
            )
            rts[(routing, declare)] = (rt, rt.openai())

        def agent(routing: str, declare: bool) -> Callable[[str], Awaitable[list[Record]]]:
            rt, client = rts[(routing, declare)]
            return lambda run: run_agentrt(rt, client, run, declare)

        clients: dict[str, Callable[[str], Awaitable[list[Record]]]] = {
            "plain-rr": lambda run: run_plain(plain, run, False),
            "plain-pin": lambda run: run_plain(plain, run, True),
            "agentrt-rr": agent("round_robin", True),
            "agentrt-session": agent("session_affinity", True),
            "agentrt-rr-nonotice": agent("round_robin", False),
        }
        names = list(clients)
        records: dict[str, list[Record]] = {n: [] for n in names}
        cpu = dict.fromkeys(names, 0.0)
        server_cpu = dict.fromkeys(names, 0.0)
        for n in names:  # warm-up: connections, learned tool waits
            await clients[n](f"w{names.index(n)}")
        ids = {n: i for i, n in enumerate(names)}  # run tags of one length: same prompt sizes
        for r, n in interleaved(args.rounds, names):
            c0, s0 = time.process_time(), cpu_seconds(server.pid)
            records[n] += await clients[n](f"r{r}c{ids[n]}")
            cpu[n] += time.process_time() - c0
            server_cpu[n] += cpu_seconds(server.pid) - s0
    base = quantile((lat for lat, _ in records["plain-rr"]), 0.5)
    rows = {}
    for n in clients:
        lats = [lat for lat, _ in records[n]]
        apps = [app for _, app in records[n] if app is not None]
        outside = [lat - app for lat, app in records[n] if app is not None]
        p50 = quantile(lats, 0.5)
        rows[n] = {
            "calls": len(lats),
            "p50_ms": p50 * 1e3,
            "ratio": p50 / base,
            "app_p50_ms": quantile(apps, 0.5) * 1e3,
            "outside_p50_ms": quantile(outside, 0.5) * 1e3,
            "client_cpu_ms_per_call": cpu[n] / len(lats) * 1e3,
            "server_cpu_ms_per_call": server_cpu[n] / len(lats) * 1e3,
        }
    return rows


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="default: %(default)s")
    parser.add_argument("--pin", action="store_true", help="server on CPU 1, client on CPU 0")
    add_run_args(parser, out="http_latency.json", rounds=4)


def main(args: argparse.Namespace) -> None:
    if args.pin:
        os.sched_setaffinity(0, {0})
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    server = start_server(port, args.replicas, args.pin)
    try:
        anyio.run(wait_ready, origin)
        rows = anyio.run(measure, args, server, origin)
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"{'client':20} {'calls':>5} {'p50 ms':>7} {'ratio':>6} {'app':>6} {'outside':>7} "
        f"{'CPU/call client':>15} {'server':>6}"
    )
    for n, r in rows.items():
        print(
            f"{n:20} {r['calls']:5d} {r['p50_ms']:7.1f} {r['ratio']:6.3f} "
            f"{r['app_p50_ms']:6.1f} {r['outside_p50_ms']:7.1f} "
            f"{r['client_cpu_ms_per_call']:15.2f} {r['server_cpu_ms_per_call']:6.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    doc = {"pin": args.pin, "rounds": args.rounds, "loadavg": load, "clients": rows}
    write_result(args.out, doc, __doc__, indent=2)
    print(f"load average {load[0]:.2f}; results: {args.out}")
