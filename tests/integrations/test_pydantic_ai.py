"""The PydanticAI adapter: real agents with real tools, run by ``Agent.run`` against the
embedded engine in its scripted-reply mode; what the server sees is recorded by wrapping
the cluster's transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, AgentRunResultEvent

from agentrt import Runtime
from agentrt.integrations import pydantic_ai as agentrt_pydantic_ai
from tests.integrations._sessions import (
    SessionRecorder,
    check_lead_and_helper,
    lead_and_helper_question,
    scripted_runtime,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def env() -> AsyncIterator[tuple[Runtime, SessionRecorder]]:
    async with scripted_runtime() as env:
        yield env


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def explode() -> str:
    """Fail."""
    raise RuntimeError("tool broke")


def agent(rt: Runtime, name: str, tools: list[object]) -> Agent[None, str]:
    cap = agentrt_pydantic_ai.instrument(rt)
    return Agent(agentrt_pydantic_ai.model(rt, "m"), name=name, tools=tools, capabilities=[cap])


async def run_streamed(agent: Agent[None, str], prompt: str) -> str:
    async with agent.run_stream(prompt) as result:
        return await result.get_output()


async def run_stream_events(agent: Agent[None, str], prompt: str) -> str:
    async with agent.run_stream_events(prompt) as events:
        outputs = [
            event.result.output async for event in events if isinstance(event, AgentRunResultEvent)
        ]
    assert len(outputs) == 1
    return outputs[0]


async def run_iter(agent: Agent[None, str], prompt: str) -> str:
    async with agent.iter(prompt) as run:
        async for _ in run:
            pass
    assert run.result is not None
    return run.result.output


async def run_run(agent: Agent[None, str], prompt: str) -> str:
    return (await agent.run(prompt)).output


@pytest.mark.parametrize("run", [run_run, run_iter, run_streamed, run_stream_events])
async def test_runs_agents_and_tools_map_to_jobs_sessions_and_waits(
    env: tuple[Runtime, SessionRecorder],
    run: Callable[[Agent[None, str], str], Awaitable[str]],
) -> None:
    """In every way of running an agent: a streamed run opens its model requests in
    another task than the one ``wrap_model_request`` runs in, and each agent's calls are
    still its session's turns on the wire (they all went to the job's default session)."""
    rt, server = env
    helper = agent(rt, "helper", [add])

    async def ask_helper(task: str) -> str:
        """Ask the helper."""
        return await run(helper, task)

    lead = agent(rt, "lead", [add, ask_helper])
    assert await run(lead, lead_and_helper_question("ask_helper", "task")) == "three"
    (report,) = rt.reports()
    check_lead_and_helper(report, server.sessions, "ask_helper")


async def test_a_tools_own_calls_are_not_its_agents_turns(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, server = env
    client = rt.openai()

    async def lookup(q: str) -> str:
        """Look it up."""
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi.\nANSWER found"}]
        )
        return reply.choices[0].message.content or ""

    lead = agent(rt, "lead", [lookup])
    await run_streamed(lead, 'Go.\nCALL lookup {"q": "x"}\nANSWER done')
    (report,) = rt.reports()
    assert [s.name for s in report.session_reports] == ["lead", "default"]
    lead_id, default_id = (s.session_id for s in report.session_reports)
    assert server.sessions == [lead_id, default_id, lead_id]


async def test_concurrent_runs_are_jobs_of_their_own(env: tuple[Runtime, SessionRecorder]) -> None:
    rt, _ = env
    one, two = agent(rt, "one", [add]), agent(rt, "two", [add])
    q = 'Go.\nCALL add {"a": 1, "b": 2}\nANSWER ok'
    await asyncio.gather(one.run(q), two.run(q))
    reports = sorted(rt.reports(), key=lambda r: r.name)
    assert [(r.name, r.calls, r.sessions, r.tool_waits) for r in reports] == [
        ("one", 2, 1, 1),
        ("two", 2, 1, 1),
    ]


async def test_a_failing_tool_ends_its_wait_and_the_run_with_an_error(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, _ = env
    lead = agent(rt, "lead", [explode])
    with pytest.raises(RuntimeError, match="tool broke"):
        await lead.run("Try.\nCALL explode {}\nANSWER it broke")
    (report,) = rt.reports()
    assert report.status == "error" and "RuntimeError" in (report.error or "")
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]
