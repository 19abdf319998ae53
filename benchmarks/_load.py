"""Load and soak: many agent jobs of 3 calls through agentrt and through a bare openai client.

A benchmark script, not a test. It starts ``benchmarks/_echo_server.py`` (an
OpenAI-compatible server that answers every chat completion at once with a small fixed
reply) in another process, then drives it from this process with two clients, side by side
in alternating order (ABBA over ``--rounds``):

- ``openai``: a bare ``openai.AsyncOpenAI(base_url=..., max_retries=2)`` with its default
  HTTP stack; each job is 3 sequential ``chat.completions.create`` calls.
- ``agentrt``: ``agentrt.Runtime([url])`` with its defaults (3 attempts); each job is
  ``rt.job(...)`` with one session making 3 sequential ``session.chat`` calls.

At each in-flight count in ``--concurrency`` (jobs running at once; default 100, 500
and 2,000), ``--jobs-per-slot`` (default 1) x that many jobs run (at least
``--min-jobs``, 300), once with a healthy server and once with ``--fail-pct`` % of the
attempts answered 503 (both clients retry them). Reported per client: throughput
(calls/s), call latency p50/p99 (each call's wall time as its caller saw it, retries
included), client CPU per call (``process_time``; the server is another process), RSS
after the run, and the accounting: every job must end (ok or error), and for agentrt the
reports must count every call made (``lost`` is jobs without a report plus calls missing
from reports).

``--soak MINUTES`` instead runs agentrt alone at ``--soak-concurrency`` jobs in flight
(default 100) for that long, sampling RSS and open file descriptors every
``--sample-s`` seconds, and checks that they stay flat: after a warm-up (the first
``--warmup-fraction`` of the run), no sample above 1.1x the first post-warm-up sample.

    python -m benchmarks load load                       # results/load.json
    python -m benchmarks load load --soak 30             # results/load_soak.json
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import openai

import agentrt

from ._harness import add_run_args, quantile, run_record, write_result

HERE = Path(__file__).resolve().parent
MODEL = "bench"
MESSAGES: list[Any] = [{"role": "user", "content": "Say ok."}]


@contextmanager
def echo_server(fail_pct: float, impl: str) -> Iterator[str]:
    """The echo server in another process; yields its base URL."""
    cmd = [sys.executable, str(HERE / "_echo_server.py"), "--impl", impl]
    cmd += ["--fail-pct", str(fail_pct)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"the echo server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Tally:
    """One client's run: call latencies, failures, the jobs that ended."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.call_errors = 0
        self.jobs_ended = 0
        self.jobs_failed = 0
        self.unexpected: dict[str, int] = {}
        """Exceptions that escaped a job (none expected: a bug in the client or agentrt)."""


Job = Callable[[int, Tally], Awaitable[None]]


class Client:
    name = ""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def job(self, i: int, tally: Tally) -> None:
        raise NotImplementedError

    def accounting(self, jobs: int, tally: Tally) -> dict[str, Any]:
        return {}


class Bare(Client):
    name = "openai"

    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> Bare:
        self.client = openai.AsyncOpenAI(base_url=self.url, api_key="x", max_retries=2)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def job(self, i: int, tally: Tally) -> None:
        create = self.client.chat.completions.create
        failed = False
        for _ in range(3):
            t0 = time.perf_counter()
            try:
                await create(model=MODEL, messages=MESSAGES)
            except openai.OpenAIError:
                tally.call_errors += 1
                failed = True
            tally.latencies.append(time.perf_counter() - t0)
        tally.jobs_ended += 1
        tally.jobs_failed += failed


class Agentrt(Client):
    name = "agentrt"

    def __init__(self, url: str, max_connections: int | None = None) -> None:
        self.url = url
        self.reports: list[agentrt.JobReport] = []
        self.max_connections = max_connections

    async def __aenter__(self) -> Agentrt:
        transport = None
        if self.max_connections is not None:  # a pool capped like openai's default one
            try:  # the HTTP library Runtime runs on: httpx2 where installed
                mod = importlib.import_module("httpx2")
            except ImportError:
                mod = importlib.import_module("httpx")
            limits = mod.Limits(max_connections=self.max_connections, max_keepalive_connections=100)
            transport = mod.AsyncHTTPTransport(limits=limits)
        self.rt = agentrt.Runtime(
            [self.url],
            keep_reports=0,
            otel=False,
            on_job_end=self.reports.append,
            transport=transport,
        )
        await self.rt.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.rt.__aexit__(None, None, None)

    async def job(self, i: int, tally: Tally) -> None:
        failed = False
        try:
            async with self.rt.job("load") as job, job.session("agent") as s:
                for _ in range(3):
                    t0 = time.perf_counter()
                    try:
                        await s.chat(model=MODEL, messages=MESSAGES)
                    except (openai.OpenAIError, agentrt.AgentrtError):
                        tally.call_errors += 1
                        failed = True
                    tally.latencies.append(time.perf_counter() - t0)
        finally:
            tally.jobs_ended += 1
            tally.jobs_failed += failed

    def accounting(self, jobs: int, tally: Tally) -> dict[str, Any]:
        reports = self.reports[:]
        self.reports.clear()  # in place: the runtime holds this list's append
        calls = [c for r in reports for c in r.call_reports]
        reported_errors = sum(c.status != "ok" for c in calls)
        kinds: dict[str, int] = {}
        for c in calls:
            if c.status != "ok":
                kind = (c.error or "?").replace(self.url, "URL")[:90]
                kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "reports": len(reports),
            "reported_calls": len(calls),
            "reported_call_errors": reported_errors,
            "reported_attempts": sum(c.attempts for c in calls),
            "jobs_not_ok": sum(r.status != "ok" for r in reports),
            "lost": (jobs - len(reports)) + (3 * jobs - len(calls)),
            "errors_agree": reported_errors == tally.call_errors,
            "error_kinds": kinds,
        }


