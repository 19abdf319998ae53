"""LangChain / LangGraph: real ReAct agents with real tools against the embedded engine
in its scripted-reply mode; what the engine receives is recorded on its side."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.tools import BaseTool, tool

import agentrt
from agentrt._protocol import CallMetadata, parse_agentrt_header
from agentrt.integrations import langchain as lc
from agentrt.sim import PRESETS, Cluster
from agentrt.telemetry import JobReport

pytestmark = pytest.mark.anyio

CONFIG = PRESETS["h100-8b"].replace(replies="agent")
SLEEP = {"add": 0.05, "lookup": 0.12}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LangChain runs on asyncio


def react_agent(llm: Any, tools: Sequence[BaseTool | Any], name: str) -> Any:
    from langchain.agents import create_agent

    return create_agent(llm, list(tools), name=name)


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await asyncio.sleep(SLEEP["add"])
    return a + b


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    await asyncio.sleep(SLEEP["lookup"])
    return f"value of {key}"


@tool
async def explode(reason: str) -> str:
    """A tool that fails."""
    await asyncio.sleep(0.01)
    raise ValueError(reason)


@tool
def add_sync(a: int, b: int) -> int:
    """Add two integers (blocking)."""
    time.sleep(SLEEP["add"])
    return a + b


class Recorder(httpx.AsyncBaseTransport):
    """The engine's side of the wire: the agentrt metadata of every chat request it
    receives (its x-agentrt header, read with the protocol's reader)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[CallMetadata] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            self.requests.append(parse_agentrt_header(request.headers["x-agentrt"]))
        return await self.inner.handle_async_request(request)


@pytest.fixture
async def served() -> AsyncIterator[tuple[agentrt.Runtime, Recorder]]:
    async with Cluster(1, CONFIG) as cluster:
        recorder = Recorder(cluster.transport())
        async with agentrt.Runtime(cluster.base_urls, transport=recorder) as rt:
            yield rt, recorder


def task(*lines: str) -> dict[str, Any]:
    return {"messages": [("user", "\n".join(lines))]}


def tool_seconds(report: JobReport, name: str) -> list[float]:
    return [t.duration_s for t in report.tool_reports if t.name == name]


async def test_react_agent_is_one_job_one_session(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    agent = react_agent(lc.model(rt, "m"), [add, lookup], "solver")
    handler = lc.instrument(rt)
    out = await agent.ainvoke(
        task(
            'CALL add {"a": 1, "b": 2} && CALL lookup {"key": "x"}',
            'CALL lookup {"key": "y"}',
            "ANSWER three",
        ),
        config={"callbacks": [handler], "metadata": {"ticket": "T-1"}},
    )
    assert out["messages"][-1].content == "three"
    (report,) = rt.reports()
    assert report.status == "ok" and report.name == "solver"
    assert report.metadata == {"ticket": "T-1"}
    assert report.calls == 3 and report.tool_waits == 3 and report.sessions == 1
    assert sorted(t.name for t in report.tool_reports) == ["add", "lookup", "lookup"]
    for name, seconds in SLEEP.items():
        for d in tool_seconds(report, name):
            assert seconds <= d < seconds + 0.1
    (session_id,) = {c.session_id for c in report.call_reports}
    assert {t.session_id for t in report.tool_reports} == {session_id}
    assert [c.session_name for c in report.call_reports] == ["solver/model"] * 3
    assert [c.turn for c in report.call_reports] == [0, 1, 2]
    # The engine saw agentrt's tags on every call.
    assert len(recorder.requests) == 3
    assert [h.job_id for h in recorder.requests] == [report.job_id] * 3
    assert [h.session_id for h in recorder.requests] == [session_id] * 3
    assert [h.turn for h in recorder.requests] == [0, 1, 2]
    assert recorder.requests[0].parent_session_id is None
    # The second and third calls carry the tool time the session was idle for.
    assert (recorder.requests[2].idle_s or 0.0) >= SLEEP["lookup"]
    assert handler._runs == {}


async def test_a_sub_agent_has_its_own_session_linked_to_its_parent(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    llm = lc.model(rt, "m")
    helper = react_agent(llm, [add], "helper")

    @tool
    async def delegate(job: str) -> str:
        """Hand a job to the helper agent."""
        out = await helper.ainvoke(task(job))  # the callbacks follow the run tree
        return str(out["messages"][-1].content)

    boss = react_agent(llm, [delegate], "boss")
    inner = 'CALL add {"a": 1, "b": 2}\nANSWER 3'
    call = f"CALL delegate {json.dumps({'job': inner})}"
    await boss.ainvoke(task(call, "ANSWER done"), config={"callbacks": [lc.instrument(rt)]})
    (report,) = rt.reports()
    assert report.status == "ok" and report.name == "boss"
    assert report.sessions == 2 and report.calls == 4
    by_name: dict[str | None, set[str]] = {}
    for c in report.call_reports:
        by_name.setdefault(c.session_name, set()).add(c.session_id)
    assert sorted(by_name) == ["boss/model", "helper/model"]
    (boss_id,) = by_name["boss/model"]
    (helper_id,) = by_name["helper/model"]
    # The helper's calls name the boss's session as their parent, on the wire.
    helper_calls = [h for h in recorder.requests if h.session_id == helper_id]
    assert len(helper_calls) == 2
    assert {h.parent_session_id for h in helper_calls} == {boss_id}
    # The boss waited on 'delegate' while the helper worked (its 'add' inside).
    tools = {t.name: t for t in report.tool_reports}
    assert tools["delegate"].session_id == boss_id and tools["add"].session_id == helper_id
    assert tools["delegate"].duration_s > tools["add"].duration_s >= SLEEP["add"]


async def test_concurrent_agents_keep_their_jobs_apart(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    handler = lc.instrument(rt)
    agent = react_agent(lc.model(rt, "m"), [add, lookup], "worker")
    jobs = [
        task('CALL lookup {"key": "a"}', 'CALL add {"a": 1, "b": 1}', "ANSWER a"),
        task('CALL add {"a": 2, "b": 2}', "ANSWER b"),
    ]
    outs = await asyncio.gather(*(agent.ainvoke(j, config={"callbacks": [handler]}) for j in jobs))
    assert [o["messages"][-1].content for o in outs] == ["a", "b"]
    reports = sorted(rt.reports(), key=lambda r: r.calls, reverse=True)
    assert [(r.status, r.calls, r.tool_waits) for r in reports] == [("ok", 3, 2), ("ok", 2, 1)]
    assert [sorted(t.name for t in r.tool_reports) for r in reports] == [
        ["add", "lookup"],
        ["add"],
    ]
    sessions = [{c.session_id for c in r.call_reports} for r in reports]
    assert all(len(s) == 1 for s in sessions) and not sessions[0] & sessions[1]
    for r, (sid,) in zip(reports, sessions, strict=True):
        mine = [h for h in recorder.requests if h.job_id == r.job_id]
        assert len(mine) == r.calls and {h.session_id for h in mine} == {sid}


async def test_a_tool_that_raises_ends_the_job_with_an_error(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, _ = served
    agent = react_agent(lc.model(rt, "m"), [explode], "fragile")
    with pytest.raises(ValueError, match="boom"):
        await agent.ainvoke(
            task('CALL explode {"reason": "boom"}', "ANSWER never"),
            config={"callbacks": [lc.instrument(rt)]},
        )
    (report,) = rt.reports()
    assert report.status == "error" and "ValueError: boom" in (report.error or "")
    assert report.calls == 1
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]


async def test_a_cancelled_run_ends_its_job_cancelled(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, _ = served
    entered = asyncio.Event()

    @tool
    async def hang(key: str) -> str:
        """A tool that never returns."""
        entered.set()
        await asyncio.sleep(60)
        return key

    agent = react_agent(lc.model(rt, "m"), [hang], "patient")
    inputs = task('CALL hang {"key": "x"}', "ANSWER x")
    run = asyncio.ensure_future(agent.ainvoke(inputs, config={"callbacks": [lc.instrument(rt)]}))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    (report,) = rt.reports()
    assert report.status == "cancelled"
    assert [(t.name, t.status) for t in report.tool_reports] == [("hang", "cancelled")]


async def test_streaming_calls_are_the_sessions_turns(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    agent = react_agent(lc.model(rt, "m", streaming=True), [add], "streamer")
    chunks = [
        c
        async for c in agent.astream(
            task('CALL add {"a": 1, "b": 2}', "ANSWER 3"),
            config={"callbacks": [lc.instrument(rt)]},
            stream_mode="messages",
        )
    ]
    assert chunks
    (report,) = rt.reports()
    assert report.status == "ok" and report.calls == 2 and report.tool_waits == 1
    assert all(c.stream for c in report.call_reports)
    assert len({c.session_id for c in report.call_reports}) == 1
    assert {h.job_id for h in recorder.requests} == {report.job_id}


async def test_a_lone_model_call_is_a_job(served: tuple[agentrt.Runtime, Recorder]) -> None:
    rt, recorder = served
    llm = lc.model(rt, "m")
    reply = await llm.ainvoke("hello", config={"callbacks": [lc.instrument(rt)]})
    assert reply.content
    (report,) = rt.reports()
    assert report.status == "ok" and report.calls == 1 and report.name == "ChatOpenAI"
    assert recorder.requests[0].job_id == report.job_id


async def test_the_names_of_0_2_warn_and_still_work(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    with pytest.warns(DeprecationWarning, match=r"chat_model\(rt, model=...\) is deprecated"):
        llm = lc.chat_model(rt, model="m")
    with pytest.warns(DeprecationWarning, match=r"callbacks\(rt\) is deprecated .* instrument"):
        handler = lc.callbacks(rt)
    assert isinstance(llm, lc.ChatOpenAI) and llm.model_name == "m"
    assert isinstance(handler, lc.AgentrtCallbackHandler)
    await llm.ainvoke("hello", config={"callbacks": [handler]})
    (report,) = rt.reports()
    assert report.status == "ok" and report.calls == 1
    assert recorder.requests[0].job_id == report.job_id


async def test_without_the_handler_calls_join_the_enclosing_session(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, _ = served
    llm = lc.model(rt, "m")
    async with rt.job("mine") as job, job.session("s") as s:
        await llm.ainvoke("hello")
        await llm.ainvoke("again")
    assert job.report.calls == 2
    assert {c.session_id for c in job.report.call_reports} == {s.id}


async def test_without_the_handler_or_a_session_calls_join_the_jobs_default_session(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    rt, recorder = served
    llm = lc.model(rt, "m")
    async with rt.job("mine") as job:
        await llm.ainvoke("hello")
        await llm.ainvoke("again")
    report = job.report
    assert report.calls == 2 and report.sessions == 1 and rt.reports() == [report]
    (default,) = report.session_reports
    assert default.name == "default"
    assert {c.session_id for c in report.call_reports} == {default.session_id}
    assert [(m.job_id, m.turn) for m in recorder.requests] == [(job.id, 0), (job.id, 1)]


async def test_the_wrong_side_fails_clearly(served: tuple[agentrt.Runtime, Recorder]) -> None:
    rt, recorder = served
    llm = lc.model(rt, "m")
    with pytest.raises(agentrt.AgentrtError, match="ainvoke"):
        llm.invoke("hello")
    assert recorder.requests == []
    with pytest.raises(ValueError, match="http_client"):
        lc.model(rt, "m", http_client=httpx.Client())
    with pytest.raises(ValueError, match="retries"):
        lc.model(rt, "m", max_retries=2)
    assert lc.model(rt, "m").openai_api_base == rt.endpoints[0].url


@pytest.fixture
def sync_served() -> Iterator[tuple[agentrt.SyncRuntime, Recorder]]:
    cluster = Cluster(1, CONFIG)
    recorder = Recorder(cluster.transport())
    with agentrt.SyncRuntime(cluster.base_urls, transport=recorder) as srt:
        assert srt._portal is not None
        # The engines run in the runtime's own event loop.
        with srt._portal.wrap_async_context_manager(cluster):
            yield srt, recorder


def test_sync_invoke_through_a_sync_runtime(
    sync_served: tuple[agentrt.SyncRuntime, Recorder],
) -> None:
    srt, recorder = sync_served
    agent = react_agent(lc.model(srt, "m"), [add_sync], "sync-solver")
    handler = lc.instrument(srt)
    out = agent.invoke(
        task('CALL add_sync {"a": 1, "b": 2} && CALL add_sync {"a": 3, "b": 4}', "ANSWER 3, 7"),
        config={"callbacks": [handler]},
    )
    assert out["messages"][-1].content == "3, 7"
    (report,) = srt.reports()
    assert report.status == "ok" and report.name == "sync-solver"
    assert report.calls == 2 and report.tool_waits == 2 and report.sessions == 1
    assert all(SLEEP["add"] <= d < SLEEP["add"] + 0.1 for d in tool_seconds(report, "add_sync"))
    (sid,) = {c.session_id for c in report.call_reports}
    assert [h.session_id for h in recorder.requests] == [sid, sid]
    with pytest.raises(agentrt.AgentrtError, match="invoke"):
        asyncio.run(lc.model(srt, "m").ainvoke("hi"))
    assert handler._runs == {}


def test_a_clear_error_without_langchain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_openai", None)
    monkeypatch.delitem(sys.modules, "agentrt.integrations.langchain")
    with pytest.raises(ImportError, match=r'pip install "agentjct\[langchain\]"'):
        importlib.import_module("agentrt.integrations.langchain")


async def test_the_example_runs_on_the_embedded_engine(
    served: tuple[agentrt.Runtime, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = ROOT
    monkeypatch.chdir(root)  # its word_count reads README.md
    spec = importlib.util.spec_from_file_location(
        "langchain_agent", root / "examples" / "langchain_agent.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rt, _ = served
    answer, report = await example.run_agent(rt, "agent-model", example.QUESTION)
    assert answer.startswith("391")
    assert report.status == "ok" and report.name == "assistant" and report.sessions == 2
    assert sorted(t.name for t in report.tool_reports) == [
        "ask_researcher",
        "calculator",
        "word_count",
    ]


async def test_a_thread_keeps_its_session_ids_from_run_to_run(
    served: tuple[agentrt.Runtime, Recorder],
) -> None:
    """Runs of one LangGraph thread (``configurable.thread_id``) give their agent's
    session the same id, wherever they run: a later run, on another worker too, is
    routed to the replica that holds the thread's KV (docs/routing.md, "Fleets")."""
    rt, _ = served
    agent = react_agent(lc.model(rt, "m"), [add], "solver")
    handler = lc.instrument(rt)

    async def run(thread: str | None) -> str:
        configurable = {} if thread is None else {"thread_id": thread}
        await agent.ainvoke(
            task("ANSWER ok"),
            config={"callbacks": [handler], "configurable": configurable},
        )
        (session_id,) = {c.session_id for c in rt.reports()[-1].call_reports}
        return session_id

    first, again, other = await run("t-1"), await run("t-1"), await run("t-2")
    assert first == again and first.startswith("thr-") and other != first
    assert (await run(None)) != (await run(None))  # no thread: a fresh id per run
    assert lc_thread_id("t-1", "solver/model", 0) == first


def lc_thread_id(thread: str, name: str, n: int) -> str:
    from agentrt.integrations._bridge import thread_session_id

    return thread_session_id(thread, name, n)
