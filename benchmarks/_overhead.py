"""agentrt's per-call overhead against a plain ``openai.AsyncOpenAI`` on one loopback server.

A benchmark script, not a test. It starts ``benchmarks/_echo_server.py`` (an
OpenAI-compatible server that answers every chat completion at once with a fixed small
reply, usage included) in a subprocess on a free 127.0.0.1 port, then drives it from this
process with several clients:

- ``openai``: ``openai.AsyncOpenAI(base_url=..., api_key="x", max_retries=0)``, its default
  HTTP stack. The baseline every ratio is computed against.
- ``openai+httpx``: the same over a legacy ``httpx.AsyncClient`` (the stack agentrt uses
  under openai 2.x, and used under 3.x before it moved to httpx2). When agentrt runs on
  legacy httpx, the difference to this client is agentrt's own cost; the run reports
  which library agentrt uses (``agentrt_http_lib``).
- ``agentrt.chat``: ``await session.chat(...)`` inside ``rt.job(...)``/``job.session()``.
- ``agentrt.openai``: ``rt.openai().chat.completions.create(...)`` inside a session.
- ``openai+hdr-v1`` / ``openai+hdr-v2`` (diagnostic, not run by default): the baseline
  client sending, as fixed default headers, what agentrt's generic dialect sends on a
  session's later call: protocol version 1's ten ``x-agentrt-*`` headers, or version 2's
  one ``x-agentrt`` header. Their difference to ``openai`` is what carrying the metadata
  costs the HTTP stacks on both ends (writing, parsing), with none of agentrt's own work.

Each agentrt client has its own Runtime (its own connection pool, like the plain clients)
and opens one job with one session per ``--calls-per-job`` calls; the job's setup and
report are in the CPU and block-wall figures (not in the per-call latency).

Concurrency 1: ``--calls`` sequential calls per client, run in blocks of ``--block`` calls,
the clients alternating block by block (ABBA order) so that drift cancels. Reported: the
median per-call wall latency, the added wall time in % (difference of the medians, and
the median over block pairs), and the client process's CPU time per call
(``time.process_time``; the server is another process). This phase runs before any
concurrent call, with one connection per pool: HTTP pools check every pooled connection
on every request, so a pool left full by a burst makes sequential calls dearer for its
keep-alive time. ``--after-burst`` measures that state on purpose (a burst before each
block, unmeasured).

Concurrency N (``--concurrency``, default 64): after a concurrent warm-up,
``--concurrent-calls`` calls per client and round, spread over N tasks, ``--rounds``
rounds alternating the clients. Reported: throughput (calls/s, median over rounds) and CPU
per call, and their ratios.

    python -m benchmarks cost overhead                  # writes results/overhead.json
    python -m benchmarks cost overhead --server raw     # bare asyncio echo server
    python -m benchmarks cost overhead --prompt-kb 64   # a 64 KiB history per call

By default the client is pinned to one CPU and the server to another (when there are at
least two), so that they do not fight over one core. A failed call is counted and skipped
(reported as an incident), not fatal. ``--profile DIR`` also writes a cProfile of each
client's calls at concurrency 1 and N to ``DIR/<client>-c<n>.pstats``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import openai

import agentrt

from ._harness import add_run_args, commit, interleaved, quantile, run_record, write_result

HERE = Path(__file__).resolve().parent
REQUEST: dict[str, Any] = {
    "model": "bench",
    "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Say ok."},
    ],
    "max_tokens": 16,
}


def make_request(prompt_kb: int) -> dict[str, Any]:
    """The call every client makes; ``prompt_kb`` > 0 adds a conversation history of about
    that many KiB (agent prompts are often tens of KiB, and agentrt reads the body)."""
    if prompt_kb <= 0:
        return REQUEST
    turns = 10
    words = max(1, prompt_kb * 1024 // turns // 5)
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "word " * words}
        for i in range(turns)
    ]
    messages = [REQUEST["messages"][0], *history, REQUEST["messages"][1]]
    return {**REQUEST, "messages": messages}


BASELINE = "openai"
LEGACY = "openai+httpx"
ALL_CLIENTS = ("openai", "openai+httpx", "agentrt.chat", "agentrt.openai")
_IDS = {"job": "job-5f0c2a9e1d7b4c38", "session": "ses-0b9e4d2c7a1f3e56"}
HEADER_CLIENTS: dict[str, dict[str, str]] = {
    "openai+hdr-v1": {
        "x-agentrt-version": "1",
        "x-agentrt-call-id": "call-9d3b7e1a0c5f2468",
        "x-agentrt-job-id": _IDS["job"],
        "x-agentrt-session-id": _IDS["session"],
        "x-agentrt-program-id": _IDS["job"],
        "x-agentrt-turn": "7",
        "x-agentrt-first-turn": "0",
        "x-agentrt-service-s": "0.008",
        "x-agentrt-service-tokens": "1505",
        "x-agentrt-idle-s": "0.001",
    },
    "openai+hdr-v2": {
        "x-agentrt": f'v=2, job="{_IDS["job"]}", session="{_IDS["session"]}", '
        'call="call-9d3b7e1a0c5f2468", turn=7, svc-s=0.008, svc-tok=1505, idle=0.001'
    },
}
"""Diagnostic clients: the baseline with agentrt's metadata headers (v1 or v2) fixed."""
WALL_GOAL_PCT = 3.0
CPU_GOAL_US = 100.0

