"""The OpenAI Agents SDK adapter: real agents with real tools, run by ``Runner.run``
against the embedded engine in its scripted-reply mode; what the server sees is recorded
by wrapping the cluster's transport."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

agents = pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    RunConfig,
    Runner,
    UserError,
    function_tool,
    set_trace_processors,
)

from agentrt import JobReport, Runtime  # noqa: E402
from agentrt._protocol import CallMetadata, parse_agentrt_header  # noqa: E402
from agentrt.integrations import openai_agents  # noqa: E402
from agentrt.sim import PRESETS, Cluster  # noqa: E402

pytestmark = pytest.mark.anyio

ADD_S, LOOKUP_S = 0.2, 0.1
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_agent.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK runs on asyncio


@dataclass
class Seen:
    headers: httpx.Headers
    body: dict[str, Any]

    @property
    def meta(self) -> CallMetadata:
        """The agentrt metadata of the request, read as a server reads it."""
        return parse_agentrt_header(self.headers["x-agentrt"])


@dataclass
class Recorder(httpx.AsyncBaseTransport):
    """The cluster's transport, recording each chat request as the server receives it."""

    inner: httpx.AsyncBaseTransport
    seen: list[Seen] = field(default_factory=list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):  # not tool-start notices
            self.seen.append(Seen(request.headers, json.loads(await request.aread())))
        return await self.inner.handle_async_request(request)

    def sessions(self) -> list[str]:
        return [s.meta.session_id for s in self.seen]


@dataclass
class Env:
    rt: Runtime
    server: Recorder
    processor: openai_agents.AgentrtTracingProcessor

    def agent(self, name: str, tools: list[Any], **kwargs: Any) -> Agent[Any]:
        model = openai_agents.model(self.rt, "agent-model")
        return Agent(name=name, model=model, tools=tools, **kwargs)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    cfg = PRESETS["h100-8b"].replace(replies="agent")
    async with Cluster(1, cfg) as cluster:
        server = Recorder(cluster.transport())
        async with Runtime(cluster.base_urls, transport=server) as rt:
            # exclusive: no trace goes to the SDK's default exporter (OpenAI's backend)
            processor = openai_agents.instrument(rt, exclusive=True)
            try:
                yield Env(rt, server, processor)
            finally:
                set_trace_processors([])


@function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await asyncio.sleep(ADD_S)
    return a + b


@function_tool
async def lookup(key: str) -> str:
    """Look a key up."""
    await asyncio.sleep(LOOKUP_S)
    return f"value of {key}"


@function_tool(failure_error_function=None)  # raise out of the run, not back to the model
async def explode() -> str:
    """Fail."""
    raise RuntimeError("tool broke")


@function_tool
async def wait_long() -> str:
    """Take a long time."""
    await asyncio.sleep(30)
    return "late"


def only(reports: list[JobReport]) -> JobReport:
    assert len(reports) == 1, reports
    return reports[0]


TASK = (
    "Do some maths.\n"
    'CALL add {"a": 1, "b": 2}\n'
    'CALL lookup {"key": "pi"} && CALL add {"a": 3, "b": 4}\n'
    "ANSWER 3 and 7"
)


async def test_a_run_is_a_job_whose_agent_is_one_session(env: Env) -> None:
    agent = env.agent("coder", [add, lookup])
    result = await Runner.run(agent, TASK, run_config=RunConfig(workflow_name="fix-bug"))
    assert result.final_output == "3 and 7"
    report = only(env.rt.reports())
    assert report.status == "ok" and report.name == "fix-bug"
    assert report.metadata["trace_id"].startswith("trace_")
    assert report.calls == 3 and report.sessions == 1 and report.tool_waits == 3
    assert sorted(t.name for t in report.tool_reports) == ["add", "add", "lookup"]
    for t in report.tool_reports:
        assert t.status == "ok"
        assert t.duration_s == pytest.approx(ADD_S if t.name == "add" else LOOKUP_S, abs=0.1)
    assert report.tool_s == pytest.approx(2 * ADD_S + LOOKUP_S, abs=0.2)
    (session_id,) = {c.session_id for c in report.call_reports}
    assert [c.turn for c in report.call_reports] == [0, 1, 2]
    assert {c.session_name for c in report.call_reports} == {"coder"}
    # What the server received: every call tagged with the job, the session and its turn.
    assert len(env.server.seen) == 3
    for turn, seen in enumerate(env.server.seen):
        assert seen.meta.job_id == report.job_id
        assert seen.meta.session_id == session_id
        assert seen.meta.turn == turn
        assert seen.meta.parent_session_id is None
        assert seen.body["model"] == "agent-model"
    # The idle time before turns 1 and 2 is the tool waits the session declared.
    idle = env.server.seen[1].meta.idle_s
    assert idle is not None and idle >= ADD_S


async def test_an_agent_as_tool_gets_a_session_under_its_caller(env: Env) -> None:
    helper = env.agent("helper", [add])
    ask = helper.as_tool(tool_name="ask_helper", tool_description="Ask the helper.")
    main = env.agent("main", [lookup, ask])
    sub_task = 'CALL add {"a": 3, "b": 4}\nANSWER helper says 7'
    task = (
        'CALL lookup {"key": "x"}\n'
        f"CALL ask_helper {json.dumps({'input': sub_task})}\n"
        "ANSWER all done"
    )
    result = await Runner.run(main, task)
    assert result.final_output == "all done"
    report = only(env.rt.reports())
    assert report.status == "ok" and report.sessions == 2 and report.calls == 5
    by_name: dict[str | None, set[str]] = {}
    for c in report.call_reports:
        by_name.setdefault(c.session_name, set()).add(c.session_id)
    (main_id,) = by_name["main"]
    (helper_id,) = by_name["helper"]
    assert env.server.sessions() == [main_id, main_id, helper_id, helper_id, main_id]
    for seen in env.server.seen:
        parent = seen.meta.parent_session_id
        assert parent == (main_id if seen.meta.session_id == helper_id else None)
    tools = {(t.name, t.session_id) for t in report.tool_reports}
    assert tools == {("lookup", main_id), ("ask_helper", main_id), ("add", helper_id)}
    # The caller's tool wait spans the helper's whole run (its two calls and its tool).
    ask_wait = next(t for t in report.tool_reports if t.name == "ask_helper")
    assert ask_wait.duration_s >= ADD_S


