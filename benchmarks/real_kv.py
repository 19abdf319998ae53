"""Placement by KV working set on two vLLM CPU replicas whose KV cache is small enough to evict.

The real-engine check: two vLLM CPU replicas (the tiny random-weight model of
``.engine/``, one core each, dev mode so that each run starts on empty prefix caches),
each given a KV cache (``--num-gpu-blocks-override``) that holds one session's context
many times over but not every session's at once. N concurrent agent sessions, each a
tool loop whose context grows every turn (a system prompt all sessions share, the
session's own task, then a tool result and the reply per turn; short tool waits drawn
per turn), are sent by two clients:

- ``plain``: one bare ``openai.AsyncOpenAI`` per replica, round robin over the two (what
  ``plain`` means in ``agentrt bench``): each replica ends up holding a copy of every
  session's context, twice the working set of a placement that keeps a session on one
  replica, and evicts;
- ``agentrt``: ``agentrt.Runtime([url_a, url_b])`` with its defaults (sessions, jobs and
  tool waits written as a user writes them; the only argument is an observing hook that
  records why sessions moved).

The clients run in the order plain, agentrt, agentrt, plain (``--runs 2``), each run on
emptied prefix caches (``POST /reset_prefix_cache``). Per run: JCT per job (mean, p50,
p90), prompt tokens, cached tokens (the replies' ``usage.prompt_tokens_details``),
uncached = prompt - cached, re-prefilled tokens (uncached beyond what the turn added to
the session's context: the context an eviction or a scatter lost), the engines' own
prefix-cache counters (``vllm:prefix_cache_queries`` / ``_hits``, deltas), and for
agentrt its session moves by reason and the KV capacity and working set it saw
(``rt.endpoint_loads()``). Ratios agentrt/plain are given per pair (run order matters on
a shared 2-core machine).

    bash scripts/engine_setup.sh
    .venv/bin/python benchmarks/real_kv.py       # results/real_kv_small.json, ~2 min here
    .venv/bin/python benchmarks/real_kv.py --blocks 128 --out results/real_kv_tight.json

Small on purpose: the model is a 2-layer random-weight Llama on CPU, so a prefill of a
few thousand tokens takes ~0.1 s; the KV pressure, not the model, is what is real.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
from _harness import RESULTS, quantile, write_result

import agentrt
from agentrt.telemetry import Event, SessionMoved
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, Replica, ReplicaSpec, find_engine, launch

WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan "
    "file line patch test build error trace commit diff branch merge review"
).split()
CLIENTS = ("plain", "agentrt")
ENGINE_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
)
BLOCK_TOKENS = 128  # vLLM CPU's block size (its cache_config_info says so)


# -- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The workload's size; the same for every client and run."""

    sessions: int = 12
    turns: int = 8
    system_words: int = 300
    task_words: int = 300
    step_words: int = 200
    max_tokens: int = 16
    tool_s: tuple[float, float] = (0.2, 1.2)
    stagger_s: float = 0.3
    seed: int = 0
    salt: str = ""
    """Put before the system prompt: another salt, prompts no cache holds (where the
    prefix caches cannot be emptied between runs)."""


@dataclass(frozen=True)
class SessionPlan:
    index: int
    start_s: float
    task: str
    steps: tuple[str, ...]
    """The tool result added before each turn after the first."""
    waits: tuple[float, ...]
    """The tool wait before each turn after the first, in seconds."""


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def plan(shape: Shape) -> tuple[str, list[SessionPlan]]:
    """The shared system prompt and each session's plan (seeded)."""
    rng = random.Random(shape.seed)
    system = shape.salt + "You are a coding agent. " + words(rng, shape.system_words)
    sessions = []
    for i in range(shape.sessions):
        task = f"task {i} {uuid.UUID(int=rng.getrandbits(128)).hex}: " + words(
            rng, shape.task_words
        )
        steps = tuple(
            f"tool result {t}: " + words(rng, shape.step_words) for t in range(shape.turns - 1)
        )
        waits = tuple(rng.uniform(*shape.tool_s) for _ in range(shape.turns - 1))
        sessions.append(SessionPlan(i, i * shape.stagger_s, task, steps, waits))
    return system, sessions


@dataclass
class CallRecord:
    session: int
    turn: int
    replica: int
    prompt: int
    cached: int
    completion: int
    latency_s: float


@dataclass
class JobRecord:
    session: int
    jct_s: float
    calls: list[CallRecord] = field(default_factory=list)


Ask = Callable[[list[dict[str, str]]], Awaitable[tuple[str, CallRecord]]]
Wait = Callable[[float], Awaitable[None]]


