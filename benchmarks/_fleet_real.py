"""Fleets for real: K OS processes on one set of replicas, in wall-clock time.

Each client runs as K worker processes (this file with ``--worker``), each with its own
client, all on the same replicas; the jobs are the same for every client: each worker
runs ``--jobs`` agent jobs, ``--concurrency`` at a time, each one session of ``--turns``
turns with a tool wait between turns (its context grows from a unique system prompt;
odd jobs give their session an id, as a job queue's worker that could hand the
conversation on would). The workers start together once all have imported.

- ``plain``: one bare ``openai.AsyncOpenAI`` per replica, round-robin over the replicas
  from a random start per process (as agentrt.bench's PlainDriver in a fleet).
- ``defaults``: ``agentrt.Runtime(urls)``, nothing else given.
- ``hash``: ``agentrt.Runtime(urls, routing="hash")``.

Engines: ``sim`` (default): ``agentrt sim serve --replicas 4`` (restarted for each
client, so that every client starts with cold caches); ``vllm``: two vLLM CPU replicas
(agentrt.testing.vllm_cpu, 64 blocks of 128 tokens each, one core each; every client's
prompts begin with its own tag, so no client reuses another's cache).

    python -m benchmarks fleet processes --fleet 8 16                 # results/fleet_real_sim.json
    python -m benchmarks fleet processes --engine vllm --jobs 2       # results/fleet_real_vllm.json

Reports per client: first turns and calls per replica, the share of prompt tokens served
from the prefix cache, sessions whose turns went to more than one replica, the load view
agentrt's runtimes reported, JCT mean/p50/p90 (nearest rank) and their ratios to plain's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from ._harness import ROOT, add_run_args, again, plain_clients, quantile, write_result

CLIENTS = ("plain", "defaults", "hash")
WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()
SIM_MODEL = "sim-llama-3.1-8b"
READY_TIMEOUT_S = 300.0

# Per engine: replicas, context words, words a turn, max_tokens, tool wait range (s).
SETTINGS: dict[str, dict[str, Any]] = {
    "sim": {"replicas": 4, "context": 2500, "turn_words": 80, "max_tokens": 48, "tool": (0.3, 1.2)},
    "vllm": {"replicas": 2, "context": 500, "turn_words": 40, "max_tokens": 8, "tool": (0.2, 0.6)},
}


# --- the worker process -----------------------------------------------------------------


def _plan(spec: dict[str, Any], job: int) -> dict[str, Any]:
    """Job ``job`` of worker ``spec["index"]``: the same for every client but its tag."""
    rng = random.Random(f"{spec['seed']}-{spec['index']}-{job}")
    low, high = spec["tool"]

    def text(words: int) -> str:
        return " ".join(rng.choices(WORDS, k=words))

    return {
        "system": f"{spec['client']} job {spec['index']}-{job}: " + text(spec["context"]),
        "turns": [text(spec["turn_words"]) for _ in range(spec["turns"])],
        "tools": [rng.uniform(low, high) for _ in range(spec["turns"] - 1)],
        "session_id": f"fleet-{spec['index']}-{job}" if job % 2 else None,
    }


Chat = Callable[[list[Any]], Awaitable[Any]]
Tool = Callable[[float], contextlib.AbstractAsyncContextManager[Any]]


async def _conversation(plan: dict[str, Any], chat: Chat, tool: Tool) -> None:
    import anyio

    messages: list[Any] = [{"role": "system", "content": plan["system"]}]
    for turn, content in enumerate(plan["turns"]):
        if turn:
            wait = plan["tools"][turn - 1]
            async with tool(wait):
                await anyio.sleep(wait)
        messages.append({"role": "user", "content": content})
        reply = await chat(messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def _cached(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", None) or 0)


@contextlib.asynccontextmanager
async def _no_tool(_: float) -> AsyncIterator[None]:
    yield


async def _plain_jobs(spec: dict[str, Any], run: Callable[..., Awaitable[None]]) -> dict[str, int]:
    import httpx

    urls = spec["urls"]
    start = random.Random(os.urandom(8)).randrange(len(urls))
    order = itertools.cycle([(start + i) % len(urls) for i in range(len(urls))])
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        clients = plain_clients(urls, http)

        async def job(plan: dict[str, Any]) -> dict[str, Any]:
            calls: list[list[int]] = []

            async def chat(messages: list[Any]) -> Any:
                i = next(order)
                reply = await clients[i].chat.completions.create(
                    model=spec["model"], messages=messages, **spec["call"]
                )
                calls.append([i, reply.usage.prompt_tokens, _cached(reply.usage)])
                return reply

            await _conversation(plan, chat, _no_tool)
            return {"calls": calls}

        await run(job)
    return {}  # a plain client has no notion of a session's move


async def _agentrt_jobs(
    spec: dict[str, Any], run: Callable[..., Awaitable[None]]
) -> dict[str, int]:
    import agentrt
    from agentrt.telemetry import Event, SessionMoved

    urls = spec["urls"]
    options: dict[str, Any] = {"routing": "hash"} if spec["client"] == "hash" else {}
    moves: dict[str, int] = {}  # sessions moved, by reason

    def on_event(event: Event) -> None:
        if isinstance(event, SessionMoved):
            moves[event.reason] = moves.get(event.reason, 0) + 1

    async with agentrt.Runtime(urls, hooks=[on_event], **options) as rt:

        async def job(plan: dict[str, Any]) -> dict[str, Any]:
            async with rt.job("fleet") as j, j.session(session_id=plan["session_id"]) as s:

                async def chat(messages: list[Any]) -> Any:
                    return await s.chat(model=spec["model"], messages=messages, **spec["call"])

                def tool(wait: float) -> contextlib.AbstractAsyncContextManager[Any]:
                    return s.tool("tool", expected_s=wait)

                await _conversation(plan, chat, tool)
            report = j.report
            calls = [
                [urls.index(c.endpoint), c.prompt_tokens or 0, c.cached_tokens or 0]
                for c in report.call_reports
            ]
            return {"calls": calls, "load_view": (report.runtime or {}).get("load_view")}

        await run(job)
    return moves


async def _worker(spec: dict[str, Any]) -> None:
    import anyio

    folder, k = Path(spec["folder"]), spec["index"]
    results: list[dict[str, Any]] = []

    async def run(job: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> None:
        (folder / f"ready-{k}").touch()
        go = folder / "go"
        for _ in range(int(READY_TIMEOUT_S / 0.02)):  # the others are still importing
            if go.exists():
                break
            await anyio.sleep(0.02)

        async def lane(first: int) -> None:
            for j in range(first, spec["jobs"], spec["concurrency"]):
                t0 = time.monotonic()
                out = await job(_plan(spec, j))
                results.append({**out, "job": j, "jct_s": time.monotonic() - t0})

        async with anyio.create_task_group() as tg:
            for lane_index in range(min(spec["concurrency"], spec["jobs"])):
                tg.start_soon(lane, lane_index)

    jobs = _plain_jobs if spec["client"] == "plain" else _agentrt_jobs
    moves = await jobs(spec, run)
    (folder / f"out-{k}.json").write_text(json.dumps({"jobs": results, "moves": moves}))


# --- the orchestrator -------------------------------------------------------------------


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return int(resp.status)
    except OSError:
        return 0


@contextlib.contextmanager
def _sim_serve(replicas: int, log: Path) -> Iterator[list[str]]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "agentrt", "sim", "serve"]
    command += [f"--replicas={replicas}", f"--port={port}"]
    origin = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _get(f"{origin}/replica-{replicas - 1}/health") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sim serve did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield [f"{origin}/replica-{i}/v1" for i in range(replicas)]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def run_client(
    client: str, urls: list[str], model: str, fleet: int, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run one client as ``fleet`` processes: every job's result, with its worker, and
    the sessions agentrt moved, by reason."""
    settings = SETTINGS[args.engine]
    call: dict[str, Any] = {"max_tokens": settings["max_tokens"]}
    if args.engine == "vllm":
        call["extra_body"] = {"ignore_eos": True}  # a random-weight model stops early
    with tempfile.TemporaryDirectory(prefix="fleet-real-") as tmp:
        folder = Path(tmp)
        procs = []
        for k in range(fleet):
            spec = {
                "client": client,
                "urls": urls,
                "model": model,
                "index": k,
                "folder": tmp,
                "jobs": args.jobs,
                "concurrency": args.concurrency,
                "turns": args.turns,
                "seed": args.seed,
                "context": settings["context"],
                "turn_words": settings["turn_words"],
                "tool": settings["tool"],
                "call": call,
            }
            path = folder / f"spec-{k}.json"
            path.write_text(json.dumps(spec))
            log = (folder / f"worker-{k}.log").open("wb")
            command = again("--worker", str(path))
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
            log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all((folder / f"ready-{k}").exists() for k in range(fleet)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        (folder / "go").touch()
        jobs: list[dict[str, Any]] = []
        moves: dict[str, int] = {}
        for k, proc in enumerate(procs):
            if proc.wait() != 0:
                tail = (folder / f"worker-{k}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{client} worker {k} exited with {proc.returncode}:\n{tail}")
            out = json.loads((folder / f"out-{k}.json").read_text())
            jobs += [{**r, "worker": k} for r in out["jobs"]]
            for reason, n in out["moves"].items():
                moves[reason] = moves.get(reason, 0) + n
    return jobs, moves


def summarize(
    client: str, jobs: list[dict[str, Any]], moves: dict[str, int], replicas: int, wall_s: float
) -> dict[str, Any]:
    first = [0] * replicas
    calls = [0] * replicas
    prompt = cached = moved = 0
    for job in jobs:
        first[job["calls"][0][0]] += 1
        moved += len({c[0] for c in job["calls"]}) > 1
        for replica, p, c in job["calls"]:
            calls[replica] += 1
            prompt += p
            cached += c
    jct = [job["jct_s"] for job in jobs]
    return {
        "client": client,
        "jobs": len(jobs),
        "first_turns": first,
        "calls": calls,
        "cache_hit_rate": cached / prompt if prompt else None,
        "sessions_on_several_replicas": moved,
        "moves": moves,
        "load_views": sorted({str(job.get("load_view")) for job in jobs if "load_view" in job}),
        "jct": {
            "mean": statistics.fmean(jct),
            "p50": quantile(jct, 0.5),
            "p90": quantile(jct, 0.9),
        },
        "wall_s": wall_s,
    }


def _table(fleet: int, rows: list[dict[str, Any]]) -> None:
    plain = next((r for r in rows if r["client"] == "plain"), None)
    print(f"\nK={fleet}")
    head = f"{'client':9} {'first turns':16} {'calls':20} {'cache':>6} {'moved':>5} "
    print(head + f"{'view':8} {'JCT mean':>8} {'p50':>6} {'p90':>6} {'x mean':>6} {'x p50':>6}")
    for r in rows:
        j = r["jct"]
        ratio = ratio50 = ""
        if plain is not None:
            r["vs_plain"] = {k: j[k] / plain["jct"][k] for k in ("mean", "p50", "p90")}
            ratio, ratio50 = f"{r['vs_plain']['mean']:.2f}", f"{r['vs_plain']['p50']:.2f}"
        print(
            f"{r['client']:9} {'/'.join(map(str, r['first_turns'])):16} "
            f"{'/'.join(map(str, r['calls'])):20} {r['cache_hit_rate']:>6.1%} "
            f"{r['sessions_on_several_replicas']:>5} {','.join(r['load_views']) or '-':8} "
            f"{j['mean']:>8.2f} {j['p50']:>6.2f} {j['p90']:>6.2f} {ratio:>6} {ratio50:>6}"
        )
    for r in rows:
        if r["moves"]:
            print(f"  {r['client']}: sessions moved by agentrt, by reason: {r['moves']}")


@contextlib.contextmanager
def _vllm(replicas: int) -> Iterator[tuple[list[str], str]]:
    from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaSpec, find_engine, launch

    engine = find_engine()
    if engine is None:
        raise SystemExit(SETUP_MESSAGE)
    specs = [
        ReplicaSpec(name=f"fleet-{i}", num_gpu_blocks=64, kv_cache_space_gib=1, cpu_bind=str(i))
        for i in range(replicas)
    ]
    with launch(specs, engine=engine, ready_timeout=READY_TIMEOUT_S) as running:
        yield [r.base_url for r in running], running[0].model


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=tuple(SETTINGS), default="sim")
    parser.add_argument("--fleet", type=int, nargs="+", default=[8], help="processes (K)")
    parser.add_argument("--jobs", type=int, default=6, help="jobs per process")
    parser.add_argument("--concurrency", type=int, default=2, help="jobs at once per process")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument(
        "--clients",
        nargs="+",
        choices=CLIENTS,
        default=list(CLIENTS),
        metavar="CLIENT",
        help=f"of {', '.join(CLIENTS)} (default: all)",
    )
    add_run_args(parser, out="", seed=0)


