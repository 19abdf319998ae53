"""The OpenTelemetry exporter: the span tree (workflow -> agents -> calls and tool waits) on
the embedded engine, the reply's and request's attributes, W3C trace context to the
server, the metric names and units, content capture, and no cost or error without a
provider or SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

from agentrt import EndpointError, Retry, Runtime
from agentrt.sim import Cluster
from agentrt.telemetry._otel import _OtelHook
from tests._fake import MSG, FakeEngine
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio

URL = "http://engine.test:8123/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


@dataclass
class Point:
    attributes: dict[str, Any]
    count: int
    sum: float


@dataclass
class Otel:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader | None

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Point]:
        if self.metrics is None:
            pytest.skip("another test installed the global meter provider")
        data = self.metrics.get_metrics_data()
        assert data is not None
        out: list[Point] = []
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        for p in m.data.data_points:
                            assert isinstance(p, HistogramDataPoint)
                            out.append(Point(dict(p.attributes or {}), p.count, p.sum))
        return out


_INSTALLED: Otel | None = None


@pytest.fixture(scope="module")
def _installed() -> Iterator[Otel]:
    """The global providers may be set once per process: set them once, reuse them."""
    global _INSTALLED
    if _INSTALLED is None:
        exporter = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader: InMemoryMetricReader | None = None
        if not isinstance(metrics.get_meter_provider(), MeterProvider):
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _INSTALLED = Otel(exporter, reader)
    yield _INSTALLED
    _INSTALLED.spans.clear()


@pytest.fixture
def otel(_installed: Otel) -> Iterator[Otel]:
    _installed.spans.clear()
    yield _installed
    _installed.spans.clear()


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def hook_of(rt: Runtime) -> _OtelHook:
    return next(h for h in rt._core.hooks if isinstance(h, _OtelHook))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search the code.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def duration_s(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


async def test_a_one_session_job_is_a_workflow_with_one_agent(otel: Otel) -> None:
    """On the embedded engine (its replies play a model that calls a tool): the job's
    workflow span holds one agent span, which holds the calls and the tool wait; the
    calls carry the reply's id, model and finish reasons and the request's max_tokens and
    temperature; the tool span carries the id of the tool call it answers."""
    suffix = uuid.uuid4().hex[:6]
    job_name, agent_name = f"coder-{suffix}", f"main-{suffix}"
    before = time.time_ns()
    async with (
        Cluster(1, small_config(replies="agent")) as cluster,
        Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt,
    ):
        with trace.get_tracer("test").start_as_current_span("user request") as outer:
            async with rt.job(job_name) as job, job.session(agent_name) as s:
                messages: list[dict[str, Any]] = [
                    {"role": "user", "content": 'CALL grep {"q": "x"}\nANSWER found it'}
                ]
                first: Any = await s.chat(
                    model="sim-test", messages=messages, tools=TOOLS, max_tokens=64, temperature=0.5
                )
                # Inside the job its span is current: the user's own spans nest under it.
                assert trace.get_current_span().get_span_context().span_id != (
                    outer.get_span_context().span_id
                )
                (tool_call,) = first.choices[0].message.tool_calls
                async with s.tool("grep", expected_s=0.5):
                    pass
                messages.append(first.choices[0].message.model_dump(exclude_none=True))
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "a.py"})
                second: Any = await s.chat(
                    model="sim-test", messages=messages, tools=TOOLS, max_tokens=64
                )
            assert trace.get_current_span() is outer  # detached again
        hook = hook_of(rt)
        assert not (hook._jobs or hook._agents or hook._calls or hook._tools)  # state dropped
    after = time.time_ns()
    assert first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].finish_reason == "stop"

    spans = otel.finished()
    assert sorted(s.name for s in spans) == [
        "chat sim-test",
        "chat sim-test",
        "execute_tool grep",
        f"invoke_agent {agent_name}",
        f"invoke_workflow {job_name}",
        "user request",
    ]
    named = by_name(spans)
    user = named["user request"]
    workflow = named[f"invoke_workflow {job_name}"]
    agent = named[f"invoke_agent {agent_name}"]
    tool = named["execute_tool grep"]
    calls = sorted((s for s in spans if s.name == "chat sim-test"), key=lambda s: s.start_time or 0)
    # One trace: user request -> workflow -> agent -> calls and the tool wait.
    assert {s.context.trace_id for s in spans if s.context} == {user.context.trace_id}  # type: ignore[union-attr]
    assert parent_id(workflow) == span_id(user)
    assert parent_id(agent) == span_id(workflow)
    assert [parent_id(c) for c in (*calls, tool)] == [span_id(agent)] * 3
    assert workflow.kind is agent.kind is tool.kind is SpanKind.INTERNAL
    assert all(c.kind is SpanKind.CLIENT for c in calls)
    # Wall-clock nanoseconds, in order.
    for span in (workflow, agent, *calls, tool):
        assert span.start_time is not None and span.end_time is not None
        assert before - 10**6 <= span.start_time <= span.end_time <= after + 10**6
    assert workflow.start_time <= agent.start_time <= calls[0].start_time  # type: ignore[operator]
    assert calls[0].end_time <= tool.start_time <= tool.end_time <= calls[1].start_time  # type: ignore[operator]
    assert calls[1].end_time <= agent.end_time <= workflow.end_time  # type: ignore[operator]

    report = job.report
    w = attrs(workflow)
    assert w["gen_ai.operation.name"] == "invoke_workflow"
    assert w["gen_ai.workflow.name"] == job_name
    assert w["agentrt.job.id"] == job.id and w["agentrt.job.status"] == "ok"
    assert w["agentrt.job.calls"] == 2 and w["agentrt.job.tool_waits"] == 1
    assert w["agentrt.job.sessions"] == 1
    assert w["agentrt.job.llm_s"] == pytest.approx(report.llm_s)
    assert w["agentrt.job.critical_llm_s"] == pytest.approx(report.critical_llm_s)
    assert w["agentrt.job.queue_s"] == pytest.approx(report.queue_s)
    assert w["agentrt.job.tool_s"] == pytest.approx(report.tool_s)
    assert workflow.status.status_code is StatusCode.UNSET
    a = attrs(agent)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == agent_name
    assert a["gen_ai.conversation.id"] == s.id
    assert a["gen_ai.usage.input_tokens"] == report.prompt_tokens > 0
    assert a["gen_ai.usage.output_tokens"] == report.completion_tokens > 0
    assert "agentrt.session.parent_id" not in a

    for turn, (call, cr, reply) in enumerate(
        zip(calls, report.call_reports, (first, second), strict=True)
    ):
        c = attrs(call)
        assert c["gen_ai.operation.name"] == "chat"
        assert c["gen_ai.provider.name"] == "openai"
        assert c["gen_ai.request.model"] == "sim-test"
        assert c["gen_ai.request.max_tokens"] == 64
        assert c["gen_ai.response.id"] == reply.id and reply.id.startswith("chatcmpl-")
        assert c["gen_ai.response.model"] == reply.model == "sim-test"
        assert list(c["gen_ai.response.finish_reasons"]) == [reply.choices[0].finish_reason]
        assert c["gen_ai.conversation.id"] == cr.session_id == s.id
        assert c["gen_ai.usage.input_tokens"] == cr.prompt_tokens
        assert c["gen_ai.usage.output_tokens"] == cr.completion_tokens
        assert c["gen_ai.usage.cache_read.input_tokens"] == cr.cached_tokens
        assert c["server.address"] == "replica-0.sim" and c["server.port"] == 80
        assert c["agentrt.endpoint"] == cluster.base_urls[0]
        assert c["agentrt.turn"] == turn and c["agentrt.attempts"] == 1
        assert c["agentrt.call.id"] == cr.call_id
        assert c["agentrt.queue_s"] == pytest.approx(cr.queue_s)
        assert "gen_ai.input.messages" not in c and "gen_ai.output.messages" not in c
        assert "error.type" not in c
    assert attrs(calls[0])["gen_ai.request.temperature"] == 0.5
    assert "gen_ai.request.temperature" not in attrs(calls[1])  # not in that request
    t = attrs(tool)
    assert t["gen_ai.operation.name"] == "execute_tool"
    assert t["gen_ai.tool.name"] == "grep"
    assert t["gen_ai.tool.type"] == "function"
    assert t["gen_ai.tool.call.id"] == tool_call.id
    assert t["gen_ai.agent.name"] == agent_name
    assert t["agentrt.tool.expected_s"] == 0.5

    # Metrics: the convention's names, per call, token type, workflow, agent and tool;
    # never an id among the attributes.
    durations = [
        p
        for p in otel.points("gen_ai.client.operation.duration")
        if p.attributes.get("server.address") == "replica-0.sim"
        and p.attributes.get("gen_ai.response.model") == "sim-test"
    ]
    assert durations and durations[0].count >= 2
    assert dict(durations[0].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "sim-test",
        "gen_ai.response.model": "sim-test",
        "server.address": "replica-0.sim",
        "server.port": 80,
    }
    types = {
        p.attributes["gen_ai.token.type"]
        for p in otel.points("gen_ai.client.token.usage")
        if p.attributes.get("server.address") == "replica-0.sim"
    }
    assert types == {"input", "output"}
    (flow,) = [
        p
        for p in otel.points("gen_ai.workflow.duration")
        if p.attributes.get("gen_ai.workflow.name") == job_name
    ]
    assert flow.count == 1 and flow.attributes == {"gen_ai.workflow.name": job_name}
    assert flow.sum == pytest.approx(report.jct_s)
    (agent_point,) = [
        p
        for p in otel.points("gen_ai.invoke_agent.duration")
        if p.attributes.get("gen_ai.agent.name") == agent_name
    ]
    assert agent_point.count == 1 and agent_point.attributes == {"gen_ai.agent.name": agent_name}
    assert agent_point.sum == pytest.approx(duration_s(agent), abs=1e-6)
    (tool_point,) = [
        p
        for p in otel.points("gen_ai.execute_tool.duration")
        if p.attributes.get("gen_ai.agent.name") == agent_name
    ]
    assert tool_point.attributes == {
        "gen_ai.tool.name": "grep",
        "gen_ai.tool.type": "function",
        "gen_ai.agent.name": agent_name,
    }
    assert tool_point.count == 1
    assert tool_point.sum == pytest.approx(duration_s(tool), abs=1e-6)
    phases = {
        p.attributes["agentrt.phase"]: p.sum
        for p in otel.points("agentrt.job.phase.duration")
        if p.attributes.get("agentrt.job.name") == job_name
    }
    assert phases == pytest.approx(
        {
            "held": report.held_s,
            "queue": report.queue_s,
            "llm": report.llm_s,
            "critical_llm": report.critical_llm_s,
            "tool": report.tool_s,
        }
    )


async def test_a_sub_agent_session_nests_under_its_parents_agent(otel: Otel) -> None:
    """A job whose session spawns a sub-agent session: workflow -> parent agent ->
    sub-agent; each call and tool wait under its own session's agent. The sub-agent's
    streamed call takes its reply's id and model from the chunks."""
    suffix = uuid.uuid4().hex[:6]
    job_name, planner_name, coder_name = f"team-{suffix}", f"planner-{suffix}", f"coder-{suffix}"
    async with (
        Cluster(1, small_config()) as cluster,
        Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt,
    ):
        async with rt.job(job_name) as job, job.session(planner_name) as planner:
            await planner.chat(model="sim-test", messages=MSG, max_tokens=4)
            async with job.session(coder_name, parent=planner) as coder:
                stream: Any = await coder.chat(
                    model="sim-test", messages=MSG, max_tokens=4, stream=True
                )
                chunk_ids = {chunk.id async for chunk in stream}
                async with coder.tool("run"):
                    pass
            await planner.chat(model="sim-test", messages=MSG, max_tokens=4)
        assert not (hook_of(rt)._agents or hook_of(rt)._jobs)
    spans = otel.finished()
    named = by_name(spans)
    workflow = named[f"invoke_workflow {job_name}"]
    planner_span = named[f"invoke_agent {planner_name}"]
    coder_span = named[f"invoke_agent {coder_name}"]
    tool = named["execute_tool run"]
    assert parent_id(planner_span) == span_id(workflow)
    assert parent_id(coder_span) == span_id(planner_span)  # the sub-agent's parent
    chats = [s for s in spans if s.name == "chat sim-test"]
    assert len(chats) == 3
    under = {span_id(planner_span): planner.id, span_id(coder_span): coder.id}
    for chat in chats:  # each call under its own session's agent
        assert under[parent_id(chat)] == attrs(chat)["agentrt.session.id"]  # type: ignore[index]
    assert parent_id(tool) == span_id(coder_span)
    assert attrs(coder_span)["agentrt.session.parent_id"] == planner.id
    assert attrs(coder_span)["gen_ai.conversation.id"] == coder.id
    assert attrs(workflow)["agentrt.job.sessions"] == 2
    # The sub-agent's span lies within its parent's, and both within the workflow.
    assert workflow.start_time <= planner_span.start_time <= coder_span.start_time  # type: ignore[operator]
    assert coder_span.end_time <= planner_span.end_time <= workflow.end_time  # type: ignore[operator]

    (streamed,) = [c for c in chats if attrs(c).get("gen_ai.request.stream")]
    s_attrs = attrs(streamed)
    assert len(chunk_ids) == 1 and s_attrs["gen_ai.response.id"] == chunk_ids.pop()
    assert s_attrs["gen_ai.response.model"] == "sim-test"
    assert list(s_attrs["gen_ai.response.finish_reasons"]) == ["length"]
    assert s_attrs["gen_ai.response.time_to_first_chunk"] > 0
    t = attrs(tool)
    assert t["gen_ai.agent.name"] == coder_name
    assert "gen_ai.tool.call.id" not in t  # its session's reply asked for no tool
    # Per agent, one duration each, as long as its span.
    for name, span in ((planner_name, planner_span), (coder_name, coder_span)):
        (point,) = [
            p
            for p in otel.points("gen_ai.invoke_agent.duration")
            if p.attributes.get("gen_ai.agent.name") == name
        ]
        assert point.count == 1
        assert point.sum == pytest.approx(duration_s(span), abs=1e-6)
    first_chunks = [
        p
        for p in otel.points("gen_ai.client.operation.time_to_first_chunk")
        if p.attributes.get("server.address") == "replica-0.sim"
    ]
    assert sum(p.count for p in first_chunks) >= 1


