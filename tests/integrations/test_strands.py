"""The Strands adapter: real agents with real tools, run by ``invoke_async`` against the
embedded engine in its scripted-reply mode; what the server sees is recorded by wrapping
the cluster's transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

strands = pytest.importorskip("strands")

from strands import Agent, tool  # noqa: E402

from agentrt import Runtime  # noqa: E402
from agentrt.integrations import strands as agentrt_strands  # noqa: E402
from tests.integrations._sessions import (  # noqa: E402
    SessionRecorder,
    check_lead_and_helper,
    lead_and_helper_question,
    scripted_runtime,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Strands runs on asyncio


@pytest.fixture
async def env() -> AsyncIterator[tuple[Runtime, SessionRecorder]]:
    async with scripted_runtime() as env:
        yield env


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode() -> str:
    """Fail."""
    raise RuntimeError("tool broke")


def agent(
    rt: Runtime, hooks: agentrt_strands.AgentrtHooks, name: str, tools: list[object]
) -> Agent:
    model = agentrt_strands.model(rt, "m")
    return Agent(name=name, model=model, tools=tools, hooks=[hooks], callback_handler=None)


async def test_invocations_agents_and_tools_map_to_jobs_sessions_and_waits(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, server = env
    hooks = agentrt_strands.instrument(rt)
    helper = agent(rt, hooks, "helper", [add])
    lead = agent(rt, hooks, "lead", [add, helper.as_tool(name="ask_helper", description="Ask.")])
    result = await lead.invoke_async(lead_and_helper_question("ask_helper", "input"))
    assert str(result).strip() == "three"
    (report,) = rt.reports()
    check_lead_and_helper(report, server.sessions, "ask_helper")
    # a second invocation: a job of its own
    await lead.invoke_async("ANSWER again")
    assert [r.name for r in rt.reports()] == ["lead", "lead"]


async def test_a_failing_tool_is_an_error_wait_and_the_run_goes_on(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, _ = env
    lead = agent(rt, agentrt_strands.instrument(rt), "lead", [explode])
    await lead.invoke_async("Try.\nCALL explode {}\nANSWER it broke")
    (report,) = rt.reports()
    assert report.status == "ok"
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]