async def run_jobs(client: Client, jobs: int, concurrency: int) -> Tally:
    """``jobs`` jobs, ``concurrency`` of them in flight at any time."""
    tally = Tally()
    next_job = 0

    async def worker() -> None:
        nonlocal next_job
        while next_job < jobs:
            i = next_job
            next_job += 1
            try:
                await client.job(i, tally)
            except Exception as exc:
                name = type(exc).__name__
                tally.unexpected[name] = tally.unexpected.get(name, 0) + 1

    async with anyio.create_task_group() as tg:
        for _ in range(min(concurrency, jobs)):
            tg.start_soon(worker)
    return tally


async def measure(client: Client, jobs: int, concurrency: int) -> dict[str, Any]:
    gc.collect()
    cpu0, t0 = time.process_time(), time.perf_counter()
    tally = await run_jobs(client, jobs, concurrency)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    calls = len(tally.latencies)
    out = {
        "jobs": jobs,
        "jobs_ended": tally.jobs_ended,
        "jobs_failed": tally.jobs_failed,
        "calls": calls,
        "call_errors": tally.call_errors,
        "unexpected": tally.unexpected,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "p50_ms": 1e3 * quantile(tally.latencies, 0.5),
        "p99_ms": 1e3 * quantile(tally.latencies, 0.99),
        "cpu_us_per_call": 1e6 * cpu / calls,
        "rss_mb": rss_mb(),
    }
    out.update(client.accounting(jobs, tally))
    return out


async def compare(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    clients: list[Client] = [Bare(url), Agentrt(url, args.agentrt_max_connections)]
    if args.only:
        clients = [c for c in clients if c.name == args.only]
    async with AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(c)
        for c in clients:  # warm-up: connections, imports, caches
            c.accounting(200, await run_jobs(c, 200, 100))
        for concurrency in args.concurrency:
            jobs = max(args.min_jobs, args.jobs_per_slot * concurrency)
            runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in clients}
            for r in range(args.rounds):
                order = clients if r % 2 == 0 else clients[::-1]
                for c in order:
                    runs[c.name].append(await measure(c, jobs, concurrency))
            for name, results in runs.items():
                rows.append(
                    {
                        "client": name,
                        "fail_pct": args.fail_pct_now,
                        "concurrency": concurrency,
                        "calls_per_s": statistics.median(x["calls_per_s"] for x in results),
                        "p50_ms": statistics.median(x["p50_ms"] for x in results),
                        "p99_ms": statistics.median(x["p99_ms"] for x in results),
                        "cpu_us_per_call": statistics.median(x["cpu_us_per_call"] for x in results),
                        "rss_mb": max(x["rss_mb"] for x in results),
                        "runs": results,
                    }
                )
            if len(clients) == 2:
                bare, ours = rows[-2], rows[-1]
                ours["ratio_to_openai"] = ours["calls_per_s"] / bare["calls_per_s"]
            for row in rows[-len(clients) :]:
                print_row(row)
    return rows


def print_row(row: dict[str, Any]) -> None:
    runs = row["runs"]
    ended = all(x["jobs_ended"] == x["jobs"] and not x["unexpected"] for x in runs)
    lost = sum(x.get("lost", 0) for x in runs)
    errs = sum(x["call_errors"] for x in runs)
    ratio = row.get("ratio_to_openai")
    print(
        f"{row['client']:8} {row['fail_pct']:>4g}% {row['concurrency']:>5} "
        f"{row['calls_per_s']:>8.0f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} "
        f"{row['cpu_us_per_call']:>7.0f} {row['rss_mb']:>6.0f} "
        f"{'' if ratio is None else f'{ratio:.2f}':>5} {errs:>4} "
        f"{'yes' if ended and not lost else 'NO':>4}",
        flush=True,
    )