async def test_tool_spans_take_the_ids_of_a_streamed_replys_parallel_calls(otel: Otel) -> None:
    """A streamed reply asks for two tools at once; the tool waits that follow (in another
    order) each carry the id of the call of their tool, read from the stream's chunks."""
    suffix = uuid.uuid4().hex[:6]
    tools = [TOOLS[0], {"type": "function", "function": {"name": "run", "parameters": {}}}]
    async with (
        Cluster(1, small_config(replies="agent")) as cluster,
        Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt,
    ):
        async with rt.job(f"par-{suffix}") as job, job.session() as s:
            messages = [{"role": "user", "content": "CALL grep {} && CALL run {}"}]
            stream: Any = await s.chat(
                model="sim-test", messages=messages, tools=tools, max_tokens=64, stream=True
            )
            ids: dict[str, str] = {}
            async for chunk in stream:
                for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                    if delta.id:
                        ids[delta.function.name] = delta.id
            assert set(ids) == {"grep", "run"} and len(set(ids.values())) == 2
            for name in ("run", "grep", "grep"):  # the second grep answers no call
                async with s.tool(name):
                    pass
    tool_spans = sorted(
        (x for x in otel.finished() if x.name.startswith("execute_tool")),
        key=lambda x: x.start_time or 0,
    )
    assert [attrs(t).get("gen_ai.tool.call.id") for t in tool_spans] == [
        ids["run"],
        ids["grep"],
        None,
    ]
    (call,) = (x for x in otel.finished() if x.name == "chat sim-test")
    assert list(attrs(call)["gen_ai.response.finish_reasons"]) == ["tool_calls"]


