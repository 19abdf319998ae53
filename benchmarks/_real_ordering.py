"""Client-side ordering on the real vLLM CPU engine: short jobs behind long ones.

One vLLM CPU replica started with ``--scheduling-policy priority`` (and ``--max-num-seqs 4``,
so that a waiting queue forms and its order matters) serves a mix of short and long agent
jobs, each a session of several turns with a growing history and a short tool wait between
turns, arriving as a Poisson stream. Three clients replay the identical workload:

- ``plain``: a bare ``openai.AsyncOpenAI``; the engine sees every call with priority 0 (FCFS);
- ``agentrt plas``: agentrt with ``policy="plas"``, ``send_priority=True`` and no client-side
  cap: every call goes out at once, carrying its program's PLAS level (0 for programs with
  under 1 s of attained service, 1 under 4 s, ...), which the engine's priority scheduler
  honours;
- ``agentrt plas auto``: the same with ``concurrency="auto"`` (the gradient limiter), so calls
  also wait in agentrt's PLAS queue.

Each client runs ``--runs`` times, in alternating order (ABC, CBA, ...). Reported: mean job
completion time (JCT, arrival to last reply) of the short jobs, the long jobs and all.

    bash scripts/engine_setup.sh
    python -m benchmarks engine ordering     # ~4 min here; results/real_ordering.json

Scaled down to fit a 2-core machine: 24 jobs (17 short, 7 long), 3 turns each, 8 output
tokens per short turn, 160 per long turn, arrivals at 2 jobs/s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import openai
from openai.types.chat import ChatCompletionMessageParam

import agentrt
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaSpec, find_engine, launch

from ._harness import add_run_args, write_result

WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()
CLIENTS = ("plain", "agentrt plas", "agentrt plas auto")


@dataclass(frozen=True)
class JobSpec:
    index: int
    long: bool
    arrival_s: float
    turns: int
    max_tokens: int
    seed: int


def workload(args: argparse.Namespace) -> list[JobSpec]:
    rng = random.Random(args.seed)
    kinds = [True] * (args.jobs - args.short) + [False] * args.short
    rng.shuffle(kinds)
    t = 0.0
    jobs = []
    for i, long in enumerate(kinds):
        t += rng.expovariate(args.rate)
        tokens = args.long_tokens if long else args.short_tokens
        jobs.append(JobSpec(i, long, t, args.turns, tokens, rng.randrange(1 << 30)))
    return jobs


def text(words: int, rng: random.Random) -> str:
    return uuid.uuid4().hex + " " + " ".join(rng.choice(WORDS) for _ in range(words))


Messages = list[ChatCompletionMessageParam]
Ask = Callable[[Messages, int], Awaitable[str]]


async def play(job: JobSpec, ask: Ask, tool_s: float) -> None:
    """The job's turns: a growing history, a short tool wait between turns."""
    rng = random.Random(job.seed)
    messages: Messages = [{"role": "system", "content": text(150, rng)}]
    for turn in range(job.turns):
        messages.append({"role": "user", "content": f"step {turn}: " + text(40, rng)})
        reply = await ask(messages, job.max_tokens)
        messages.append({"role": "assistant", "content": reply})
        if turn + 1 < job.turns:
            await anyio.sleep(tool_s)


