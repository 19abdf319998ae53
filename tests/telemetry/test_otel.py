"""The OpenTelemetry exporter: span structure on the embedded engine, W3C trace context to
the server, metrics, content capture, and no cost or error without a provider or SDK."""

from __future__ import annotations

import json
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


async def test_a_job_on_the_embedded_engine_makes_agent_chat_and_tool_spans(otel: Otel) -> None:
    job_name = f"coder-{uuid.uuid4().hex[:6]}"
    outer_tracer = trace.get_tracer("test")
    before = time.time_ns()
    async with (
        Cluster(1, small_config()) as cluster,
        Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt,
    ):
        with outer_tracer.start_as_current_span("user request") as outer:
            async with rt.job(job_name) as job, job.session("main") as s:
                await s.chat(model="sim-test", messages=MSG, max_tokens=4)
                # Inside the job its span is current: the user's own spans nest under it.
                assert trace.get_current_span().get_span_context().span_id != (
                    outer.get_span_context().span_id
                )
                async with s.tool("grep", expected_s=0.5):
                    pass
                await s.chat(model="sim-test", messages=MSG, max_tokens=4)
            assert trace.get_current_span() is outer  # detached again
        hook = hook_of(rt)
        assert not hook._jobs and not hook._calls and not hook._tools  # state dropped
    after = time.time_ns()
    spans = otel.finished()
    assert sorted(s.name for s in spans) == [
        "chat sim-test",
        "chat sim-test",
        "execute_tool grep",
        f"invoke_agent {job_name}",
        "user request",
    ]
    named = by_name(spans)
    agent, tool = named[f"invoke_agent {job_name}"], named["execute_tool grep"]
    calls = sorted((s for s in spans if s.name == "chat sim-test"), key=lambda s: s.start_time)  # type: ignore[arg-type,return-value]
    user = named["user request"]
    # One trace; the job under the user's span; calls and the tool wait under the job.
    assert {s.context.trace_id for s in spans} == {user.context.trace_id}
    assert agent.parent is not None and agent.parent.span_id == user.context.span_id
    for child in (*calls, tool):
        assert child.parent is not None and child.parent.span_id == agent.context.span_id
    assert agent.kind is SpanKind.INTERNAL and tool.kind is SpanKind.INTERNAL
    assert all(c.kind is SpanKind.CLIENT for c in calls)
    # Wall-clock nanoseconds, in order.
    for span in (agent, *calls, tool):
        assert span.start_time is not None and span.end_time is not None
        assert before - 10**6 <= span.start_time <= span.end_time <= after + 10**6
    assert agent.start_time <= calls[0].start_time  # type: ignore[operator]
    assert calls[0].end_time <= tool.start_time <= tool.end_time <= calls[1].start_time  # type: ignore[operator]
    assert calls[1].end_time <= agent.end_time  # type: ignore[operator]

    a = attrs(agent)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == job_name
    assert a["agentrt.job.id"] == job.id
    assert a["agentrt.job.status"] == "ok"
    assert a["agentrt.job.calls"] == 2 and a["agentrt.job.tool_waits"] == 1
    report = job.report
    assert report is not None
    assert a["agentrt.job.llm_s"] == pytest.approx(report.llm_s)
    assert a["agentrt.job.critical_llm_s"] == pytest.approx(report.critical_llm_s)
    assert a["agentrt.job.queue_s"] == pytest.approx(report.queue_s)
    assert a["agentrt.job.tool_s"] == pytest.approx(report.tool_s)
    assert a["gen_ai.usage.input_tokens"] == report.prompt_tokens > 0
    assert agent.status.status_code is StatusCode.UNSET

    for turn, (call, cr) in enumerate(zip(calls, report.call_reports, strict=True)):
        c = attrs(call)
        assert c["gen_ai.operation.name"] == "chat"
        assert c["gen_ai.provider.name"] == "openai"
        assert c["gen_ai.request.model"] == "sim-test"
        assert c["gen_ai.conversation.id"] == cr.session_id
        assert c["gen_ai.usage.input_tokens"] == cr.prompt_tokens
        assert c["gen_ai.usage.output_tokens"] == cr.completion_tokens == 4
        assert c["gen_ai.usage.cache_read.input_tokens"] == cr.cached_tokens
        assert c["server.address"] == "replica-0.sim" and c["server.port"] == 80
        assert c["agentrt.endpoint"] == cluster.base_urls[0]
        assert c["agentrt.turn"] == turn and c["agentrt.attempts"] == 1
        assert c["agentrt.call.id"] == cr.call_id
        assert c["agentrt.job.id"] == job.id
        assert c["agentrt.session.id"] == cr.session_id
        assert c["agentrt.queue_s"] == pytest.approx(cr.queue_s)
        assert "gen_ai.input.messages" not in c and "gen_ai.output.messages" not in c
        assert "error.type" not in c
    t = attrs(tool)
    assert t["gen_ai.operation.name"] == "execute_tool"
    assert t["gen_ai.tool.name"] == "grep"
    assert t["agentrt.tool.expected_s"] == 0.5

    # Metrics: per call, per token type, per job; never an id among the attributes.
    durations = [
        p
        for p in otel.points("gen_ai.client.operation.duration")
        if p.attributes.get("gen_ai.request.model") == "sim-test"
        and p.attributes.get("server.address") == "replica-0.sim"
    ]
    assert durations and durations[0].count >= 2
    assert dict(durations[0].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "sim-test",
        "server.address": "replica-0.sim",
        "server.port": 80,
    }
    types = {
        p.attributes["gen_ai.token.type"]
        for p in otel.points("gen_ai.client.token.usage")
        if p.attributes.get("server.address") == "replica-0.sim"
    }
    assert types == {"input", "output"}
    jobs = [
        p
        for p in otel.points("agentrt.job.duration")
        if p.attributes.get("agentrt.job.name") == job_name
    ]
    assert len(jobs) == 1 and jobs[0].count == 1
    assert dict(jobs[0].attributes) == {"agentrt.job.name": job_name, "agentrt.job.status": "ok"}
    assert jobs[0].sum == pytest.approx(report.jct_s)
    phases = {
        p.attributes["agentrt.phase"]: p.sum
        for p in otel.points("agentrt.job.phase.duration")
        if p.attributes.get("agentrt.job.name") == job_name
    }
    assert phases == pytest.approx(
        {
            "queue": report.queue_s,
            "llm": report.llm_s,
            "critical_llm": report.critical_llm_s,
            "tool": report.tool_s,
        }
    )


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
    call, agent = named["chat m"], named["invoke_agent failing"]
    assert call.status.status_code is StatusCode.ERROR
    assert attrs(call)["error.type"] == "400"
    assert agent.status.status_code is StatusCode.ERROR
    assert attrs(agent)["error.type"] == "BadRequestError"
    assert attrs(agent)["agentrt.job.status"] == "error"
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
    assert attrs(named["invoke_agent unreachable"])["error.type"] == "EndpointError"


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
    assert sorted(s.name for s in spans) == ["chat m", "handler"]  # no invoke_agent span
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
