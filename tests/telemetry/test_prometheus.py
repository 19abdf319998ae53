"""The Prometheus exporter: metric values after a run, metric and label names (none that
Prometheus or its operator sets on scraped series), registries, the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from agentrt import Retry, Runtime
from agentrt.telemetry import PrometheusHook
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)
EPS = ["http://a.test/v1", "http://b.test/v1"]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist."""
    return registry.get_sample_value(name, labels) or 0.0


def total(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """Sum of a sample over every series matching ``labels``."""
    out = 0.0
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out += s.value
    return out


def label_values(registry: CollectorRegistry, name: str, label: str) -> set[str]:
    return {s.labels[label] for m in registry.collect() for s in m.samples if s.name == name}


async def test_a_run_with_a_retry_a_tool_wait_and_a_failover() -> None:
    registry = CollectorRegistry()
    fake = FakeEngine(prompt_tokens=12, completion_tokens=5, cached_tokens=4)
    fake.script.append(lambda request: httpx.Response(503))  # the first attempt fails
    down: set[str] = set()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("refused", request=request)
        return await fake.handle(request)

    transport = httpx.MockTransport(handler)
    async with Runtime(EPS, transport=transport, retry=FAST, prometheus=registry) as rt:
        async with rt.job("triage") as job, job.session("main") as s:
            await s.chat(model="m", messages=MSG)  # 503, then ok on the same replica
            assert s.endpoint_index is not None
            home = EPS[s.endpoint_index]
            other = EPS[1 - s.endpoint_index]
            async with s.tool("grep"):
                await anyio.sleep(0.02)
            down.add(httpx.URL(home).host)
            await s.chat(model="m", messages=MSG)  # refused at home: fails over
            stream = await s.chat(model="m", messages=MSG, stream=True)
            async for _ in stream:  # type: ignore[union-attr]
                pass
    report = job.report
    assert report.retries == 2 and report.session_moves == 1 and report.calls == 3

    jct = value(registry, "agentrt_job_duration_seconds_sum", job_name="triage", status="ok")
    assert jct == pytest.approx(report.jct_s)
    assert (
        value(registry, "agentrt_job_duration_seconds_count", job_name="triage", status="ok") == 1
    )
    # The JCT histogram's 4-hour bucket holds the job.
    job_ok = {"job_name": "triage", "status": "ok"}
    assert value(registry, "agentrt_job_duration_seconds_bucket", le="14400.0", **job_ok) == 1

    calls = total(registry, "agentrt_call_duration_seconds_count", job_name="triage", status="ok")
    assert calls == 3
    latency = total(registry, "agentrt_call_duration_seconds_sum", job_name="triage")
    assert latency == pytest.approx(report.llm_s)
    assert value(registry, "agentrt_call_duration_seconds_count", endpoint_url=home, **job_ok) == 1
    assert value(registry, "agentrt_call_duration_seconds_count", endpoint_url=other, **job_ok) == 2
    assert total(registry, "agentrt_call_queue_seconds_count", job_name="triage") == 3
    ttft = total(registry, "agentrt_call_time_to_first_token_seconds_count", job_name="triage")
    assert ttft == 1

    assert total(registry, "agentrt_call_attempts_total", job_name="triage") == 5
    assert value(registry, "agentrt_call_attempts_total", job_name="triage", endpoint_url=home) == 3
    failed = "agentrt_call_attempt_failures_total"
    at_home = {"job_name": "triage", "endpoint_url": home, "retried": "true"}
    assert value(registry, failed, reason="http_503", **at_home) == 1
    assert value(registry, failed, reason="ConnectError", **at_home) == 1
    moves = "agentrt_session_moves_total"
    assert value(registry, moves, job_name="triage", from_endpoint=home, to_endpoint=other) == 1
    assert total(registry, moves) == 1

    assert total(registry, "agentrt_prompt_tokens_total") == report.prompt_tokens > 0
    assert total(registry, "agentrt_completion_tokens_total") == report.completion_tokens > 0
    assert total(registry, "agentrt_cached_tokens_total") == report.cached_tokens > 0

    tool = {"job_name": "triage", "tool": "grep", "status": "ok"}
    assert value(registry, "agentrt_tool_wait_seconds_count", **tool) == 1
    assert value(registry, "agentrt_tool_wait_seconds_sum", **tool) >= 0.02
    assert value(registry, "agentrt_tool_wait_seconds_sum", **tool) == pytest.approx(report.tool_s)

    assert value(registry, "agentrt_jobs_in_progress", job_name="triage") == 0
    assert value(registry, "agentrt_calls_in_progress", job_name="triage") == 0
    # No label carries an id.
    for metric in registry.collect():
        for sample in metric.samples:
            assert not any(v.startswith(("job-", "sess", "call-")) for v in sample.labels.values())


async def test_queue_time_and_failed_jobs_are_observed() -> None:
    """Two calls through a gate of one: the second waits in the queue for at least the
    0.05 s the first is held once the second is seen waiting (the state is held, not
    raced: the first call's reply waits for it)."""
    registry = CollectorRegistry()
    fake = FakeEngine()
    release = anyio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        await release.wait()  # the first call holds the gate until released
        return await fake.handle(request)

    transport = httpx.MockTransport(handle)
    rt = Runtime("http://e.test/v1", transport=transport, concurrency=1, prometheus=registry)
    async with rt:

        async def one(name: str) -> None:
            async with rt.job("pair") as job, job.session(name) as s:
                await s.chat(model="m", messages=MSG)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            tg.start_soon(one, "b")
            while rt.admission_statistics()[0].waiting < 1:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.001)
            await anyio.sleep(0.05)
            release.set()
        with pytest.raises(RuntimeError):
            async with rt.job("pair"):
                raise RuntimeError("boom")
    labels = {"job_name": "pair", "endpoint_url": "http://e.test/v1"}
    assert value(registry, "agentrt_call_queue_seconds_count", **labels) == 2
    assert value(registry, "agentrt_call_queue_seconds_sum", **labels) >= 0.04
    assert value(registry, "agentrt_job_duration_seconds_count", job_name="pair", status="ok") == 2
    assert (
        value(registry, "agentrt_job_duration_seconds_count", job_name="pair", status="error") == 1
    )


