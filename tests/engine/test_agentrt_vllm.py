"""agentrt's public API against real vLLM CPU replicas (no mocks).

Each test drives agentrt the way agent code does and checks what the engine did with it:
the reply, the prefix cache, the metrics, the retry and error paths.
"""

from __future__ import annotations

import random
import uuid

import anyio
import pytest

import agentrt
from agentrt.dialects import DIALECTS
from agentrt.testing.vllm_cpu import ReplicaServer, ReplicaSpec

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

_WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()


@pytest.fixture
def anyio_backend() -> str:
    # The engine is slow to answer on 2 cores: one event loop is enough here (the unit
    # tests cover trio).
    return "asyncio"


def text(words: int) -> str:
    tag = uuid.uuid4().hex
    rng = random.Random(tag)
    return tag + " " + " ".join(rng.choice(_WORDS) for _ in range(words))


async def test_chat_and_completions_streaming_and_not(vllm_engine: ReplicaServer) -> None:
    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        async with rt.job("basics") as job, job.session("s") as s:
            reply = await s.chat(
                model=vllm_engine.model,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=8,
            )
            assert reply.choices[0].message is not None  # type: ignore[union-attr]
            stream = await s.chat(
                model=vllm_engine.model,
                messages=[{"role": "user", "content": "hello again"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]  # type: ignore[union-attr]
            assert len(chunks) >= 2
            out = await s.complete(model=vllm_engine.model, prompt="def f(x):", max_tokens=8)
            assert out.choices[0].text is not None  # type: ignore[union-attr]
            cstream = await s.complete(
                model=vllm_engine.model, prompt="import os", max_tokens=8, stream=True
            )
            assert len([c async for c in cstream]) >= 1  # type: ignore[union-attr]
    rep = job.report
    assert rep.status == "ok" and rep.calls == 4
    first, streamed = rep.call_reports[0], rep.call_reports[1]
    assert first.completion_tokens == 8 and (first.prompt_tokens or 0) > 0
    assert streamed.ttft_s is not None and streamed.completion_tokens == 8
    assert streamed.latency_s is not None and streamed.ttft_s <= streamed.latency_s
    assert all(c.endpoint == vllm_engine.base_url for c in rep.call_reports)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_every_dialect_is_accepted_by_vllm(vllm_engine: ReplicaServer, dialect: str) -> None:
    async with agentrt.Runtime([vllm_engine.base_url], dialect=dialect) as rt:
        async with rt.job(f"dialect-{dialect}") as job:
            async with job.session("parent") as parent:
                await parent.chat(
                    model=vllm_engine.model,
                    messages=[{"role": "user", "content": "x"}],
                    max_tokens=2,
                )
                async with job.session("child", parent=parent) as child:
                    await child.chat(
                        model=vllm_engine.model,
                        messages=[{"role": "user", "content": "y"}],
                        max_tokens=2,
                    )
    assert job.report.status == "ok"
    assert [c.http_status for c in job.report.call_reports] == [200, 200]


async def test_priority_from_agentrt_is_accepted_by_a_priority_server(
    vllm_priority_engine: ReplicaServer,
) -> None:
    """agentrt's PLAS priorities reach a server running ``--scheduling-policy priority``
    and are accepted. (That the server then runs lower values first is pinned down in
    test_vllm_raw.py with server-side queue times: client-side ordering on 2 busy cores is
    too noisy to assert.)"""
    replica = vllm_priority_engine
    async with agentrt.Runtime([replica.base_url], dialect="vllm", send_priority=True) as rt:

        async def job(i: int) -> None:
            async with rt.job(f"p{i}", program_id=f"prog{i % 2}") as j, j.session() as s:
                for _ in range(2):
                    await s.chat(
                        model=replica.model,
                        messages=[{"role": "user", "content": f"job {i}"}],
                        max_tokens=4,
                    )

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(job, i)
    reports = rt.reports()
    assert len(reports) == 4 and all(r.status == "ok" for r in reports)
    priorities = [c.priority for r in reports for c in r.call_reports]
    assert all(p is not None and p >= 0 for p in priorities)
    assert all(c.http_status == 200 for r in reports for c in r.call_reports)


async def test_second_turn_hits_the_prefix_cache(vllm_engine: ReplicaServer) -> None:
    before = vllm_engine.metrics()
    system = text(600)  # several 128-token blocks, unique to this test
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "step 1"}]
    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        async with rt.job("cache") as job, job.session("s") as s:
            r1 = await s.chat(model=vllm_engine.model, messages=messages, max_tokens=4)
            messages += [
                {"role": "assistant", "content": r1.choices[0].message.content or ""},  # type: ignore[union-attr]
                {"role": "user", "content": "step 2"},
            ]
            async with s.tool("grep", expected_s=0.1):
                await anyio.sleep(0.1)
            await s.chat(model=vllm_engine.model, messages=messages, max_tokens=4)
    after = vllm_engine.metrics()
    first, second = job.report.call_reports
    assert (first.cached_tokens or 0) < (first.prompt_tokens or 0) // 2
    assert (second.cached_tokens or 0) >= 512  # most of the shared system prompt
    assert job.report.cached_tokens == (first.cached_tokens or 0) + (second.cached_tokens or 0)
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0)
    assert hits >= 512


