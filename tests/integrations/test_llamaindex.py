"""The LlamaIndex adapter: real FunctionAgent / AgentWorkflow runs with real tool functions
against the embedded engine's scripted replies (CALL / ANSWER directives)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.workflow.errors import WorkflowCancelledByUser

from agentrt import JobReport, Runtime
from agentrt._protocol import CallMetadata, parse_agentrt_header
from agentrt.integrations import llamaindex
from agentrt.sim import PRESETS, Cluster

pytestmark = [
    pytest.mark.anyio,
    # LlamaIndex reads pydantic's deprecated ``__fields__`` and ``model_computed_fields``.
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning"),
]

SLEEP_S = 0.15
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llamaindex_agent.py"


@pytest.fixture
def anyio_backend() -> str:
    # LlamaIndex workflows are asyncio only (asyncio.create_task, futures, queues).
    return "asyncio"


class Recorder:
    """The cluster's transport, recording each request's agentrt metadata (the server's
    view: its x-agentrt header, read with the protocol's reader)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.headers: list[CallMetadata] = []

    async def handle_async_request(self, request: Any) -> Any:
        self.headers.append(parse_agentrt_header(request.headers["x-agentrt"]))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def runtime() -> AsyncIterator[tuple[Runtime, Recorder]]:
    async with Cluster(1, PRESETS["h100-8b"].replace(replies="agent")) as cluster:
        recorder = Recorder(cluster.transport())
        async with Runtime(cluster.base_urls, transport=recorder) as rt:
            llamaindex.instrument(rt)
            try:
                yield rt, recorder
            finally:
                llamaindex.uninstrument(rt)


async def get_weather(city: str) -> str:
    """The weather in a city."""
    await asyncio.sleep(SLEEP_S)
    return f"sunny in {city}"


async def add(a: int, b: int) -> int:
    """Add two numbers."""
    await asyncio.sleep(SLEEP_S)
    return a + b


async def mul(a: int, b: int) -> int:
    """Multiply two numbers."""
    await asyncio.sleep(SLEEP_S)
    return a * b


async def broken(x: int) -> int:
    """A tool that fails."""
    await asyncio.sleep(SLEEP_S)
    raise ValueError("the tool broke")


TASK = (
    "Weather, then maths.\n"
    'CALL get_weather {"city": "Paris"}\n'
    'CALL add {"a": 1, "b": 2}\n'
    'CALL mul {"a": 2, "b": 3}\n'
    "ANSWER sunny; 3 and 6"
)
PARALLEL = (
    "Weather, then maths at once.\n"
    'CALL get_weather {"city": "Paris"}\n'
    'CALL add {"a": 1, "b": 2} && CALL mul {"a": 2, "b": 3}\n'
    "ANSWER sunny; 3 and 6"
)


def agent(
    rt: Runtime,
    name: str = "assistant",
    tools: list[Any] | None = None,
    *,
    streaming: bool = True,
) -> Any:
    return FunctionAgent(
        tools=tools if tools is not None else [get_weather, add, mul],
        llm=llamaindex.model(rt, "m"),
        name=name,
        description=f"the {name}",
        streaming=streaming,
    )


def only(rt: Runtime) -> JobReport:
    reports = rt.reports()
    assert len(reports) == 1, reports
    return reports[0]


async def test_a_function_agent_run_is_a_job() -> None:
    async with runtime() as (rt, recorder):
        result = await agent(rt).run(user_msg=TASK)
    assert str(result) == "sunny; 3 and 6"
    report = only(rt)
    assert report.status == "ok" and report.name == "assistant"
    assert report.metadata["framework"] == "llamaindex"
    assert report.calls == 4 and report.sessions == 1
    assert [t.name for t in report.tool_reports] == ["get_weather", "add", "mul"]
    assert all(t.status == "ok" for t in report.tool_reports)
    assert report.tool_waits == 3
    assert 3 * SLEEP_S <= report.tool_s < 3 * SLEEP_S + 0.2
    assert report.jct_s >= report.tool_s + report.critical_llm_s - 1e-6
    # One session for the agent's calls (streamed), turn after turn.
    session_id = report.call_reports[0].session_id
    assert {c.session_id for c in report.call_reports} == {session_id}
    assert {c.session_name for c in report.call_reports} == {"assistant"}
    assert [c.turn for c in report.call_reports] == [0, 1, 2, 3]
    assert all(c.stream for c in report.call_reports)
    assert {t.session_id for t in report.tool_reports} == {session_id}
    # The server saw the same job and session on every call.
    assert len(recorder.headers) == 4
    assert {h.job_id for h in recorder.headers} == {report.job_id}
    assert {h.session_id for h in recorder.headers} == {session_id}
    assert [h.turn for h in recorder.headers] == [0, 1, 2, 3]
    assert all(h.parent_session_id is None for h in recorder.headers)
    # The idle time of each tool wait reached the server with the next turn.
    assert all((h.idle_s or 0.0) >= SLEEP_S for h in recorder.headers[1:])


async def test_parallel_tool_calls_are_overlapping_tool_waits() -> None:
    # Not streamed: LlamaIndex reads one tool call per streamed delta (as OpenAI sends
    # them), while the embedded engine sends parallel calls in one chunk.
    async with runtime() as (rt, recorder):
        assert str(await agent(rt, streaming=False).run(user_msg=PARALLEL)) == "sunny; 3 and 6"
    report = only(rt)
    assert report.status == "ok" and report.calls == 3 and len(recorder.headers) == 3
    assert not any(c.stream for c in report.call_reports)
    assert [t.name for t in report.tool_reports[:1]] == ["get_weather"]
    first, second = sorted(report.tool_reports[1:], key=lambda t: t.name)
    assert (first.name, second.name) == ("add", "mul")
    assert 3 * SLEEP_S <= report.tool_s < 3 * SLEEP_S + 0.2
    # add and mul ran at the same time.
    assert abs(first.start_s - second.start_s) < SLEEP_S / 2


async def test_a_sub_agent_called_from_a_tool_is_a_session_of_the_same_job() -> None:
    async with runtime() as (rt, recorder):
        researcher = agent(rt, "researcher", [get_weather])

        async def research(city: str) -> str:
            """Ask the researcher about a city."""
            task = f'Look it up.\nCALL get_weather {{"city": "{city}"}}\nANSWER found'
            return str(await researcher.run(user_msg=task))

        lead = agent(rt, "lead", [research])
        task = 'Plan.\nCALL research {"city": "Oslo"}\nANSWER planned'
        assert str(await lead.run(user_msg=task)) == "planned"
    report = only(rt)
    assert report.status == "ok" and report.name == "lead"
    assert report.sessions == 2 and report.calls == 4
    by_session: dict[str, list[int]] = {}
    for h in recorder.headers:
        by_session.setdefault(h.session_id, []).append(h.turn)
    names = {c.session_id: c.session_name for c in report.call_reports}
    lead_id = next(s for s, n in names.items() if n == "lead")
    sub_id = next(s for s, n in names.items() if n == "researcher")
    assert by_session == {lead_id: [0, 1], sub_id: [0, 1]}
    sub_headers = [h for h in recorder.headers if h.session_id == sub_id]
    assert {h.parent_session_id for h in sub_headers} == {lead_id}
    assert all(h.parent_session_id is None for h in recorder.headers if h not in sub_headers)
    assert {h.job_id for h in recorder.headers} == {report.job_id}
    # The lead's tool wait spans the sub-agent's run; the sub-agent's own tool is its own.
    tools = {(t.name, names[t.session_id]) for t in report.tool_reports}
    assert tools == {("research", "lead"), ("get_weather", "researcher")}
    research_s = next(t.duration_s for t in report.tool_reports if t.name == "research")
    assert research_s >= SLEEP_S


async def test_a_handoff_gives_the_next_agent_its_own_session() -> None:
    async with runtime() as (rt, recorder):
        planner = FunctionAgent(
            name="planner",
            description="plans",
            tools=[],
            llm=llamaindex.model(rt, "m"),
            can_handoff_to=["worker"],
        )
        worker = agent(rt, "worker", [add])
        flow = AgentWorkflow(agents=[planner, worker], root_agent="planner")
        task = (
            "Hand over, then add.\n"
            'CALL handoff {"to_agent": "worker", "reason": "it adds"}\n'
            'CALL add {"a": 2, "b": 2}\n'
            "ANSWER 4"
        )
        assert str(await flow.run(user_msg=task)) == "4"
    report = only(rt)
    assert report.status == "ok" and report.name == "AgentWorkflow" and report.sessions == 2
    names = [c.session_name for c in report.call_reports]
    assert names == ["planner", "worker", "worker"]
    planner_id, worker_id = report.call_reports[0].session_id, report.call_reports[1].session_id
    assert [h.session_id for h in recorder.headers] == [
        planner_id,
        worker_id,
        worker_id,
    ]
    assert recorder.headers[1].parent_session_id == planner_id
    assert [(t.name, t.session_id) for t in report.tool_reports] == [
        ("handoff", planner_id),
        ("add", worker_id),
    ]


async def test_concurrent_runs_keep_their_jobs_apart() -> None:
    async with runtime() as (rt, recorder):
        first, second = agent(rt, "first"), agent(rt, "second")

        async def run(one: Any) -> None:
            assert str(await one.run(user_msg=TASK)) == "sunny; 3 and 6"

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, first)
            tg.start_soon(run, second)
    reports = {r.name: r for r in rt.reports()}
    assert set(reports) == {"first", "second"}
    for report in reports.values():
        assert report.status == "ok" and report.calls == 4 and report.tool_waits == 3
        assert report.sessions == 1
        assert {c.session_name for c in report.call_reports} == {report.name}
        sessions = {c.session_id for c in report.call_reports}
        assert len(sessions) == 1
        seen = [h for h in recorder.headers if h.job_id == report.job_id]
        assert len(seen) == 4 and {h.session_id for h in seen} == sessions
    assert reports["first"].job_id != reports["second"].job_id
    assert len(recorder.headers) == 8
    # They did run at the same time.
    a, b = reports["first"], reports["second"]
    assert abs((a.started_at - b.started_at).total_seconds()) < a.jct_s / 2