async def play(session: SessionPlan, system: str, ask: Ask, wait: Wait) -> list[CallRecord]:
    """One session's turns: the context grows by a tool result and the reply each turn."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": session.task}]
    calls = []
    for turn in range(len(session.steps) + 1):
        if turn:
            await wait(session.waits[turn - 1])
            messages.append({"role": "user", "content": session.steps[turn - 1]})
        reply, record = await ask(messages)
        record.session, record.turn = session.index, turn
        calls.append(record)
        messages.append({"role": "assistant", "content": reply})
    return calls


def usage_of(reply: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat completion."""
    usage = reply.usage
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return int(usage.prompt_tokens), int(cached), int(usage.completion_tokens)


# -- the clients ----------------------------------------------------------------------------


def _body(shape: Shape) -> dict[str, Any]:
    # Random weights: greedy decoding and ignore_eos give every run the same replies.
    return {"max_tokens": shape.max_tokens, "temperature": 0.0, "extra_body": {"ignore_eos": True}}


async def run_plain(
    urls: Sequence[str], model: str, shape: Shape, system: str, sessions: Sequence[SessionPlan]
) -> dict[str, Any]:
    """One ``openai.AsyncOpenAI`` per replica, round robin over them (``agentrt bench``'s
    ``plain``)."""
    jobs: list[JobRecord] = []
    body = _body(shape)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        clients = [
            openai.AsyncOpenAI(base_url=u, api_key="x", http_client=http, max_retries=0)
            for u in urls
        ]
        turn = itertools.cycle(range(len(urls)))

        async def ask(messages: list[dict[str, str]]) -> tuple[str, CallRecord]:
            i = next(turn)
            started = anyio.current_time()
            reply = await clients[i].chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                **body,
            )
            prompt, cached, completion = usage_of(reply)
            record = CallRecord(
                -1, -1, i, prompt, cached, completion, anyio.current_time() - started
            )
            return reply.choices[0].message.content or "", record

        async def one(s: SessionPlan, t0: float) -> None:
            await anyio.sleep_until(t0 + s.start_s)
            started = anyio.current_time()
            calls = await play(s, system, ask, anyio.sleep)
            jobs.append(JobRecord(s.index, anyio.current_time() - started, calls))

        t0 = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(one, s, t0)
        makespan = anyio.current_time() - t0
    return {"jobs": jobs, "makespan_s": makespan}


async def run_agentrt(
    urls: Sequence[str], model: str, shape: Shape, system: str, sessions: Sequence[SessionPlan]
) -> dict[str, Any]:
    """``agentrt.Runtime(urls)`` with its defaults; a job with one session per agent, its
    tool waits in ``session.tool`` blocks."""
    jobs: list[JobRecord] = []
    body = _body(shape)
    moves: Counter[str] = Counter()

    def hook(event: Event) -> None:  # observes only: routing is the defaults'
        if isinstance(event, SessionMoved):
            moves[event.reason] += 1

    loads: list[list[dict[str, Any]]] = []
    async with agentrt.Runtime(list(urls), hooks=[hook]) as rt:

        async def one(s: SessionPlan, t0: float) -> None:
            await anyio.sleep_until(t0 + s.start_s)
            started = anyio.current_time()
            async with rt.job(f"agent-{s.index}") as job, job.session("agent") as session:

                async def ask(messages: list[dict[str, str]]) -> tuple[str, CallRecord]:
                    began = anyio.current_time()
                    reply = await session.chat(model=model, messages=messages, **body)
                    prompt, cached, completion = usage_of(reply)
                    record = CallRecord(
                        -1, -1, -1, prompt, cached, completion, anyio.current_time() - began
                    )
                    return reply.choices[0].message.content or "", record  # type: ignore[union-attr]

                async def wait(seconds: float) -> None:
                    async with session.tool("tool"):
                        await anyio.sleep(seconds)

                calls = await play(s, system, ask, wait)
            jobs.append(JobRecord(s.index, anyio.current_time() - started, calls))

        async def watch() -> None:
            while True:
                loads.append([_load(e) for e in rt.endpoint_loads()])
                await anyio.sleep(0.5)

        t0 = anyio.current_time()
        async with anyio.create_task_group() as outer:
            outer.start_soon(watch)
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(one, s, t0)
            outer.cancel_scope.cancel()
        makespan = anyio.current_time() - t0
        final = [_load(e) for e in rt.endpoint_loads()]
        # Which replica served each call, from the jobs' reports (in the session's order).
        by_job = {r.name: r for r in rt.reports()}
        for j in jobs:
            report = by_job[f"agent-{j.session}"]
            served = [c.endpoint for c in sorted(report.call_reports, key=lambda c: c.turn)]
            for record, url in zip(j.calls, served, strict=True):
                record.replica = _index(urls, url)
        moved_calls = sum(r.session_moves for r in by_job.values())
    peak_demand = [
        max((snap[i]["kv_demand"] or 0.0) for snap in loads) if loads else None
        for i in range(len(urls))
    ]
    # What placement assumed of each replica's KV, each change in the order seen.
    seen: list[list[list[Any]]] = [[] for _ in urls]
    for snap in [*loads, final]:
        for i, load in enumerate(snap):
            now = [load["kv_capacity"], load["kv_capacity_source"]]
            if now[0] is not None and (not seen[i] or seen[i][-1] != now):
                seen[i].append(now)
    return {
        "jobs": jobs,
        "makespan_s": makespan,
        "kv_capacity_seen": seen,
        "moves": dict(moves),
        "moved_calls": moved_calls,
        "endpoint_loads": final,
        "peak_kv_demand": peak_demand,
    }


