"""``OTEL_SEMCONV_STABILITY_OPT_IN``: today's GenAI names by default (semantic-conventions-genai
004902b8), the latest ones with ``gen_ai_latest_experimental`` (migration.md at 32c328e8),
both with ``gen_ai_latest_experimental/dup``; each set read back through the SDK's in-memory
metric reader and span exporter (private providers: the global ones stay untouched)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrt import Runtime
from agentrt.telemetry import _otel
from agentrt.telemetry._otel import SemconvMode, _OtelHook, otel_hook, semconv_mode
from tests._fake import MSG, FakeEngine

URL = "http://engine.test:8123/v1"

COMMON = {"gen_ai.invoke_agent.duration", "gen_ai.execute_tool.duration"}
COMMON |= {"agentrt.job.phase.duration"}
DEFAULT_NAMES = {
    "gen_ai.client.operation.duration",
    "gen_ai.client.token.usage",
    "gen_ai.client.operation.time_to_first_chunk",
    "gen_ai.workflow.duration",
}
LATEST_NAMES = {
    "gen_ai.client.inference.duration",
    "gen_ai.client.inference.time_to_first_chunk",
    # usage-metrics.yaml at 2f4c6b1c: histograms per operation, counters "detailed"
    "gen_ai.client.inference.usage.input_tokens",
    "gen_ai.client.inference.usage.output_tokens",
    "gen_ai.client.inference.usage.detailed.input_tokens",
    "gen_ai.client.inference.usage.detailed.output_tokens",
    "gen_ai.client.inference.usage.detailed.cache_read.input_tokens",
    "gen_ai.invoke_workflow.duration",
}
DETAILED_NAMES = {  # only where the server reports them
    "gen_ai.client.inference.usage.detailed.cache_write.input_tokens",
    "gen_ai.client.inference.usage.detailed.reasoning.output_tokens",
}
CALL_ATTRS = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "m",
    "gen_ai.response.model": "m",
    "server.address": "engine.test",
    "server.port": 8123,
}


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, "default"),
        ("", "default"),
        ("http", "default"),
        ("http/dup, database", "default"),
        ("gen_ai_latest_experimental", "latest"),
        ("http,  GEN_AI_LATEST_EXPERIMENTAL ", "latest"),
        ("gen_ai_latest_experimental/dup", "both"),
        ("gen_ai_latest_experimental,gen_ai_latest_experimental/dup", "both"),
        ("gen_ai_latest", "default"),
    ],
)
def test_the_opt_in_values(value: str | None, mode: str) -> None:
    assert semconv_mode(value) == mode


def test_the_hook_reads_the_variable_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_OtelHook, "_sdk_installed", lambda self: True)
    for value, mode in [("gen_ai_latest_experimental", "latest"), ("http", "default")]:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", value)
        hook = otel_hook()
        assert isinstance(hook, _OtelHook) and hook.semconv == mode
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN")
    hook = otel_hook()
    assert isinstance(hook, _OtelHook) and hook.semconv == "default"


def test_a_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="'default', 'latest' or 'both'"):
        _OtelHook(capture_content=False, semconv="new")  # type: ignore[arg-type]


def detailed_reply(request: httpx.Request) -> httpx.Response:
    """A chat reply whose usage says what it wrote to the cache and spent reasoning."""
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 6},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m"}
    return httpx.Response(200, json={**body, "choices": [choice], "usage": usage})


async def run_job(
    mode: SemconvMode, embeddings: bool = False, details: bool = False
) -> tuple[dict[str, Any], InMemorySpanExporter]:
    """One job: a plain call, a streamed one and a tool wait (or one embeddings call); the
    metrics read back as ``{name: (unit, [(attributes, value)])}`` (value: a histogram's
    count and sum, or a counter's value)."""
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    hook = _OtelHook(
        capture_content=False,
        semconv=mode,
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    fake = FakeEngine(prompt_tokens=10, completion_tokens=5, cached_tokens=4)
    if embeddings:
        emb = {"object": "list", "data": [{"embedding": [0.1], "index": 0}], "model": "m"}
        emb["usage"] = {"prompt_tokens": 3, "total_tokens": 3}
        fake.script.append(lambda _: httpx.Response(200, json=emb))
    if details:
        fake.script.append(detailed_reply)
    async with Runtime([URL], transport=fake.transport(), hooks=[hook], otel=False) as rt:
        if embeddings:
            async with rt.job("flow") as job, job.session("main"):
                await rt.openai().embeddings.create(model="m", input="x")
        else:
            async with rt.job("flow") as job, job.session("main") as s:
                await s.chat(model="m", messages=MSG)
                stream: Any = await s.chat(model="m", messages=MSG, stream=True)
                async for _ in stream:
                    pass
                async with s.tool("grep"):
                    pass
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, Any] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "agentrt"
            for m in sm.metrics:
                points: list[tuple[dict[str, Any], Any]] = []
                for p in m.data.data_points:
                    if isinstance(p, HistogramDataPoint):
                        assert isinstance(m.data, Histogram)
                        points.append((dict(p.attributes or {}), (p.count, p.sum)))
                    else:
                        assert isinstance(p, NumberDataPoint)
                        assert isinstance(m.data, Sum) and m.data.is_monotonic  # a counter
                        points.append((dict(p.attributes or {}), p.value))
                out[m.name] = (m.unit, points)
    return out, spans


@pytest.mark.anyio
async def test_default_mode_emits_todays_names_only() -> None:
    got, spans = await run_job("default")
    assert set(got) == DEFAULT_NAMES | COMMON
    unit, points = got["gen_ai.client.token.usage"]
    assert unit == "{token}"
    assert sorted((a["gen_ai.token.type"], v) for a, v in points) == [
        ("input", (2, 20)),
        ("output", (2, 10)),
    ]
    assert got["gen_ai.client.operation.duration"][1][0][0] == CALL_ATTRS
    assert got["gen_ai.workflow.duration"][1][0][0] == {"gen_ai.workflow.name": "flow"}
    agent = next(s for s in spans.get_finished_spans() if s.name == "invoke_agent main")
    assert (agent.attributes or {})["gen_ai.usage.cache_read.input_tokens"] == 8


@pytest.mark.anyio
async def test_latest_mode_emits_the_new_names_only() -> None:
    got, spans = await run_job("latest")
    assert set(got) == LATEST_NAMES | COMMON
    usage = {**CALL_ATTRS, "gen_ai.token.modality": "unknown"}
    for name, total in [  # counters (a plain value), by modality
        ("gen_ai.client.inference.usage.detailed.input_tokens", 20),
        ("gen_ai.client.inference.usage.detailed.output_tokens", 10),
        ("gen_ai.client.inference.usage.detailed.cache_read.input_tokens", 8),
    ]:
        assert got[name] == ("{token}", [(usage, total)])
    # histograms (count, sum) under the names the counters had before: no modality
    assert got["gen_ai.client.inference.usage.input_tokens"] == (
        "{token}",
        [(CALL_ATTRS, (2, 20))],
    )
    assert got["gen_ai.client.inference.usage.output_tokens"] == (
        "{token}",
        [(CALL_ATTRS, (2, 10))],
    )
    unit, [(a, (count, _))] = got["gen_ai.client.inference.duration"]
    assert (unit, a, count) == ("s", CALL_ATTRS, 2)
    unit, [(a, (count, _))] = got["gen_ai.client.inference.time_to_first_chunk"]
    assert (unit, a, count) == ("s", CALL_ATTRS, 1)  # the streamed call only
    unit, [(a, (count, _))] = got["gen_ai.invoke_workflow.duration"]
    assert (unit, a, count) == ("s", {"gen_ai.workflow.name": "flow"}, 1)
    finished = {s.name: dict(s.attributes or {}) for s in spans.get_finished_spans()}
    agent = finished["invoke_agent main"]
    assert "gen_ai.usage.cache_read.input_tokens" not in agent  # dropped upstream (#469)
    assert agent["gen_ai.usage.input_tokens"] == 20
    assert finished["chat m"]["gen_ai.usage.cache_read.input_tokens"] == 4
    assert not any("cache_creation" in k for attrs in finished.values() for k in attrs)


@pytest.mark.anyio
async def test_dup_mode_emits_both() -> None:
    got, spans = await run_job("both")
    assert set(got) == DEFAULT_NAMES | LATEST_NAMES | COMMON
    assert got["gen_ai.client.operation.duration"][1][0][1][0] == 2
    assert got["gen_ai.client.inference.duration"][1][0][1][0] == 2
    agent = next(s for s in spans.get_finished_spans() if s.name == "invoke_agent main")
    assert (agent.attributes or {})["gen_ai.usage.cache_read.input_tokens"] == 8


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["default", "latest", "both"])
async def test_embeddings_stay_on_the_operation_duration(mode: SemconvMode) -> None:
    """Embeddings are not inference: ``gen_ai.client.operation.duration`` in every mode
    (once in ``both``), no inference metric; today's names also count their tokens."""
    got, _ = await run_job(mode, embeddings=True)
    unit, [(a, (count, _))] = got["gen_ai.client.operation.duration"]
    assert (unit, count) == ("s", 1) and a["gen_ai.operation.name"] == "embeddings"
    assert not any(name.startswith("gen_ai.client.inference") for name in got)
    assert ("gen_ai.client.token.usage" in got) is (mode != "latest")