def test_sync_runtime_sessions_get_agent_spans_at_their_first_call(otel: Otel) -> None:
    """SyncRuntime's sessions announce no start: each gets its agent span at its first
    call (or tool wait), ended when the session's block ends, as an async session's."""
    from agentrt import SyncRuntime

    fake = FakeEngine()
    with (
        SyncRuntime([URL], transport=fake.transport()) as rt,
        rt.job("sync-flow") as job,
        job.session("sync-agent") as s,
    ):
        s.chat(model="m", messages=MSG)
        with s.tool("grep"):
            pass
    named = by_name(otel.finished())
    workflow, agent = named["invoke_workflow sync-flow"], named["invoke_agent sync-agent"]
    assert parent_id(agent) == span_id(workflow)
    assert parent_id(named["chat m"]) == parent_id(named["execute_tool grep"]) == span_id(agent)
    tool = named["execute_tool grep"]
    assert agent.end_time is not None and workflow.end_time is not None
    assert tool.end_time is not None and tool.end_time <= agent.end_time <= workflow.end_time


EXPECTED_METRICS = {
    "gen_ai.client.operation.duration": "s",
    "gen_ai.client.token.usage": "{token}",
    "gen_ai.client.operation.time_to_first_chunk": "s",
    "gen_ai.workflow.duration": "s",
    "gen_ai.invoke_agent.duration": "s",
    "gen_ai.execute_tool.duration": "s",
    "agentrt.job.phase.duration": "s",
    "agentrt.journal.lines": "{line}",
}
"""Every metric agentrt emits, with its unit: the GenAI conventions' names (checked at
semantic-conventions-genai 004902b8, docs/telemetry.md) and agentrt's for what they lack."""


