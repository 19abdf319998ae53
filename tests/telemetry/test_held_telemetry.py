"""Time held by load control, as every exporter shows it: a runtime whose replica is full
holds a session's next call at its tool boundary; the call's event, its OpenTelemetry span
and the job's span and phase metric, the Prometheus histogram and gauges, and the journal
all carry the time held."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from agentrt import Endpoint, LoadControl, Runtime
from agentrt.telemetry import CallSent, Event, JobReport, read_journal
from agentrt.telemetry._otel import _OtelHook
from tests._fake import FakeEngine

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]


class Held:
    """One run where job a's second call is held while job b's context fills the
    replica, and what each exporter saw of it."""

    def __init__(self, tmp: Path) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.otel = _OtelHook(
            capture_content=False,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[self.reader]),
        )
        self.registry = CollectorRegistry()
        self.sent: list[CallSent] = []
        self.journal = tmp / "journal.jsonl"
        self.held_while_b_ran: float | None = None
        self.after: tuple[float | None, float | None] = (None, None)
        self.reports: dict[str, JobReport] = {}

    def hook(self, event: Event) -> None:
        if isinstance(event, CallSent):
            self.sent.append(event)

    async def run(self) -> None:
        fake = FakeEngine(prompt_tokens=550, completion_tokens=50, delay_s=0.3)
        rt = Runtime(
            [Endpoint("http://engine.test/v1", kv_capacity=1000)],
            transport=fake.transport(),
            api_key="k",
            poll_metrics_s=None,
            load_control=LoadControl(watermark=1.0, tick_s=0.01),
            hooks=[self.hook, self.otel],
            otel=False,
            prometheus=self.registry,
            journal=self.journal,
        )
        a_ran, b_runs = anyio.Event(), anyio.Event()
        async with rt:

            async def a() -> None:
                async with rt.job("a") as job, job.session("main") as s:
                    await s.chat(model="m", messages=ASK)
                    a_ran.set()
                    await b_runs.wait()
                    await anyio.sleep(0.05)  # b's call (600) runs beside a's context (600)
                    await s.chat(model="m", messages=ASK)  # held until b's call ends

            async def sample_while_a_waits() -> None:
                await anyio.sleep(0.15)
                self.held_while_b_ran = self.sample("agentrt_sessions_held")

            async def b() -> None:
                async with rt.job("b") as job, job.session("main") as s:
                    await a_ran.wait()
                    await s.chat(model="m", messages=ASK)  # b's context: 600
                    b_runs.set()
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(sample_while_a_waits)
                        # No call runs: the replica takes b whatever a's context leaves.
                        await s.chat(model="m", messages=ASK)

            async with anyio.create_task_group() as tg:
                tg.start_soon(a)
                tg.start_soon(b)
            self.reports = {r.name: r for r in rt.reports()}
            self.after = (
                self.sample("agentrt_sessions_held"),
                self.sample("agentrt_load_control_forced_total"),
            )

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def span_attributes(self, name: str) -> list[dict[str, Any]]:
        return [dict(s.attributes or {}) for s in self.spans.get_finished_spans() if s.name == name]

    def phases(self, job: str) -> dict[str, float]:
        data = self.reader.get_metrics_data()
        assert data is not None
        out: dict[str, float] = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != "agentrt.job.phase.duration":
                        continue
                    for p in m.data.data_points:
                        assert isinstance(p, HistogramDataPoint)
                        attrs = dict(p.attributes or {})
                        if attrs["agentrt.job.name"] == job:
                            out[str(attrs["agentrt.phase"])] = p.sum
        return out


@pytest.fixture
async def held(tmp_path: Path) -> Held:
    run = Held(tmp_path)
    await run.run()
    return run


async def test_the_held_call_and_its_job_carry_the_time_held(held: Held) -> None:
    a, b = held.reports["a"], held.reports["b"]
    second = a.call_reports[1]
    assert 0.1 <= second.held_s < 10.0  # b's call takes 0.3 s (a loaded machine: more)
    assert a.held_s == second.held_s and b.held_s == 0.0
    # the call's latency holds its time held, then its queue time, then its service
    assert second.latency_s is not None and second.latency_s > second.held_s + second.queue_s
    # CallSent: the held call's attempt says how long it was held; the others 0
    by_call = {e.call_id: e.held_s for e in held.sent}
    assert by_call[second.call_id] == second.held_s
    assert sorted(by_call.values()) == [0.0, 0.0, 0.0, second.held_s]


async def test_otel_spans_and_the_phase_metric_show_the_time_held(held: Held) -> None:
    a, b = held.reports["a"], held.reports["b"]
    second = a.call_reports[1]
    (job_a,) = held.span_attributes("invoke_workflow a")
    (job_b,) = held.span_attributes("invoke_workflow b")
    assert job_a["agentrt.job.held_s"] == pytest.approx(a.held_s)
    assert job_b["agentrt.job.held_s"] == b.held_s == 0.0
    calls = {c["agentrt.call.id"]: c for c in held.span_attributes("chat m")}
    assert calls[second.call_id]["agentrt.held_s"] == pytest.approx(second.held_s)
    assert calls[a.call_reports[0].call_id]["agentrt.held_s"] == 0.0
    assert held.phases("a") == pytest.approx(
        {
            "held": a.held_s,
            "queue": a.queue_s,
            "llm": a.llm_s,
            "critical_llm": a.critical_llm_s,
            "tool": a.tool_s,
        }
    )
    assert held.phases("b")["held"] == 0.0


async def test_prometheus_counts_the_hold_and_the_sessions_held(held: Held) -> None:
    a = held.reports["a"]
    labels = {"job_name": "a", "endpoint_url": "http://engine.test/v1"}
    assert held.sample("agentrt_call_held_seconds_count", **labels) == 1
    assert held.sample("agentrt_call_held_seconds_sum", **labels) == pytest.approx(a.held_s)
    assert held.sample("agentrt_call_held_seconds_bucket", le="0.01", **labels) == 0
    # job b's calls were not held: no series of its own
    assert (
        held.sample(
            "agentrt_call_held_seconds_count", job_name="b", endpoint_url=labels["endpoint_url"]
        )
        is None
    )
    assert held.held_while_b_ran == 1  # a's session, held while b ran
    assert held.after == (0, 0)  # none held once it went on; no forced admission


async def test_the_journal_keeps_the_time_held(held: Held) -> None:
    reports = {r.name: r for r in read_journal(held.journal)}
    assert reports["a"].held_s == pytest.approx(held.reports["a"].held_s)
    assert reports["a"].call_reports[1].held_s == pytest.approx(held.reports["a"].held_s)
    assert reports["b"].held_s == 0.0


async def test_a_runtime_that_is_gone_leaves_the_load_series() -> None:
    registry = CollectorRegistry()
    rt = Runtime(
        [Endpoint("http://engine.test/v1", kv_capacity=1000)],
        api_key="k",
        poll_metrics_s=None,
        prometheus=registry,
        otel=False,
    )
    assert registry.get_sample_value("agentrt_sessions_held") == 0
    del rt
    gc.collect()
    assert registry.get_sample_value("agentrt_sessions_held") is None


async def test_without_load_control_prometheus_has_no_load_series() -> None:
    registry = CollectorRegistry()
    fake = FakeEngine(prompt_tokens=10, completion_tokens=5)
    async with Runtime(
        ["http://engine.test/v1"],
        transport=fake.transport(),
        api_key="k",
        poll_metrics_s=None,
        load_control=False,
        prometheus=registry,
        otel=False,
    ) as rt:
        async with rt.job("j") as job, job.session("main") as s:
            await s.chat(model="m", messages=ASK)
    names = {s.name for m in registry.collect() for s in m.samples}
    assert "agentrt_call_duration_seconds_count" in names
    assert not {n for n in names if "held" in n or "load_control" in n}