def test_the_commits_are_named() -> None:
    assert _otel.SEMCONV_COMMIT.startswith("004902b8")
    assert _otel.SEMCONV_LATEST_COMMIT.startswith("32c328e8")
    assert _otel.SEMCONV_USAGE_COMMIT.startswith("2f4c6b1c")
    assert _otel.SEMCONV_LATEST_SPAN_COMMIT.startswith("024a4f94")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["default", "latest", "both"])
async def test_reasoning_and_cache_write_tokens_where_reported(mode: SemconvMode) -> None:
    """A reply that reports cache writes and reasoning tokens (the first call): counters
    and call-span attributes under the latest names; today's names have none."""
    got, spans = await run_job(mode, details=True)
    usage = {**CALL_ATTRS, "gen_ai.token.modality": "unknown"}
    chats = [dict(s.attributes or {}) for s in spans.get_finished_spans() if s.name == "chat m"]
    first, second = sorted(chats, key=lambda a: str(a.get("gen_ai.request.stream")))
    if mode == "default":
        assert not DETAILED_NAMES & set(got)
        assert not any("reasoning" in k or "cache_write" in k for a in chats for k in a)
        return
    assert got["gen_ai.client.inference.usage.detailed.cache_write.input_tokens"] == (
        "{token}",
        [(usage, 6)],
    )
    assert got["gen_ai.client.inference.usage.detailed.reasoning.output_tokens"] == (
        "{token}",
        [(usage, 3)],
    )
    assert got["gen_ai.client.inference.usage.detailed.input_tokens"][1] == [(usage, 20)]
    assert first["gen_ai.usage.cache_write.input_tokens"] == 6
    assert first["gen_ai.usage.reasoning.output_tokens"] == 3
    assert "gen_ai.usage.reasoning.output_tokens" not in second  # the fake's plain usage