async def test_a_tool_error_is_reported_and_the_model_sees_it() -> None:
    # FunctionAgent catches a tool's exception and hands its text to the model, so the
    # run goes on: the tool wait is an error, the job ends ok.
    async with runtime() as (rt, _):
        task = 'Try it.\nCALL broken {"x": 1}\nANSWER it failed'
        assert str(await agent(rt, tools=[broken]).run(user_msg=task)) == "it failed"
    report = only(rt)
    assert report.status == "ok" and report.calls == 2
    [tool] = report.tool_reports
    assert tool.name == "broken" and tool.status == "error" and tool.duration_s >= SLEEP_S


async def test_a_run_that_raises_ends_its_job_with_error() -> None:
    async with runtime() as (rt, _):
        with pytest.raises(Exception, match="Max iterations"):
            await agent(rt).run(user_msg=TASK, max_iterations=1)
    report = only(rt)
    assert report.status == "error" and report.error is not None
    assert "Max iterations" in report.error
    assert report.calls == 1 and report.call_reports[0].status == "ok"


async def test_a_cancelled_run_ends_its_job_as_cancelled() -> None:
    started = asyncio.Event()

    async def wait_long(x: int) -> int:
        """A tool that takes long."""
        started.set()
        await asyncio.sleep(30)
        return x

    async with runtime() as (rt, _):
        handler = agent(rt, tools=[wait_long]).run(user_msg='Wait.\nCALL wait_long {"x": 1}')
        with anyio.fail_after(10):
            await started.wait()
        await handler.cancel_run()
        with pytest.raises(WorkflowCancelledByUser):
            await handler
    report = only(rt)
    assert report.status == "cancelled"
    assert [t.status for t in report.tool_reports] == ["cancelled"]