def _load(e: Any) -> dict[str, Any]:
    return {
        "kv_capacity": e.kv_capacity,
        "kv_capacity_source": e.kv_capacity_source,
        "kv_demand": e.kv_demand,
        "sessions": e.sessions,
    }


def _index(urls: Sequence[str], url: str | None) -> int:
    for i, u in enumerate(urls):
        if url is not None and url.rstrip("/").startswith(u.rstrip("/")):
            return i
    return -1


# -- one run ------------------------------------------------------------------------------


def tokens(jobs: Sequence[JobRecord]) -> dict[str, int]:
    """Prompt, cached, uncached and re-prefilled tokens over the jobs' calls. A call's
    re-prefill is its uncached tokens beyond what the turn added to the session's
    context (its prompt minus the previous call's prompt and reply): context that was
    sent before and had to be prefilled again."""
    prompt = cached = again = 0
    for job in jobs:
        previous = 0
        for c in sorted(job.calls, key=lambda c: c.turn):
            prompt += c.prompt
            cached += c.cached
            added = max(0, c.prompt - previous)
            again += max(0, c.prompt - c.cached - added)
            previous = c.prompt + c.completion
    return {
        "prompt": prompt,
        "cached": cached,
        "uncached": prompt - cached,
        "reprefilled": again,
    }


def evictions(jobs: Sequence[JobRecord]) -> dict[str, int]:
    """Turns that came back to a replica holding the session's earlier context and found
    less of it cached than the session left there (less one block, vLLM caches whole
    blocks, and a reply's tokens may split differently when sent back: two blocks of
    slack): evictions of a session that came back, and the tokens they lost."""
    calls = lost = 0
    for job in jobs:
        left: dict[int, int] = {}  # replica -> context the session left there
        for c in sorted(job.calls, key=lambda c: c.turn):
            there = left.get(c.replica, 0)
            if c.cached + 2 * BLOCK_TOKENS < there:
                calls += 1
                lost += there - BLOCK_TOKENS - c.cached
            left[c.replica] = c.prompt + c.completion
    return {"calls": calls, "tokens": lost}


def summarize_run(client: str, result: dict[str, Any], before: Any, after: Any) -> dict[str, Any]:
    jobs: list[JobRecord] = result["jobs"]
    jct = [j.jct_s for j in jobs]
    engine = {
        key.removeprefix("vllm:").removesuffix("_total"): [
            a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True)
        ]
        for key in ENGINE_COUNTERS
    }
    queries = sum(engine["prefix_cache_queries"])
    calls = [c for j in jobs for c in j.calls]
    out: dict[str, Any] = {
        "client": client,
        "jobs": len(jobs),
        "calls": len(calls),
        "calls_per_replica": [sum(c.replica == i for c in calls) for i in range(len(before))],
        "jct_mean": statistics.fmean(jct),
        "jct_p50": quantile(jct, 0.5),
        "jct_p90": quantile(jct, 0.9),
        "makespan_s": result["makespan_s"],
        "call_latency_mean": statistics.fmean(c.latency_s for c in calls),
        "tokens": tokens(jobs),
        "evicted": evictions(jobs),
        "engine": engine,
        "engine_hit_rate": sum(engine["prefix_cache_hits"]) / queries if queries else math.nan,
    }
    for key in ("moves", "moved_calls", "kv_capacity_seen", "endpoint_loads", "peak_kv_demand"):
        if key in result:
            out[key] = result[key]
    out["jct_s"] = {
        str(j.session): round(j.jct_s, 4) for j in sorted(jobs, key=lambda j: j.session)
    }
    out["calls_detail"] = [asdict(c) for c in sorted(calls, key=lambda c: (c.session, c.turn))]
    return out


