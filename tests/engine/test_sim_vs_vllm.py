"""The same small workload on the embedded engine and on the real vLLM CPU engine."""

from __future__ import annotations

import uuid

import anyio
import pytest

import agentrt
from agentrt.bench import Call, Prompts
from agentrt.sim import Cluster
from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def turns(namespace: str) -> list[Call]:
    """Two turns of one session: the second prompt extends the first by two blocks."""
    first = tuple(range(12))
    second = (*first, 12, 13)
    return [
        Call(0.0, None, first, namespace, 0, 0, 8),
        Call(0.1, "grep", second, namespace, 0, 0, 8),
    ]


async def run_session(
    rt: agentrt.Runtime, model: str, prompts: Prompts, calls: list[Call], extra: dict[str, bool]
) -> agentrt.JobReport:
    async with rt.job("fidelity") as job, job.session() as s:
        for call in calls:
            if call.wait_s:
                async with s.tool(call.tool or "tool"):
                    await anyio.sleep(call.wait_s)
            await s.chat(
                model=model,
                messages=[{"role": "user", "content": prompts.render(call)}],
                max_tokens=call.output_tokens,
                extra_body=extra,
            )
    return job.report


async def test_both_engines_hit_the_cache_on_the_second_turn(vllm_engine: ReplicaServer) -> None:
    calls = turns(f"fid{uuid.uuid4().hex[:12]}")
    async with Cluster(1, "cpu-tiny") as cluster:
        async with agentrt.Runtime(
            list(cluster.base_urls), transport=cluster.transport(), dialect="vllm"
        ) as rt:
            sim = await run_session(rt, "tiny-llama", Prompts("sim"), calls, {})
    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        real = await run_session(
            rt, vllm_engine.model, Prompts("text"), calls, {"ignore_eos": True}
        )
    for report in (sim, real):
        first, second = report.call_reports
        assert report.status == "ok"
        assert (first.cached_tokens or 0) == 0 or first.cached_tokens < first.prompt_tokens  # type: ignore[operator]
        # The second turn re-uses the first turn's prompt: at least one full 128-token
        # block of it comes from the prefix cache on both engines.
        assert (second.cached_tokens or 0) >= 128, report.call_reports