async def test_calls_outside_a_job_are_labelled_call() -> None:
    registry = CollectorRegistry()
    fake = FakeEngine()
    async with Runtime("http://e.test/v1", transport=fake.transport(), prometheus=registry) as rt:
        await rt.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert value(registry, "agentrt_job_duration_seconds_count", job_name="call", status="ok") == 1
    assert total(registry, "agentrt_call_attempts_total", job_name="call") == 1


async def test_two_runtimes_share_one_registry() -> None:
    registry = CollectorRegistry()
    fake = FakeEngine()
    for _ in range(2):
        async with Runtime(
            "http://e.test/v1", transport=fake.transport(), prometheus=registry
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert value(registry, "agentrt_job_duration_seconds_count", job_name="j", status="ok") == 2


def test_hooks_on_one_registry_share_their_metrics() -> None:
    registry = CollectorRegistry()
    a, b = PrometheusHook(registry), PrometheusHook(registry)
    assert a._m is b._m
    assert PrometheusHook(CollectorRegistry())._m is not a._m
    # prometheus=True: the default registry, also more than once.
    assert PrometheusHook()._m is PrometheusHook(None)._m
    assert PrometheusHook().registry is REGISTRY


async def test_job_and_tool_names_beyond_the_cap_are_other() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry, max_label_values=2)
    fake = FakeEngine()
    async with Runtime("http://e.test/v1", transport=fake.transport(), hooks=[hook]) as rt:
        for i in range(4):
            async with rt.job(f"job{i}") as job, job.session() as s:
                async with s.tool(f"tool{i}"):
                    pass
                await s.chat(model="m", messages=MSG)
    jobs = label_values(registry, "agentrt_job_duration_seconds_count", "job_name")
    assert jobs == {"job0", "job1", "other"}
    assert value(registry, "agentrt_job_duration_seconds_count", job_name="other", status="ok") == 2
    tools = label_values(registry, "agentrt_tool_wait_seconds_count", "tool")
    assert tools == {"tool0", "tool1", "other"}