# -- the server ----------------------------------------------------------------------------


@contextmanager
def echo_server(impl: str, cpu: int | None) -> Iterator[str]:
    """Start the echo server in a subprocess; yield its base URL; stop it."""
    cmd = [sys.executable, str(HERE / "_echo_server.py"), "--impl", impl]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the echo server did not start (said {line!r})")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the clients ---------------------------------------------------------------------------


MAX_ERRORS = 20


class Client:
    """One way of making calls. ``run`` makes ``n`` sequential calls, noting latencies.

    A failed call (e.g. a connection reset on a loaded machine) is counted in ``errors``
    and skipped rather than ending the run; more than ``MAX_ERRORS`` end it. agentrt
    retries such failures itself (plain clients run with ``max_retries=0``); its retries
    are counted in ``retries``.
    """

    name: str

    def __init__(self, name: str) -> None:
        self.name = name
        self.request: dict[str, Any] = REQUEST
        self.errors: list[str] = []

    async def run(self, n: int, latencies: list[int] | None) -> None:
        raise NotImplementedError

    @property
    def retries(self) -> int:
        """Retried attempts (agentrt's own retry layer; plain clients have none)."""
        return 0

    def reset_counts(self) -> None:
        self.errors.clear()

    async def _timed(
        self, call: Callable[[], Awaitable[Any]], n: int, latencies: list[int] | None
    ) -> None:
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            try:
                await call()
            except (openai.APIError, agentrt.AgentrtError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) > MAX_ERRORS:
                    raise
                continue
            if latencies is not None:
                latencies.append(clock() - t0)


class PlainOpenAI(Client):
    def __init__(self, name: str, client: openai.AsyncOpenAI) -> None:
        super().__init__(name)
        self._create = client.chat.completions.create

    async def run(self, n: int, latencies: list[int] | None) -> None:
        create = self._create
        request = self.request

        async def call() -> Any:
            return await create(**request)

        await self._timed(call, n, latencies)