async def run_client(
    client: str, url: str, model: str, jobs: list[JobSpec], tool_s: float
) -> dict[str, Any]:
    jct: dict[int, float] = {}
    extra = {"ignore_eos": True}  # random weights: exact output lengths

    async def timed(job: JobSpec, t0: float, body: Callable[[], Awaitable[None]]) -> None:
        await anyio.sleep_until(t0 + job.arrival_s)
        start = anyio.current_time()
        await body()
        jct[job.index] = anyio.current_time() - start

    t0 = anyio.current_time()
    if client == "plain":
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as oc:

            def plain_job(job: JobSpec) -> Callable[[], Awaitable[None]]:
                async def ask(messages: Messages, max_tokens: int) -> str:
                    r = await oc.chat.completions.create(
                        model=model,
                        messages=messages,
                        max_tokens=max_tokens,
                        extra_body=extra,
                    )
                    return r.choices[0].message.content or ""

                return lambda: play(job, ask, tool_s)

            async with anyio.create_task_group() as tg:
                for job in jobs:
                    tg.start_soon(timed, job, t0, plain_job(job))
    else:
        concurrency: Literal["auto"] | None = "auto" if client.endswith("auto") else None
        async with agentrt.Runtime(
            [url], dialect="vllm", policy="plas", concurrency=concurrency, send_priority=True
        ) as rt:

            def agentrt_job(job: JobSpec) -> Callable[[], Awaitable[None]]:
                async def body() -> None:
                    async with rt.job(f"job-{job.index}") as j, j.session("agent") as s:

                        async def ask(messages: Messages, max_tokens: int) -> str:
                            r = await s.chat(
                                model=model,
                                messages=messages,
                                max_tokens=max_tokens,
                                extra_body=extra,
                            )
                            return r.choices[0].message.content or ""

                        await play(job, ask, tool_s)

                return body

            async with anyio.create_task_group() as tg:
                for job in jobs:
                    tg.start_soon(timed, job, t0, agentrt_job(job))
    short = [jct[j.index] for j in jobs if not j.long]
    long = [jct[j.index] for j in jobs if j.long]
    return {
        "client": client,
        "short_mean_s": statistics.mean(short),
        "long_mean_s": statistics.mean(long),
        "all_mean_s": statistics.mean(short + long),
        "makespan_s": anyio.current_time() - t0,
        "jct_s": {str(k): v for k, v in sorted(jct.items())},
    }


async def run_all(url: str, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    jobs = workload(args)
    out = []
    for r in range(args.runs):
        order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
        for client in order:
            started = time.monotonic()
            result = await run_client(client, url, model, jobs, args.tool_s)
            result["run"] = r
            out.append(result)
            print(
                f"run {r} {client:18} short {result['short_mean_s']:6.2f} s  "
                f"long {result['long_mean_s']:6.2f} s  all {result['all_mean_s']:6.2f} s  "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    table = {}
    for client in CLIENTS:
        rows = [r for r in results if r["client"] == client]
        table[client] = {
            k: statistics.mean(r[k] for r in rows)
            for k in ("short_mean_s", "long_mean_s", "all_mean_s")
        }
    return table


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--short", type=int, default=17, help="how many of the jobs are short")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--short-tokens", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=160)
    parser.add_argument("--rate", type=float, default=2.0, help="job arrivals per second")
    parser.add_argument("--tool-s", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--url", help="an already running priority server (base URL)")
    add_run_args(parser, out="real_ordering.json", seed=7)


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.url:
        results = anyio.run(run_all, args.url, "tiny-llama", args)
    else:
        engine = find_engine()
        if engine is None:
            print(SETUP_MESSAGE, file=sys.stderr)
            return 2
        spec = ReplicaSpec(
            name="ordering",
            priority_scheduling=True,
            max_num_seqs=args.max_num_seqs,
            kv_cache_space_gib=1,
            cpu_bind="0",
        )
        with launch([spec], engine=engine) as (replica,):
            results = anyio.run(run_all, replica.base_url, replica.model, args)
    table = summarize(results)
    print(f"\n{'client':20} {'short JCT':>10} {'long JCT':>10} {'all JCT':>10}   (means, s)")
    for client, row in table.items():
        print(
            f"{client:20} {row['short_mean_s']:>10.2f} {row['long_mean_s']:>10.2f} "
            f"{row['all_mean_s']:>10.2f}"
        )
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    write_result(
        args.out,
        {
            "config": config,
            "summary": table,
            "runs": results,
            "wall_s": time.monotonic() - started,
        },
        __doc__,
        indent=2,
    )
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")
    return 0
