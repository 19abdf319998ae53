"""agentrt.integrations.Agents (the recipe), framework-free: what its clients and wrapped
tools make of a run against the embedded engine (a session per agent, a sub-agent's
session under the tool that runs it, tool statuses, calls outside a job)."""

from __future__ import annotations

import json

import anyio
import anyio.lowlevel
import pytest

from agentrt import Runtime
from agentrt.integrations import Agents
from agentrt.sim import PRESETS, Cluster
from tests.integrations._sessions import SessionRecorder

pytestmark = pytest.mark.anyio
CONFIG = PRESETS["h100-8b"].replace(replies="agent")


async def chat(agents: Agents, agent: str, text: str) -> None:
    await agents.openai(agent).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=8
    )


async def test_sessions_per_agent_and_sub_agents_under_their_tool_call() -> None:
    async with Cluster(1, CONFIG) as cluster:
        server = SessionRecorder(cluster.transport())
        async with Runtime(cluster.base_urls, transport=server) as rt:
            agents = Agents(rt)

            async def ask_helper(task: str) -> str:
                await chat(agents, "helper", task)
                await chat(agents, "helper", task)
                return "ok"

            ask = agents.tool("lead", ask_helper)
            async with agents.job("run") as job:
                await chat(agents, "lead", "hi")
                assert await ask("a") == "ok"
                assert await ask("b") == "ok"  # a second call: a fresh helper session
                await chat(agents, "lead", "bye")
            assert ask.__name__ == "ask_helper"
    report = job.report
    assert report.status == "ok" and report.calls == 6 and report.sessions == 3
    lead, helper_a, helper_b = report.session_reports
    assert (lead.name, lead.parent_id) == ("lead", None)
    assert helper_a.name == helper_b.name == "helper"
    assert helper_a.parent_id == helper_b.parent_id == lead.session_id
    assert server.sessions == [
        lead.session_id,
        helper_a.session_id,
        helper_a.session_id,
        helper_b.session_id,
        helper_b.session_id,
        lead.session_id,
    ]
    assert [(t.name, t.session_id, t.status) for t in report.tool_reports] == [
        ("ask_helper", lead.session_id, "ok"),
        ("ask_helper", lead.session_id, "ok"),
    ]


async def test_tool_errors_sync_tools_and_calls_outside_a_job() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    async def broken() -> str:
        raise RuntimeError("tool broke")

    async with (
        Cluster(1, CONFIG) as cluster,
        Runtime(cluster.base_urls, transport=cluster.transport()) as rt,
    ):
        agents = Agents(rt)
        add_tool = agents.tool("a", add, name="adder")
        assert await add_tool(1, 2) == 3  # outside a job: just runs
        await chat(agents, "a", "outside")  # an implicit one-call job
        with pytest.raises(RuntimeError, match="tool broke"):
            async with agents.job("failing") as job:
                await chat(agents, "a", "hi")
                assert await add_tool(2, 3) == 5  # a sync tool, in a worker thread
                await agents.tool("a", broken)()
        assert agents.session("a") is None  # outside the job's block
    report = job.report
    assert report.status == "error" and "RuntimeError" in (report.error or "")
    assert [(t.name, t.status) for t in report.tool_reports] == [
        ("adder", "ok"),
        ("broken", "error"),
    ]
    assert add_tool.__name__ == "adder"
    assert [r.name for r in rt.reports()] == ["call", "failing"]


async def test_a_cancelled_run_ends_its_job_and_tool_cancelled() -> None:
    async with (
        Cluster(1, CONFIG) as cluster,
        Runtime(cluster.base_urls, transport=cluster.transport()) as rt,
    ):
        agents = Agents(rt)
        slow = agents.tool("a", anyio.sleep, name="sleep")
        with anyio.move_on_after(0.2):
            async with agents.job("slow") as job:
                await slow(5)
    report = job.report
    assert report.status == "cancelled"
    assert [(t.name, t.status) for t in report.tool_reports] == [("sleep", "cancelled")]
    json.dumps(report.model_dump(mode="json"))


async def test_clients_and_jobs_refuse_once_the_runtime_is_closed() -> None:
    from agentrt import RuntimeClosedError

    async with Cluster(1, CONFIG) as cluster:
        async with Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            agents = Agents(rt)
            client = agents.openai("a")
            async with agents.job("one"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
        with pytest.raises(RuntimeClosedError, match="this Runtime is closed"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        with pytest.raises(RuntimeClosedError):
            async with agents.job("two"):
                pass
        with pytest.raises(RuntimeClosedError):
            agents.openai("a")
        assert sum(s.requests_received for s in cluster.stats()) == 1
    assert [r.name for r in rt.reports()] == ["one"]


async def test_a_callable_object_with_an_async_call_is_awaited() -> None:
    class Lookup:
        async def __call__(self, key: str) -> str:
            await anyio.lowlevel.checkpoint()
            return f"value of {key}"

    async with Cluster(1, CONFIG) as cluster:
        async with Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            agents = Agents(rt)
            lookup = agents.tool("a", Lookup(), name="lookup")
            async with agents.job("j") as job:
                assert await lookup("k") == "value of k"
    assert [(t.name, t.status) for t in job.report.tool_reports] == [("lookup", "ok")]


async def test_a_tools_declared_wait_reaches_its_report() -> None:
    async def look(q: str) -> str:
        """Look."""
        await anyio.sleep(0.01)
        return q

    async with (
        Cluster(1, CONFIG) as cluster,
        Runtime(cluster.base_urls, transport=cluster.transport()) as rt,
    ):
        agents = Agents.shared(rt)
        assert Agents.shared(rt) is agents and agents.active
        async with agents.job("run") as job:
            assert agents.in_job()
            assert await agents.tool("a", look, expected_s=2.5)("x") == "x"
            opened = agents.start_tool("a", "hook", expected_s=7.0)
            assert opened is not None
            agents.end_tool(opened)
        assert agents.start_tool("a", "outside") is None and not agents.in_job()
    assert [(t.name, t.expected_s, t.expected_source) for t in job.report.tool_reports] == [
        ("look", 2.5, "declared"),
        ("hook", 7.0, "declared"),
    ]