class RetryCounter:
    """``on_job_end`` hook: counts the retried attempts in finished jobs."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, report: agentrt.JobReport) -> None:
        self.count += report.retries


class AgentrtClient(Client):
    def __init__(
        self,
        name: str,
        rt: agentrt.Runtime,
        per_job: int,
        via_openai: bool,
        retries: RetryCounter | None = None,
    ) -> None:
        super().__init__(name)
        self._retries = retries or RetryCounter()
        self._rt = rt
        self._per_job = per_job
        self._create = rt.openai().chat.completions.create if via_openai else None

    async def run(self, n: int, latencies: list[int] | None) -> None:
        done = 0
        while done < n:
            k = min(self._per_job, n - done)
            async with self._rt.job("bench") as job, job.session() as session:
                await self._timed(self._caller(session), k, latencies)
            done += k

    @property
    def retries(self) -> int:
        return self._retries.count

    def reset_counts(self) -> None:
        super().reset_counts()
        self._retries.count = 0

    def _caller(self, session: agentrt.Session) -> Callable[[], Awaitable[Any]]:
        create = self._create
        request = self.request
        if create is None:
            chat = session.chat
            return lambda: chat(**request)
        return lambda: create(**request)


async def check(client: Client) -> None:
    """One call, checked: the reply parses and (agentrt) the job report counts it."""
    if isinstance(client, AgentrtClient):
        async with client._rt.job("check") as job, job.session() as session:
            if client._create is None:
                reply: Any = await session.chat(**client.request)
            else:
                reply = await client._create(**client.request)
        report = job.report
        if report.calls != 1 or report.prompt_tokens != 12 or report.cached_tokens != 8:
            raise RuntimeError(f"{client.name}: unexpected job report {report!r}")
    else:
        assert isinstance(client, PlainOpenAI)
        reply = await client._create(**client.request)
    if reply.choices[0].message.content != "ok" or reply.usage.prompt_tokens != 12:
        raise RuntimeError(f"{client.name}: unexpected reply {reply!r}")


# -- measurement ---------------------------------------------------------------------------


@dataclass
class Tally:
    calls: int = 0
    cpu_ns: int = 0
    wall_ns: int = 0
    latencies: list[int] = field(default_factory=list)
    block_medians: list[float] = field(default_factory=list)
    round_throughputs: list[float] = field(default_factory=list)


@contextmanager
def measured(tally: Tally, calls: int) -> Iterator[None]:
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    yield
    tally.cpu_ns += time.process_time_ns() - cpu0
    tally.wall_ns += time.perf_counter_ns() - wall0
    tally.calls += calls


async def run_concurrent(client: Client, calls: int, concurrency: int) -> None:
    base, extra = divmod(calls, concurrency)
    async with anyio.create_task_group() as tg:
        for i in range(concurrency):
            n = base + (1 if i < extra else 0)
            if n:
                tg.start_soon(client.run, n, None)


async def sequential(
    clients: Sequence[Client], calls: int, block: int, burst: int = 0
) -> dict[str, Tally]:
    """Blocks of sequential calls, clients alternating. ``burst`` > 0: before each block
    (unmeasured) the client makes ``4 * burst`` calls ``burst`` at a time, so that the
    block runs with ``burst`` idle connections in its pool."""
    tallies = {c.name: Tally() for c in clients}
    rounds = math.ceil(calls / block)
    for r, client in interleaved(rounds, clients, abba=True):
        n = min(block, calls - r * block)
        tally = tallies[client.name]
        if burst:
            await run_concurrent(client, 4 * burst, burst)
        lat: list[int] = []
        with measured(tally, n):
            await client.run(n, lat)
        tally.latencies += lat
        tally.block_medians.append(statistics.median(lat) if lat else math.nan)
    return tallies


async def concurrent(
    clients: Sequence[Client], calls: int, concurrency: int, rounds: int
) -> dict[str, Tally]:
    tallies = {c.name: Tally() for c in clients}
    for _, client in interleaved(rounds, clients, abba=True):
        tally = tallies[client.name]
        wall0 = tally.wall_ns
        with measured(tally, calls):
            await run_concurrent(client, calls, concurrency)
        tally.round_throughputs.append(calls / ((tally.wall_ns - wall0) / 1e9))
    return tallies


# -- summaries -----------------------------------------------------------------------------


def _us(ns: float) -> float:
    return round(ns / 1000.0, 1)


def summarize_sequential(tallies: dict[str, Tally], refs: Sequence[str]) -> dict[str, Any]:
    variants = {}
    for name, t in tallies.items():
        variants[name] = {
            "calls": t.calls,
            "median_us": _us(statistics.median(t.latencies)),
            "p90_us": _us(quantile(t.latencies, 0.90)),
            "p99_us": _us(quantile(t.latencies, 0.99)),
            "mean_block_us": _us(t.wall_ns / t.calls),
            "cpu_us_per_call": _us(t.cpu_ns / t.calls),
        }
    out: dict[str, Any] = {"variants": variants}
    for ref in refs:
        if ref in tallies:
            out[f"vs_{ref}"] = _versus_sequential(tallies, ref)
    return out


def _versus_sequential(tallies: dict[str, Tally], ref: str) -> dict[str, Any]:
    base = tallies[ref]
    base_med = statistics.median(base.latencies)
    versus = {}
    for name, t in tallies.items():
        if name == ref or (ref != BASELINE and not name.startswith("agentrt")):
            continue
        med = statistics.median(t.latencies)
        paired = [
            100.0 * (m - b) / b
            for m, b in zip(t.block_medians, base.block_medians, strict=True)
            if not (math.isnan(m) or math.isnan(b))
        ]
        versus[name] = {
            "wall_added_pct": round(100.0 * (med - base_med) / base_med, 2),
            "wall_added_us": _us(med - base_med),
            "wall_added_pct_per_block": {
                "median": round(statistics.median(paired), 2),
                "min": round(min(paired), 2),
                "max": round(max(paired), 2),
            },
            "mean_block_added_pct": round(
                100.0
                * (t.wall_ns / t.calls - base.wall_ns / base.calls)
                / (base.wall_ns / base.calls),
                2,
            ),
            "cpu_added_us": _us(t.cpu_ns / t.calls - base.cpu_ns / base.calls),
            "cpu_ratio": round((t.cpu_ns / t.calls) / (base.cpu_ns / base.calls), 3),
        }
    return versus


def summarize_concurrent(tallies: dict[str, Tally], refs: Sequence[str]) -> dict[str, Any]:
    variants = {}
    for name, t in tallies.items():
        variants[name] = {
            "calls": t.calls,
            "throughput_per_s": round(statistics.median(t.round_throughputs), 1),
            "throughput_per_round": [round(x, 1) for x in t.round_throughputs],
            "cpu_us_per_call": _us(t.cpu_ns / t.calls),
        }
    out: dict[str, Any] = {"variants": variants}
    for ref in refs:
        if ref in tallies:
            out[f"vs_{ref}"] = _versus_concurrent(tallies, ref)
    return out


def _versus_concurrent(tallies: dict[str, Tally], ref: str) -> dict[str, Any]:
    base = tallies[ref]
    base_tp = statistics.median(base.round_throughputs)
    base_cpu = base.cpu_ns / base.calls
    versus = {}
    for name, t in tallies.items():
        if name == ref or (ref != BASELINE and not name.startswith("agentrt")):
            continue
        versus[name] = {
            "throughput_ratio": round(statistics.median(t.round_throughputs) / base_tp, 3),
            "cpu_ratio": round((t.cpu_ns / t.calls) / base_cpu, 3),
            "cpu_added_us": _us(t.cpu_ns / t.calls - base_cpu),
        }
    return versus


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("agentrt", "openai", "httpx", "httpx2", "anyio", "uvicorn", "h11"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def print_tables(result: dict[str, Any], concurrency: int) -> None:
    seq = result["concurrency_1"]
    vs = seq[f"vs_{BASELINE}"]
    print("\nconcurrency 1 (per call; added = vs openai; paired = median over block pairs)")
    header = (
        f"{'client':<16}{'median µs':>10}{'p99 µs':>9}{'added wall':>12}{'(paired)':>10}"
        f"{'CPU µs':>9}{'added CPU µs':>14}"
    )
    print(header)
    for name, v in seq["variants"].items():
        added = vs.get(name)
        wall = f"{added['wall_added_pct']:+.1f} %" if added else "-"
        paired = f"{added['wall_added_pct_per_block']['median']:+.1f} %" if added else "-"
        cpu = f"{added['cpu_added_us']:+.1f}" if added else "-"
        print(
            f"{name:<16}{v['median_us']:>10.1f}{v['p99_us']:>9.1f}{wall:>12}{paired:>10}"
            f"{v['cpu_us_per_call']:>9.1f}{cpu:>14}"
        )
    con = result[f"concurrency_{concurrency}"]
    vs = con[f"vs_{BASELINE}"]
    print(f"\nconcurrency {concurrency} (throughput: median over rounds; ratios vs openai)")
    print(f"{'client':<16}{'calls/s':>10}{'ratio':>8}{'CPU µs':>9}{'CPU ratio':>11}")
    for name, v in con["variants"].items():
        added = vs.get(name)
        tp = f"{added['throughput_ratio']:.3f}" if added else "-"
        cr = f"{added['cpu_ratio']:.3f}" if added else "-"
        print(
            f"{name:<16}{v['throughput_per_s']:>10.0f}{tp:>8}{v['cpu_us_per_call']:>9.1f}{cr:>11}"
        )
    same_stack = result["same_stack_reference"]
    print(f"\nagentrt's HTTP library: {result['agentrt_http_lib']}", end="")
    if same_stack == BASELINE:
        print(" (openai's own stack: the added figures above are agentrt's own)")
    else:
        print(f"; agentrt's own share, vs {same_stack} (the same stack):")
    for key in ("concurrency_1", f"concurrency_{concurrency}"):
        if same_stack == BASELINE:
            break
        same = result[key].get(f"vs_{same_stack}", {})
        for name, v in same.items():
            parts = [f"CPU {v['cpu_added_us']:+.1f} µs/call"]
            if "wall_added_pct" in v:
                parts.insert(0, f"median wall {v['wall_added_pct']:+.1f} %")
            else:
                parts.insert(0, f"throughput x{v['throughput_ratio']:.3f}")
            print(f"  {key.replace('_', ' ')}, {name}: {', '.join(parts)}")
    for name, e in result["incidents"].items():
        print(
            f"\nWARNING: {name}: {e['failed_calls']} failed call(s), skipped, "
            f"{e['retries']} retried attempt(s); first errors: {e['first']}"
        )
    print("\ngoals (concurrency 1, vs openai):")
    for name, g in result["goals"].items():
        print(
            f"  {name:<16} added wall {g['wall_added_pct']:+.2f} % "
            f"({'met' if g['wall_met'] else 'NOT met'}, goal < {WALL_GOAL_PCT} %), "
            f"added CPU {g['cpu_added_us']:+.1f} µs "
            f"({'met' if g['cpu_met'] else 'NOT met'}, goal < {CPU_GOAL_US:.0f} µs)"
        )


# -- main ----------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    names: list[str] = args.clients
    if BASELINE not in names:
        names = [BASELINE, *names]
    agentrt_lib = "none"
    async with AsyncExitStack() as stack:
        clients: list[Client] = []
        for name in names:
            if name == "openai":
                oc = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
                await stack.enter_async_context(oc)
                clients.append(PlainOpenAI(name, oc))
            elif name in HEADER_CLIENTS:
                oc = openai.AsyncOpenAI(
                    base_url=base_url,
                    api_key="x",
                    max_retries=0,
                    default_headers=HEADER_CLIENTS[name],
                )
                await stack.enter_async_context(oc)
                clients.append(PlainOpenAI(name, oc))
            elif name == "openai+httpx":
                hc = httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
                    timeout=httpx.Timeout(600.0, connect=10.0),
                )
                # openai 3.x types http_client as httpx2's, and accepts legacy httpx.
                oc = openai.AsyncOpenAI(
                    base_url=base_url, api_key="x", max_retries=0, http_client=cast(Any, hc)
                )
                await stack.enter_async_context(oc)
                clients.append(PlainOpenAI(name, oc))
            else:
                # One Runtime (one connection pool) per client, like the plain clients.
                retries = RetryCounter()
                rt = agentrt.Runtime([base_url], on_job_end=retries)
                await stack.enter_async_context(rt)
                probe = rt.http_client()
                agentrt_lib = type(probe).__module__.split(".")[0]  # httpx2 or httpx
                await probe.aclose()  # leaves the runtime's transport open
                via_openai = name == "agentrt.openai"
                clients.append(AgentrtClient(name, rt, args.calls_per_job, via_openai, retries))

        request = make_request(args.prompt_kb)
        for client in clients:
            client.request = request
            await check(client)
        # Sequential warm-up and phase first: a burst would leave each pool holding
        # --concurrency idle connections for their keep-alive time (5 s), and the HTTP
        # pools scan every pooled connection on every request, which would dominate (and,
        # as the bursts age differently per client, skew) the concurrency-1 figures.
        # --after-burst measures that state on purpose, the same for every client.
        for client in clients:
            await client.run(args.warmup, None)
            client.reset_counts()
        gc.collect()
        print(f"concurrency 1: {args.calls} calls per client in blocks of {args.block} ...")
        burst = args.concurrency if args.after_burst else 0
        seq = await sequential(clients, args.calls, args.block, burst)
        # Concurrent warm-up: fill each pool, then the rounds.
        for client in clients:
            await run_concurrent(client, args.concurrency * 4, args.concurrency)
        gc.collect()
        print(
            f"concurrency {args.concurrency}: {args.concurrent_calls} calls per client "
            f"x {args.rounds} rounds ..."
        )
        con = await concurrent(clients, args.concurrent_calls, args.concurrency, args.rounds)

        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            n = args.profile_calls
            for client in clients:
                for concurrency in (1, args.concurrency):
                    profile = cProfile.Profile()
                    profile.enable()
                    await run_concurrent(client, n, concurrency)
                    profile.disable()
                    path = args.profile / f"{client.name}-c{concurrency}.pstats"
                    profile.dump_stats(path)
                    print(f"profile of {n} calls at concurrency {concurrency}: {path}")

    # The reference on agentrt's own HTTP stack: the difference to it is agentrt's own cost.
    same_stack = LEGACY if agentrt_lib == "httpx" else BASELINE
    refs = [BASELINE] if same_stack == BASELINE else [BASELINE, same_stack]
    result: dict[str, Any] = {
        "agentrt_http_lib": agentrt_lib,
        "same_stack_reference": same_stack,
        "concurrency_1": summarize_sequential(seq, refs),
        f"concurrency_{args.concurrency}": summarize_concurrent(con, refs),
    }
    goals = {}
    for name, v in result["concurrency_1"][f"vs_{BASELINE}"].items():
        if not name.startswith("agentrt"):
            continue
        goals[name] = {
            "wall_added_pct": v["wall_added_pct"],
            "wall_met": v["wall_added_pct"] < WALL_GOAL_PCT,
            "cpu_added_us": v["cpu_added_us"],
            "cpu_met": v["cpu_added_us"] < CPU_GOAL_US,
        }
    result["goals"] = goals
    result["incidents"] = {
        c.name: {"failed_calls": len(c.errors), "first": c.errors[:3], "retries": c.retries}
        for c in clients
        if c.errors or c.retries
    }
    return result


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=2000, help="sequential calls per client")
    p.add_argument("--block", type=int, default=100, help="sequential calls per block")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent tasks per client")
    p.add_argument("--concurrent-calls", type=int, default=5000, help="calls per client and round")
    p.add_argument("--calls-per-job", type=int, default=50, help="agentrt: calls per job")
    p.add_argument(
        "--prompt-kb", type=int, default=0, help="add a conversation history of this many KiB"
    )
    p.add_argument("--warmup", type=int, default=200, help="warm-up calls per client")
    p.add_argument(
        "--clients",
        nargs="+",
        choices=(*ALL_CLIENTS, *HEADER_CLIENTS),
        default=list(ALL_CLIENTS),
        metavar="CLIENT",
        help="clients to compare (openai, the baseline, is always included), of "
        f"{', '.join((*ALL_CLIENTS, *HEADER_CLIENTS))}",
    )
    p.add_argument("--server", choices=("uvicorn", "raw"), default="uvicorn")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin client and server to different CPUs (needs >= 2)",
    )
    p.add_argument(
        "--after-burst",
        action="store_true",
        help="precede each concurrency-1 block with a --concurrency burst (full, idle pools)",
    )
    add_run_args(p, out="overhead.json", rounds=3, rounds_help="rounds at --concurrency")
    p.add_argument("--profile", type=Path, default=None, help="write cProfiles to this dir")
    p.add_argument("--profile-calls", type=int, default=2000)


def main(args: argparse.Namespace) -> None:
    for name in ("calls", "block", "concurrency", "concurrent_calls", "rounds", "calls_per_job"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = args.pin and len(cpus) >= 2
    server_cpu = cpus[1] if pin else None
    if pin:
        os.sched_setaffinity(0, {cpus[0]})
    load_before = list(os.getloadavg())
    git = commit()
    with echo_server(args.server, server_cpu) as base_url:
        size = len(json.dumps(make_request(args.prompt_kb)))
        print(f"echo server ({args.server}) at {base_url}; client pinned: {pin}; body {size} B")
        result = anyio.run(bench, args, base_url, backend=args.backend)
    result = {
        "meta": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": run_record("")["command"],
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "pinned": pin,
            "loadavg_before": load_before,
            "loadavg_after": list(os.getloadavg()),
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
            "versions": _versions(),
            "git": git,
            "request_bytes": len(json.dumps(make_request(args.prompt_kb))),
        },
        **result,
    }
    print_tables(result, args.concurrency)
    write_result(args.out, result, __doc__, indent=2)
    print(f"\nwrote {args.out}")