def main(args: argparse.Namespace) -> int:
    if args.worker is not None:
        import anyio

        anyio.run(_worker, json.loads(args.worker.read_text()))
        return 0
    replicas = SETTINGS[args.engine]["replicas"]
    out = args.out or Path(f"results/fleet_real_{args.engine}.json")
    results: dict[str, Any] = {
        "engine": args.engine,
        "replicas": replicas,
        "settings": SETTINGS[args.engine],
        "jobs_per_process": args.jobs,
        "concurrency": args.concurrency,
        "turns": args.turns,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "runs": {},
    }
    with contextlib.ExitStack() as stack:
        if args.engine == "vllm":
            urls, model = stack.enter_context(_vllm(replicas))
        for fleet in args.fleet:
            rows = []
            for client in args.clients:
                with contextlib.ExitStack() as per_client:
                    if args.engine == "sim":
                        log = Path(tempfile.gettempdir()) / "fleet_real_sim.log"
                        urls, model = per_client.enter_context(_sim_serve(replicas, log)), SIM_MODEL
                    t0 = time.monotonic()
                    jobs, moves = run_client(client, urls, model, fleet, args)
                    rows.append(summarize(client, jobs, moves, replicas, time.monotonic() - t0))
            _table(fleet, rows)
            results["runs"][str(fleet)] = rows
    write_result(out, results, __doc__, indent=2)
    print(f"wrote {out}")
    return 0
