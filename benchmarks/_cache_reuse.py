"""Prefix-cache reuse of one agent session on the real vLLM CPU engine.

One session of 10 turns with a growing prompt (a shared system prompt, then each turn adds
a user message and the reply), sent through agentrt with its session tagging. The share of
prompt tokens the engine served from its prefix cache is measured side by side on:

- one replica;
- two replicas with round-robin routing (what a plain load balancer does);
- two replicas with agentrt's session routing.

    bash scripts/engine_setup.sh
    python -m benchmarks engine cache --repeats 3 --out results/cache_reuse.json

Every run uses fresh, unique prompts, so no run reuses another's cache.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import uuid
from typing import Any

import anyio
from openai.types.chat import ChatCompletionMessageParam

import agentrt
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaSpec, find_engine, launch

from ._harness import add_run_args, write_result

WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()


def text(words: int, rng: random.Random) -> str:
    return uuid.uuid4().hex + " " + " ".join(rng.choice(WORDS) for _ in range(words))


async def one_session(
    urls: list[str], routing: str, model: str, turns: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    async with agentrt.Runtime(urls, routing=routing, dialect="vllm") as rt:
        async with rt.job(f"cache-{routing}") as job, job.session("agent") as s:
            system = text(500, rng)
            messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}]
            for turn in range(turns):
                messages.append({"role": "user", "content": f"turn {turn}: " + text(60, rng)})
                reply = await s.chat(
                    model=model,
                    messages=messages,
                    max_tokens=32,
                    extra_body={"ignore_eos": True},
                )
                content = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": content})
                async with s.tool("tool", expected_s=0.05):
                    await anyio.sleep(0.05)
    rep = job.report
    return {
        "prompt_tokens": rep.prompt_tokens,
        "cached_tokens": rep.cached_tokens,
        "cache_share": rep.cache_hit_rate,
        "jct_s": rep.jct_s,
        "replicas_used": len({c.endpoint for c in rep.call_reports}),
    }


async def run(urls: list[str], model: str, turns: int, repeats: int) -> dict[str, Any]:
    setups = {
        "1 replica": ([urls[0]], "session"),
        "2 replicas, round-robin": (urls, "round-robin"),
        "2 replicas, agentrt session routing": (urls, "session"),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    for rep in range(repeats):
        for name, (eps, routing) in setups.items():  # interleaved, side by side
            results[name].append(await one_session(eps, routing, model, turns, seed=rep))
    summary = {}
    for name, runs in results.items():
        summary[name] = {
            "cache_share_median": statistics.median(r["cache_share"] for r in runs),
            "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in runs),
            "replicas_used": max(r["replicas_used"] for r in runs),
            "runs": runs,
        }
    return summary


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    add_run_args(parser, out="cache_reuse.json")


def main(args: argparse.Namespace) -> int:
    engine = find_engine()
    if engine is None:
        print(SETUP_MESSAGE, file=sys.stderr)
        return 2
    specs = [
        ReplicaSpec(name=f"bench-{i}", kv_cache_space_gib=1, cpu_bind=str(i)) for i in range(2)
    ]
    with launch(specs, engine=engine) as replicas:
        urls = [r.base_url for r in replicas]
        summary = anyio.run(run, urls, replicas[0].model, args.turns, args.repeats)
    print(f"{'setup':40} {'cached share of prompt tokens':>30} {'replicas used':>14}")
    for name, row in summary.items():
        print(f"{name:40} {row['cache_share_median']:>30.1%} {row['replicas_used']:>14}")
    write_result(args.out, {"turns": args.turns, "setups": summary}, __doc__, indent=2)
    print(f"wrote {args.out}")
    return 0
