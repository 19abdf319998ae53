"""The AG2 adapter: real agents with real tools, run by ``Agent.ask`` against the
embedded engine in its scripted-reply mode; what the server sees is recorded by wrapping
the cluster's transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("ag2")

from ag2 import Agent

from agentrt import Runtime
from agentrt.integrations import ag2 as agentrt_ag2
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


def agent(rt: Runtime, name: str, tools: list[object]) -> Agent:
    config = agentrt_ag2.model(rt, "m")
    return Agent(name, config=config, tools=tools, middleware=[agentrt_ag2.instrument(rt, name)])


async def test_turns_agents_and_tools_map_to_jobs_sessions_and_waits(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, server = env
    helper = agent(rt, "helper", [add])

    async def ask_helper(task: str) -> str:
        """Ask the helper."""
        return (await helper.ask(task)).body or ""

    lead = agent(rt, "lead", [add, ask_helper])
    reply = await lead.ask(lead_and_helper_question("ask_helper", "task"))
    assert reply.body == "three"
    (report,) = rt.reports()
    check_lead_and_helper(report, server.sessions, "ask_helper")
    await lead.ask("ANSWER again")  # a second turn: a job of its own
    assert [r.name for r in rt.reports()] == ["lead", "lead"]


async def test_a_failing_tool_is_an_error_wait(env: tuple[Runtime, SessionRecorder]) -> None:
    rt, _ = env
    lead = agent(rt, "lead", [explode])
    reply = await lead.ask("Try.\nCALL explode {}\nANSWER it broke")
    assert reply.body == "it broke"
    (report,) = rt.reports()
    assert report.status == "ok"
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]