async def test_a_replica_killed_mid_stream_gives_a_clear_error(engine_pool: object) -> None:
    pool = engine_pool
    # The longest stream the model allows, killed at its first chunk: on a loaded machine a
    # slow reader could otherwise find a short stream already whole in its socket buffer.
    spec = ReplicaSpec(name="victim", kv_cache_space_gib=1, cpu_bind="1", max_model_len=8192)
    with pool.private([spec]) as (replica,):  # type: ignore[attr-defined]
        async with agentrt.Runtime(
            [replica.base_url], retry=agentrt.Retry(attempts=2, wait_initial=0.05)
        ) as rt:
            with pytest.raises(agentrt.EndpointError) as info:
                with anyio.fail_after(60):  # never a hang
                    async with rt.job("doomed") as job, job.session() as s:
                        stream = await s.chat(
                            model=replica.model,
                            messages=[{"role": "user", "content": "go"}],
                            max_tokens=8000,
                            stream=True,
                            # A random-weight model may stop early: no end before the kill.
                            extra_body={"ignore_eos": True},
                        )
                        killed = False
                        async for _ in stream:  # type: ignore[union-attr]
                            if not killed:
                                replica.kill()
                                killed = True
            assert replica.base_url in str(info.value)
            # A new call to the dead replica: retried, then a clear error naming it.
            with pytest.raises(agentrt.EndpointError, match="failed after 2 attempt"):
                with anyio.fail_after(60):
                    async with rt.job("after") as job2, job2.session() as s2:
                        await s2.chat(
                            model=replica.model,
                            messages=[{"role": "user", "content": "x"}],
                            max_tokens=2,
                        )
    rep = job.report
    assert rep.status == "error"
    assert rep.call_reports[0].status == "error"
    assert "broke off" in (rep.call_reports[0].error or "")
    assert job2.report.status == "error" and job2.report.call_reports[0].attempts == 2


async def test_session_affinity_keeps_the_cache_on_two_replicas(
    vllm_pair: list[ReplicaServer],
) -> None:
    """A session's turns stay on one replica with session routing; round-robin spreads
    them, and its later turns then miss the cache half the time."""
    urls = [r.base_url for r in vllm_pair]
    model = vllm_pair[0].model

    async def run(routing: str) -> agentrt.JobReport:
        async with agentrt.Runtime(urls, routing=routing) as rt:
            async with rt.job(routing) as job, job.session() as s:
                messages = [{"role": "system", "content": text(400)}]
                for turn in range(6):
                    messages.append({"role": "user", "content": f"turn {turn} " + text(30)})
                    r = await s.chat(model=model, messages=messages, max_tokens=4)
                    messages.append(
                        {"role": "assistant", "content": r.choices[0].message.content or ""}  # type: ignore[union-attr]
                    )
        return job.report

    sticky = await run("session")
    spread = await run("round-robin")
    assert len({c.endpoint for c in sticky.call_reports}) == 1
    assert len({c.endpoint for c in spread.call_reports}) == 2
    assert (sticky.cache_hit_rate or 0) > (spread.cache_hit_rate or 0)
