"""Fidelity: the embedded engine against the real vLLM CPU engine, on one small workload.

1. Starts one real vLLM CPU replica (the tiny offline model) and fits the ``cpu-tiny``
   cost model to it (``agentrt.sim.probe_engine`` + ``calibrate``).
2. Runs the same small agent workload (sessions of growing prompts with tool waits)
   through agentrt on the real replica (wall-clock time) and on the embedded engine with
   the fitted cost model (virtual time).
3. Prints per-call latency p50 and the prefix-cache hit rate side by side.

    bash scripts/engine_setup.sh
    python -m benchmarks twin fidelity --out results/fidelity.json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

import anyio
import httpx

import agentrt
from agentrt.bench import Call, JobPlan, Prompts, SessionPlan, VirtualTimeLoop
from agentrt.sim import PRESETS, Cluster, calibrate, probe_engine
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaSpec, find_engine, launch

from ._harness import add_run_args, quantile, write_result


def workload(jobs: int, turns: int) -> list[JobPlan]:
    """Sessions with a shared 8-block system prompt, growing 3 blocks a turn."""
    plans = []
    for j in range(jobs):
        steps = []
        own = 0
        for t in range(turns):
            own += 3
            blocks = tuple(range(8)) + tuple(range(1000, 1000 + own))
            steps.append(Call(0.2 if t else 0.0, "tool" if t else None, blocks, f"j{j}", 8, 0, 32))
        plans.append(JobPlan(f"job-{j}", "react", j * 1.5, SessionPlan("agent", tuple(steps))))
    return plans


async def run(
    rt: agentrt.Runtime, plans: list[JobPlan], model: str, prompts: Prompts, extra: dict[str, Any]
) -> list[agentrt.JobReport]:
    reports: list[agentrt.JobReport] = []
    t0 = anyio.current_time()

    async def one(plan: JobPlan) -> None:
        await anyio.sleep_until(t0 + plan.arrival_s)
        async with rt.job(plan.name) as job, job.session() as s:
            for step in plan.root.steps:
                assert isinstance(step, Call)
                if step.wait_s:
                    async with s.tool(step.tool or "tool"):
                        await anyio.sleep(step.wait_s)
                await s.chat(
                    model=model,
                    messages=[{"role": "user", "content": prompts.render(step)}],
                    max_tokens=step.output_tokens,
                    extra_body=extra,
                )
        reports.append(job.report)

    async with anyio.create_task_group() as tg:
        for plan in plans:
            tg.start_soon(one, plan)
    return reports


def summary(reports: list[agentrt.JobReport]) -> dict[str, float]:
    calls = [c for r in reports for c in r.call_reports]
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    cached = sum(c.cached_tokens or 0 for c in calls)
    return {
        "calls": len(calls),
        "latency_p50_s": quantile((c.latency_s or 0.0 for c in calls), 0.5),
        "prompt_tokens": prompt,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "jct_p50_s": quantile((r.jct_s for r in reports), 0.5),
    }


async def words_per_block(base_url: str, model: str) -> int:
    """Words of the prompt vocabulary per 64 tokens of the engine's tokenizer: 20 blocks
    of ``Prompts("text")`` words, tokenized by the engine."""
    blocks = Call(0.0, None, tuple(range(20)), "words", 0, 0, 0)
    text = Prompts("text", words_per_block=32).render(blocks)
    root = base_url[: -len("/v1")]
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(root + "/tokenize", json={"model": model, "prompt": text})
        tokens = len(resp.json()["tokens"])
    return max(1, round(64 * len(text.split()) / tokens))


async def real_side(url: str, model: str, plans: list[JobPlan]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600) as http:
        samples = await probe_engine(http, url, model=model)
    fitted = calibrate(samples)
    # The API server's share of a request: a 16-token, 1-token-output request's latency
    # beyond what the fitted engine step takes.
    floor = min(s.seconds for s in samples if s.prefill_tokens and s.prefill_tokens <= 16)
    overhead = max(0.0, floor - fitted.step_s - 16 * fitted.prefill_token_s)
    wpb = await words_per_block(url, model)
    async with agentrt.Runtime([url], dialect="vllm") as rt:
        reports = await run(rt, plans, model, Prompts("text", wpb), {"ignore_eos": True})
    return {
        "cost_model": asdict(fitted),
        "request_overhead_s": overhead,
        "words_per_block": wpb,
        "real": summary(reports),
    }


async def sim_side(cost: dict[str, float], overhead: float, plans: list[JobPlan]) -> dict[str, Any]:
    base = PRESETS["cpu-tiny"]
    config = base.replace(cost=type(base.cost)(**cost), request_overhead_s=overhead)
    async with Cluster(1, config) as cluster:
        async with agentrt.Runtime(
            list(cluster.base_urls), transport=cluster.transport(), dialect="vllm"
        ) as rt:
            reports = await run(rt, plans, config.model_name, Prompts("sim"), {})
    return summary(reports)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    add_run_args(parser, out="fidelity.json")


def main(args: argparse.Namespace) -> int:
    engine = find_engine()
    if engine is None:
        print(SETUP_MESSAGE, file=sys.stderr)
        return 2
    plans = workload(args.jobs, args.turns)
    spec = ReplicaSpec(name="fidelity", kv_cache_space_gib=1, prompt_tokens_details=True)
    with launch([spec], engine=engine) as (replica,):
        real = anyio.run(real_side, replica.base_url, replica.model, plans)
    sim = anyio.run(
        sim_side,
        real["cost_model"],
        real["request_overhead_s"],
        plans,
        backend_options={"loop_factory": VirtualTimeLoop},
    )
    r, s = real["real"], sim
    print(f"fitted cpu-tiny cost model: {real['cost_model']}")
    print(f"fitted request overhead: {real['request_overhead_s'] * 1e3:.2f} ms")
    print(f"{'':24} {'real vLLM CPU':>14} {'embedded':>10} {'embedded/real':>14}")
    for key in ("latency_p50_s", "cache_hit_rate", "jct_p50_s", "prompt_tokens"):
        ratio = s[key] / r[key] if r[key] else float("nan")
        print(f"{key:24} {r[key]:14.4f} {s[key]:10.4f} {ratio:14.2f}")
    write_result(args.out, {"real_side": real, "sim": sim}, __doc__)
    print(f"wrote {args.out}")
    return 0