async def test_a_handoff_target_gets_a_session_under_the_source(env: Env) -> None:
    billing = env.agent("billing", [add])
    triage = env.agent("triage", [], handoffs=[billing])
    task = 'CALL transfer_to_billing {}\nCALL add {"a": 1, "b": 2}\nANSWER billed'
    result = await Runner.run(triage, task)
    assert result.final_output == "billed"
    report = only(env.rt.reports())
    assert report.status == "ok" and report.sessions == 2 and report.calls == 3
    triage_id, billing_id, again = env.server.sessions()
    assert again == billing_id != triage_id
    assert env.server.seen[0].meta.parent_session_id is None
    assert env.server.seen[1].meta.parent_session_id == triage_id
    assert [t.name for t in report.tool_reports] == ["add"]


async def test_concurrent_runs_keep_their_jobs_apart(env: Env) -> None:
    first = env.agent("first", [add])
    second = env.agent("second", [lookup])
    results = await asyncio.gather(
        Runner.run(first, 'CALL add {"a": 1, "b": 1}\nCALL add {"a": 2, "b": 2}\nANSWER one'),
        Runner.run(second, 'CALL lookup {"key": "k"}\nANSWER two'),
    )
    assert [r.final_output for r in results] == ["one", "two"]
    reports = {r.call_reports[0].session_name: r for r in env.rt.reports()}
    assert set(reports) == {"first", "second"}
    assert (reports["first"].calls, reports["first"].tool_waits) == (3, 2)
    assert (reports["second"].calls, reports["second"].tool_waits) == (2, 1)
    for name, report in reports.items():
        assert report.status == "ok" and report.sessions == 1
        assert {c.session_name for c in report.call_reports} == {name}
        mine = [s for s in env.server.seen if s.meta.job_id == report.job_id]
        assert len(mine) == report.calls
        assert {s.meta.session_id for s in mine} == {report.call_reports[0].session_id}
    assert reports["first"].job_id != reports["second"].job_id


async def test_a_streamed_run_is_tagged_the_same(env: Env) -> None:
    agent = env.agent("streamer", [add])
    run = Runner.run_streamed(agent, 'CALL add {"a": 1, "b": 2}\nANSWER streamed')
    async for _ in run.stream_events():
        pass
    assert run.final_output == "streamed"
    report = only(env.rt.reports())
    assert report.status == "ok" and report.calls == 2 and report.tool_waits == 1
    assert all(c.stream for c in report.call_reports)
    assert len(set(env.server.sessions())) == 1


async def test_a_tool_that_raises_ends_the_job_with_error(env: Env) -> None:
    agent = env.agent("fragile", [explode])
    with pytest.raises(UserError, match="tool broke"):
        await Runner.run(agent, "CALL explode {}\nANSWER never")
    report = only(env.rt.reports())
    assert report.status == "error" and report.error is not None
    assert "tool broke" in report.error
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]
    assert report.calls == 1


async def test_a_cancelled_run_ends_the_job_cancelled(env: Env) -> None:
    agent = env.agent("slow", [wait_long])
    with anyio.move_on_after(0.5) as scope:
        await Runner.run(agent, "CALL wait_long {}\nANSWER never")
    assert scope.cancelled_caught
    report = only(env.rt.reports())
    assert report.status == "cancelled"
    assert [(t.name, t.status) for t in report.tool_reports] == [("wait_long", "cancelled")]


async def test_after_shutdown_calls_are_implicit_jobs(env: Env) -> None:
    env.processor.shutdown()
    await Runner.run(env.agent("plain", []), "ANSWER hi")
    report = only(env.rt.reports())
    assert report.name == "call" and report.calls == 1  # agentrt's one-call job


def test_without_the_sdk_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)
    monkeypatch.delitem(sys.modules, "agentrt.integrations.openai_agents")
    with pytest.raises(ImportError, match=r'pip install "agentjct\[openai-agents\]"'):
        importlib.import_module("agentrt.integrations.openai_agents")


async def test_the_example_runs_on_the_embedded_engine(env: Env) -> None:
    spec = importlib.util.spec_from_file_location("openai_agents_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    answer, report = await example.run_agent(env.rt, "agent-model", example.QUESTION)
    assert answer.startswith("391") and report.name == "assistant"
    assert (report.status, report.calls, report.sessions) == ("ok", 5, 2)
    assert [t.name for t in report.tool_reports] == ["calculator", "word_count", "ask_researcher"]


async def test_a_conversation_group_keeps_its_session_ids(env: Env) -> None:
    """Runs with one ``group_id`` (the conversation, e.g. a thread or an SQLiteSession's
    id) give their agent's session the same id in every run and every process."""
    agent = env.agent("coder", [add])

    async def run(group: str | None) -> str:
        await Runner.run(agent, "ANSWER ok", run_config=RunConfig(group_id=group))
        (session_id,) = {c.session_id for c in env.rt.reports()[-1].call_reports}
        return session_id

    first, again, other = await run("chat-1"), await run("chat-1"), await run("chat-2")
    assert first == again and first.startswith("thr-") and other != first
    assert (await run(None)) != (await run(None))