async def test_metric_names_and_units(otel: Otel, tmp_path: Any) -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), journal=tmp_path / "j.jsonl") as rt:
        async with rt.job("units") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            stream: Any = await s.chat(model="m", messages=MSG, stream=True)
            async for _ in stream:
                pass
            async with s.tool("grep"):
                pass
    if otel.metrics is None:
        pytest.skip("another test installed the global meter provider")
    data = otel.metrics.get_metrics_data()
    assert data is not None
    units = {
        m.name: m.unit
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        if sm.scope.name == "agentrt"
        for m in sm.metrics
    }
    assert units == EXPECTED_METRICS
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    assert not any(k.endswith(".id") for k in (p.attributes or {}))


async def test_every_attempt_carries_the_call_spans_traceparent(otel: Otel) -> None:
    fake = FakeEngine()
    fake.script.append(lambda request: httpx.Response(503))  # the first attempt fails
    async with Runtime([URL], transport=fake.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    (call,) = (s for s in otel.finished() if s.name == "chat m")
    ctx = call.context
    assert ctx is not None
    want = traceparent(ctx)
    assert [seen.headers.get("traceparent") for seen in fake.seen] == [want, want]
    a = attrs(call)
    assert a["agentrt.attempts"] == 2
    assert a["server.address"] == "engine.test" and a["server.port"] == 8123
    (event,) = call.events
    assert event.name == "agentrt.attempt_failed"
    assert dict(event.attributes or {})["agentrt.error"] == "HTTP 503"


async def test_a_failed_call_and_job_are_errors(otel: Otel) -> None:
    fake = FakeEngine()
    fake.script.append(lambda request: httpx.Response(400, json={"error": {"message": "no"}}))
    async with Runtime([URL], transport=fake.transport(), retry=FAST) as rt:
        with pytest.raises(openai.BadRequestError):
            async with rt.job("failing") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    named = by_name(otel.finished())
    call, workflow = named["chat m"], named["invoke_workflow failing"]
    assert call.status.status_code is StatusCode.ERROR
    assert attrs(call)["error.type"] == "400"
    assert workflow.status.status_code is StatusCode.ERROR
    assert attrs(workflow)["error.type"] == "BadRequestError"
    assert attrs(workflow)["agentrt.job.status"] == "error"
    assert parent_id(call) == span_id(named["invoke_agent failing"])
    failed = [
        p
        for p in otel.points("gen_ai.workflow.duration")
        if p.attributes.get("gen_ai.workflow.name") == "failing"
    ]
    assert failed and failed[0].attributes["error.type"] == "BadRequestError"
    errors = [
        p
        for p in otel.points("gen_ai.client.operation.duration")
        if p.attributes.get("server.address") == "engine.test"
        and p.attributes.get("error.type") == "400"
    ]
    assert errors


async def test_a_call_out_of_connection_attempts_names_the_exception(otel: Otel) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    fake = FakeEngine(script=[refuse, refuse, refuse])
    async with Runtime([URL], transport=fake.transport(), retry=FAST) as rt:
        with pytest.raises(EndpointError):
            async with rt.job("unreachable") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    named = by_name(otel.finished())
    call = named["chat m"]
    assert call.status.status_code is StatusCode.ERROR
    assert attrs(call)["error.type"] == "ConnectError"
    assert [e.name for e in call.events] == ["agentrt.attempt_failed"] * 3
    assert attrs(named["invoke_workflow unreachable"])["error.type"] == "EndpointError"


async def test_capture_content_records_input_and_output_messages(otel: Otel) -> None:
    fake = FakeEngine()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "grep", "arguments": '{"q": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    async with Runtime([URL], transport=fake.transport(), capture_content=True) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=messages)
    (call,) = (s for s in otel.finished() if s.name == "chat m")
    a = attrs(call)
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "grep", "arguments": {"q": "x"}}],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c1", "response": "found"}],
        },
    ]
    assert json.loads(a["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "hello"}],
            "finish_reason": "stop",
        }
    ]