HEADER = (
    f"{'client':8} {'fail':>5} {'jobs':>5} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
    f"{'us/call':>7} {'RSS MB':>6} {'ratio':>5} {'errs':>4} {'all':>4}"
)


async def soak(args: argparse.Namespace, url: str) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
    client = Agentrt(url)
    end = time.monotonic() + 60 * args.soak
    t0 = time.monotonic()
    totals = {"jobs": 0, "jobs_ended": 0, "calls": 0, "call_errors": 0, "lost": 0}
    async with client:
        while time.monotonic() < end:
            jobs = args.soak_concurrency * 5
            tally = await run_jobs(client, jobs, args.soak_concurrency)
            acc = client.accounting(jobs, tally)
            totals["jobs"] += jobs
            totals["jobs_ended"] += tally.jobs_ended
            totals["calls"] += len(tally.latencies)
            totals["call_errors"] += tally.call_errors
            totals["lost"] += acc["lost"] + sum(tally.unexpected.values())
            now = time.monotonic() - t0
            if not samples or now - samples[-1]["t_s"] >= args.sample_s:
                samples.append({"t_s": now, "rss_mb": rss_mb(), "fds": open_fds()})
                s = samples[-1]
                print(
                    f"{s['t_s']:>7.0f} s  RSS {s['rss_mb']:6.1f} MB  fds {s['fds']:>5.0f}  "
                    f"calls {totals['calls']}",
                    flush=True,
                )
    warm = [s for s in samples if s["t_s"] >= args.warmup_fraction * 60 * args.soak]
    base = warm[0] if warm else samples[-1]
    rss_max = max(s["rss_mb"] for s in warm or samples)
    fds_max = max(s["fds"] for s in warm or samples)
    return {
        "minutes": (time.monotonic() - t0) / 60,
        "concurrency": args.soak_concurrency,
        "fail_pct": args.soak_fail_pct,
        "totals": totals,
        "rss_after_warmup_mb": base["rss_mb"],
        "rss_max_mb": rss_max,
        "rss_growth": rss_max / base["rss_mb"] - 1.0,
        "fds_after_warmup": base["fds"],
        "fds_max": fds_max,
        "flat": rss_max <= 1.1 * base["rss_mb"] and fds_max <= 1.1 * base["fds"],
        "samples": samples,
    }


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, nargs="+", default=[100, 500, 2000])
    p.add_argument("--jobs-per-slot", type=int, default=1)
    p.add_argument("--min-jobs", type=int, default=300)
    p.add_argument("--fail-pct", type=float, default=5.0)
    p.add_argument("--fail-only", action="store_true", help="only the run with failures")
    p.add_argument("--only", choices=("openai", "agentrt"), default=None)
    p.add_argument(
        "--agentrt-max-connections",
        type=int,
        default=None,
        help="give agentrt an HTTP transport with this connection cap (openai's is 1000)",
    )
    p.add_argument("--server", choices=("raw", "uvicorn"), default="raw")
    p.add_argument("--soak", type=float, default=None, metavar="MINUTES")
    p.add_argument("--soak-concurrency", type=int, default=100)
    p.add_argument("--soak-fail-pct", type=float, default=5.0)
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    add_run_args(p, out="", rounds=2)


def main(args: argparse.Namespace) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    meta = {
        "command": run_record("")["command"],
        "python": platform.python_version(),
        "openai": openai.__version__,
        "cpus": os.cpu_count(),
        "agentrt_from": str(Path(agentrt.__file__).parent),
        "load_avg_at_start": os.getloadavg(),
    }
    if args.soak is not None:
        with echo_server(args.soak_fail_pct, args.server) as url:
            result = {**meta, "soak": anyio.run(soak, args, url)}
        s = result["soak"]
        print(
            f"soak {s['minutes']:.1f} min at {s['concurrency']} jobs in flight: "
            f"RSS {s['rss_after_warmup_mb']:.1f} -> max {s['rss_max_mb']:.1f} MB "
            f"({100 * s['rss_growth']:+.1f}%), fds {s['fds_after_warmup']:.0f} -> max "
            f"{s['fds_max']:.0f}; lost {s['totals']['lost']}; "
            f"{'flat' if s['flat'] else 'NOT flat'}"
        )
        out = args.out or Path("results/load_soak.json")
    else:
        rows: list[dict[str, Any]] = []
        print(HEADER)
        for fail in (args.fail_pct,) if args.fail_only else (0.0, args.fail_pct):
            args.fail_pct_now = fail
            with echo_server(fail, args.server) as url:
                rows += anyio.run(compare, args, url)
        result = {**meta, "rows": rows}
        out = args.out or Path("results/load.json")
    write_result(out, result, __doc__)
    print(f"wrote {out}")