async def test_a_run_cancelled_by_its_callers_scope_ends_as_cancelled() -> None:
    async def wait_long(x: int) -> int:
        """A tool that takes long."""
        await asyncio.sleep(30)
        return x

    async with runtime() as (rt, _):
        with anyio.move_on_after(0.5):
            await agent(rt, tools=[wait_long]).run(user_msg='Wait.\nCALL wait_long {"x": 1}')
        with anyio.fail_after(5):
            while not rt.reports():  # noqa: ASYNC110 - the run's task ends on its own
                await asyncio.sleep(0.01)
    report = only(rt)
    assert report.status == "cancelled"
    assert [t.status for t in report.tool_reports] == ["cancelled"]


async def test_llm_outside_a_run_is_an_implicit_job_and_sync_calls_fail() -> None:
    from llama_index.core.llms import ChatMessage

    async with runtime() as (rt, recorder):
        model = llamaindex.model(rt, "m")
        reply = await model.achat([ChatMessage(role="user", content="hello")])
        assert reply.message.content
        with pytest.raises(Exception) as raised:  # openai wraps what the transport raised
            model.chat([ChatMessage(role="user", content="hello")])
        assert "async only" in str(raised.value.__cause__)
    [report] = [r for r in rt.reports() if r.calls]
    assert report.name == "call" and report.status == "ok"
    assert len(recorder.headers) == 1


async def test_llm_the_name_of_0_2_warns_and_still_works() -> None:
    async with runtime() as (rt, _):
        with pytest.warns(DeprecationWarning, match=r"llm\(rt, model=...\) is deprecated"):
            old = llamaindex.llm(rt, model="m", max_tokens=2)
        new = llamaindex.model(rt, "m", max_tokens=2)
        assert type(old) is type(new) and old.model == new.model == "m"


async def test_instrument_is_idempotent_and_needs_an_open_runtime() -> None:
    async with runtime() as (rt, _):
        assert llamaindex.instrument(rt) is llamaindex.instrument(rt)
        with pytest.raises(ValueError, match="http_client"):
            llamaindex.model(rt, "m", async_http_client=object())
        with pytest.raises(ValueError, match="retries"):
            llamaindex.model(rt, "m", max_retries=2)
    with pytest.raises(Exception, match="closed"):
        llamaindex.instrument(rt)


async def test_the_example_runs_on_the_embedded_engine() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("llamaindex_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    async with runtime() as (rt, _):
        answer, report = await example.run_agent(rt, "m", example.QUESTION)
    assert answer.startswith("391") and report.status == "ok"
    assert report.sessions == 2 and report.calls == 5
    assert {t.name for t in report.tool_reports} == {"calculator", "ask_researcher", "word_count"}