async def test_a_call_outside_a_job_is_a_child_of_the_current_span(otel: Otel) -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport()) as rt:
        client = rt.openai(api_key="x")
        with trace.get_tracer("test").start_as_current_span("handler") as outer:
            await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
        assert not hook_of(rt)._jobs
    spans = otel.finished()
    assert sorted(s.name for s in spans) == ["chat m", "handler"]  # no workflow or agent
    call = by_name(spans)["chat m"]
    assert call.parent is not None
    assert call.parent.span_id == outer.get_span_context().span_id
    ctx = call.context
    assert ctx is not None
    assert fake.seen[0].headers["traceparent"] == traceparent(ctx)


async def test_otel_false_makes_no_spans_and_sends_no_traceparent(otel: Otel) -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), otel=False) as rt:
        assert not any(isinstance(h, _OtelHook) for h in rt._core.hooks)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert otel.finished() == []
    assert "traceparent" not in fake.seen[0].headers


_WITHOUT = """
import sys
sys.modules[{blocked!r}] = None  # as if not installed
import anyio
from agentrt import Runtime
from agentrt.telemetry._otel import otel_hook
from tests._fake import MSG, FakeEngine

print("hook", otel_hook() is not None)

async def main() -> None:
    fake = FakeEngine()
    async with Runtime(["http://e.test/v1"], transport=fake.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    print("traceparent", "traceparent" in fake.seen[0].headers)

anyio.run(main)
"""