def test_a_bad_registry_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="CollectorRegistry"):
        PrometheusHook("registry")
    with pytest.raises(TypeError, match="CollectorRegistry"):
        Runtime("http://e.test/v1", prometheus="yes")
    with pytest.raises(ValueError, match="max_label_values"):
        PrometheusHook(CollectorRegistry(), max_label_values=0)


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r'pip install "agentjct\[prometheus\]"'):
        Runtime("http://e.test/v1", prometheus=True)
    # Without prometheus, agentrt works as before.
    Runtime("http://e.test/v1")


RESERVED = {"job", "instance", "endpoint", "service", "pod", "namespace", "container"}
"""Labels Prometheus (``job``, ``instance``) or the Prometheus operator's ServiceMonitor
(``endpoint``, ``service``, ``pod``, ``namespace``, ``container``) set on every scraped
series: an exported label of that name would become ``exported_<name>``."""

METRICS = {
    "agentrt_job_duration_seconds": ("histogram", {"job_name", "status"}),
    "agentrt_call_duration_seconds": ("histogram", {"job_name", "endpoint_url", "status"}),
    "agentrt_call_queue_seconds": ("histogram", {"job_name", "endpoint_url"}),
    "agentrt_call_time_to_first_token_seconds": ("histogram", {"job_name", "endpoint_url"}),
    "agentrt_tool_wait_seconds": ("histogram", {"job_name", "tool", "status"}),
    "agentrt_call_attempts": ("counter", {"job_name", "endpoint_url"}),
    "agentrt_call_attempt_failures": (
        "counter",
        {"job_name", "endpoint_url", "reason", "retried"},
    ),
    "agentrt_session_moves": ("counter", {"job_name", "from_endpoint", "to_endpoint"}),
    "agentrt_prompt_tokens": ("counter", {"job_name", "endpoint_url"}),
    "agentrt_completion_tokens": ("counter", {"job_name", "endpoint_url"}),
    "agentrt_cached_tokens": ("counter", {"job_name", "endpoint_url"}),
    "agentrt_journal_lines": ("counter", {"outcome"}),
    "agentrt_jobs_in_progress": ("gauge", {"job_name"}),
    "agentrt_calls_in_progress": ("gauge", {"job_name"}),
    # No call is held in this run: the held histogram's labels (job_name, endpoint_url) are
    # checked in test_held_telemetry.py. Load control's state, read when scraped.
    "agentrt_call_held_seconds": ("histogram", set()),
    "agentrt_sessions_held": ("gauge", set()),
    "agentrt_load_control_forced": ("counter", set()),
}


async def test_metric_and_label_names_follow_prometheus_conventions(tmp_path: Path) -> None:
    """Every metric agentrt registers, with its type and labels, read from the registry
    after a run that touches each (a retry, a tool wait, a failover, a journal line):
    counters are exposed with ``_total``, durations in ``_seconds``, and no label is one
    a scrape sets (the old ``job`` label came back as ``exported_job``)."""
    registry = CollectorRegistry()
    fake = FakeEngine()
    fake.script.append(lambda request: httpx.Response(503))
    down: set[str] = set()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("refused", request=request)
        return await fake.handle(request)

    async with Runtime(
        EPS,
        transport=httpx.MockTransport(handler),
        retry=FAST,
        prometheus=registry,
        journal=tmp_path / "runs.jsonl",
    ) as rt:
        async with rt.job("names") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("grep"):
                pass
            assert s.endpoint_index is not None
            home = EPS[s.endpoint_index]
            down.add(httpx.URL(home).host)
            await s.chat(model="m", messages=MSG)  # fails over: a session move
    found = {
        m.name: (m.type, {k for sample in m.samples for k in sample.labels} - {"le"})
        for m in registry.collect()
        if m.name.startswith("agentrt_")
    }
    assert found == METRICS
    for metric in registry.collect():
        for sample in metric.samples:
            assert not RESERVED & set(sample.labels), (sample.name, sample.labels)
            if metric.type == "counter" and not sample.name.endswith("_created"):
                assert sample.name.endswith("_total"), sample.name
            if metric.type == "histogram":
                assert metric.name.endswith("_seconds"), metric.name
    failures = "agentrt_call_attempt_failures_total"
    labels = {"job_name": "names", "endpoint_url": home, "reason": "http_503"}
    assert value(registry, failures, retried="true", **labels) == 1
    assert registry.get_sample_value("agentrt_call_attempts_failed_total", labels) is None