def run_one(
    client: str, replicas: Sequence[Replica], shape: Shape, reset: bool = True
) -> dict[str, Any]:
    """One client's run on emptied prefix caches, with the engines' counters around it."""
    if reset:
        for r in replicas:
            r.reset_prefix_cache()
    system, sessions = plan(shape)
    urls = [r.base_url for r in replicas]
    model = replicas[0].model
    runner = run_plain if client == "plain" else run_agentrt
    before = [r.metrics() for r in replicas]
    load = os.getloadavg()[0]
    result = anyio.run(runner, urls, model, shape, system, sessions)
    after = [r.metrics() for r in replicas]
    out = summarize_run(client, result, before, after)
    out["load_avg"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    return out


# -- report ---------------------------------------------------------------------------------


def _row(n: int, r: dict[str, Any]) -> str:
    t = r["tokens"]
    moves = ",".join(f"{k}={v}" for k, v in sorted(r.get("moves", {}).items())) or "-"
    return (
        f"{n:3d} {r['client']:8} {r['jct_mean']:7.2f} {r['jct_p50']:7.2f} {r['jct_p90']:7.2f} "
        f"{t['prompt']:8d} {t['cached']:8d} {t['uncached']:8d} {t['reprefilled']:8d} "
        f"{r['evicted']['calls']:4d} {r['evicted']['tokens']:7d} "
        f"{r['engine_hit_rate']:6.1%} {moves:>12}  {r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f}"
    )


HEADER = (
    f"{'run':>3} {'client':8} {'JCT':>7} {'p50':>7} {'p90':>7} {'prompt':>8} {'cached':>8} "
    f"{'uncached':>8} {'reprefil':>8} {'evicted':>12} {'hits':>6} {'moves':>12}  load avg"
)
RATIO_KEYS = ("jct_mean", "jct_p50", "jct_p90", "uncached", "reprefilled")


def _value(r: dict[str, Any], key: str) -> float:
    return float(r["tokens"][key] if key in r["tokens"] else r[key])


def pairs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """agentrt/plain per pair: runs (1, 2) and (4, 3) of the order plain, agentrt,
    agentrt, plain, ..."""
    out = []
    for n in range(0, len(runs) - 1, 2):
        a, b = runs[n], runs[n + 1]
        ag, pl = (a, b) if a["client"] == "agentrt" else (b, a)
        out.append(
            {
                "runs": [n + 1, n + 2],
                **{
                    k: _value(ag, k) / _value(pl, k) if _value(pl, k) else math.nan
                    for k in RATIO_KEYS
                },
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Shape()
    parser.add_argument("--sessions", type=int, default=d.sessions)
    parser.add_argument("--turns", type=int, default=d.turns)
    parser.add_argument("--system-words", type=int, default=d.system_words)
    parser.add_argument("--task-words", type=int, default=d.task_words)
    parser.add_argument("--step-words", type=int, default=d.step_words)
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens)
    parser.add_argument("--tool-s", type=float, nargs=2, default=d.tool_s, metavar=("MIN", "MAX"))
    parser.add_argument("--stagger-s", type=float, default=d.stagger_s)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--blocks", type=int, default=160, help="KV blocks of 128 tokens per replica"
    )
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=2, help="runs per client (alternating)")
    parser.add_argument("--out", type=Path, default=RESULTS / "real_kv_small.json")
    args = parser.parse_args(argv)
    shape = Shape(
        args.sessions,
        args.turns,
        args.system_words,
        args.task_words,
        args.step_words,
        args.max_tokens,
        tuple(args.tool_s),
        args.stagger_s,
        args.seed,
    )
    if find_engine() is None:
        print(SETUP_MESSAGE, file=sys.stderr)
        return 2
    specs = [
        ReplicaSpec(
            name=f"kv-{i}",
            num_gpu_blocks=args.blocks,
            max_model_len=args.max_model_len,
            kv_cache_space_gib=1,
            cpu_bind=str(i % 2),
            dev_mode=True,  # POST /reset_prefix_cache before each run
        )
        for i in range(2)
    ]
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    order = list(CLIENTS)
    with launch(specs) as replicas:
        print(f"replicas up in {max(r.startup_s or 0.0 for r in replicas):.0f} s", flush=True)
        print(HEADER, flush=True)
        for n in range(args.runs):
            for client in order if n % 2 == 0 else order[::-1]:
                r = run_one(client, replicas, shape)
                runs.append(r)
                print(_row(len(runs), r), flush=True)
    wall = time.monotonic() - started
    ratios = pairs(runs)
    print("\nagentrt / plain per pair:")
    for p in ratios:
        print(
            f"  runs {p['runs']}: " + "  ".join(f"{k} {p[k]:.2f}x" for k in RATIO_KEYS),
            flush=True,
        )
    doc = {
        "config": {
            "shape": asdict(shape),
            "blocks": args.blocks,
            "kv_tokens_per_replica": args.blocks * BLOCK_TOKENS,
            "max_model_len": args.max_model_len,
            "runs": args.runs,
        },
        "engine": "2 x vLLM CPU (tiny-llama, random weights), one core each, dev mode",
        "cpus": os.cpu_count(),
        "ratios": ratios,
        "runs": runs,
        "wall_s": wall,
    }
    write_result(args.out, doc, __doc__)
    print(f"({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