@pytest.mark.parametrize(
    ("blocked", "hook"), [("opentelemetry.sdk", False), ("opentelemetry", False)]
)
def test_without_the_sdk_or_the_api_nothing_breaks(blocked: str, hook: bool) -> None:
    """API without an installed SDK provider, or no API at all: no hook (no event is even
    built), no header, no error."""
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(_WITHOUT.format(blocked=blocked))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [f"hook {hook}", "traceparent False"]


_UNUSED = """
import sys
from agentrt.telemetry._otel import otel_hook

print("hook", otel_hook() is not None, "imported", "opentelemetry" in sys.modules)
import opentelemetry.trace
from opentelemetry.sdk.trace import TracerProvider

opentelemetry.trace.set_tracer_provider(TracerProvider())
print("hook", otel_hook() is not None)
"""


def _run_unnamed(code: str) -> list[str]:
    """The first two lines ``code`` prints, run where the environment names no provider."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_PYTHON_")},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:2]


def test_a_program_that_does_not_use_opentelemetry_does_not_import_it() -> None:
    """The runtime's first use imports OpenTelemetry only where a provider may be
    installed: once one is, the hook is there."""
    assert _run_unnamed(_UNUSED) == ["hook False imported False", "hook True"]


_FIRST_RUNTIME = """
import sys, anyio, agentrt

async def main():
    async with agentrt.Runtime(["http://127.0.0.1:9/v1"]):
        pass

anyio.run(main)
print("span hook module", "agentrt.telemetry._otel" in sys.modules)
import opentelemetry.trace
from opentelemetry.sdk.trace import TracerProvider

opentelemetry.trace.set_tracer_provider(TracerProvider())
anyio.run(main)
print("span hook module", "agentrt.telemetry._otel" in sys.modules)
"""


def test_a_runtime_without_opentelemetry_does_not_import_its_span_hook() -> None:
    """Nor the span hook's own module (a few milliseconds of every first Runtime):
    whether a provider may be installed is told before it is imported."""
    assert _run_unnamed(_FIRST_RUNTIME) == ["span hook module False", "span hook module True"]
