"""No secret in any output: credentials written in an endpoint URL
(``http://user:KEY@host/v1``) are sent to the server as HTTP Basic auth, as httpx sends
them, and appear in nothing agentrt renders: reprs, errors, reports, the journal, events,
OpenTelemetry spans and metrics, Prometheus labels, ``agentrt report``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from agentrt import Endpoint, EndpointError, Retry, Runtime, SyncRuntime
from agentrt._config import redact_userinfo, split_userinfo
from agentrt.sim import Cluster
from agentrt.telemetry import CallReport, Event, JobReport, read_journal
from tests._fake import MSG, FakeEngine
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio

SECRET = "s3cr3t-Pa55"
USER = "alice"
FAST = Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0)


def with_userinfo(url: str, user: str = USER, password: str = SECRET) -> str:
    return url.replace("://", f"://{user}:{password}@", 1)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- parsing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "bare", "credentials"),
    [
        ("http://alice:KEY@h.test/v1", "http://h.test/v1", ("alice", "KEY")),
        ("https://alice:K%2FE%40Y@h.test:8443/v1/", "https://h.test:8443/v1", ("alice", "K/E@Y")),
        ("http://al%40ce:p@ss@h.test/v1", "http://h.test/v1", ("al@ce", "p@ss")),
        ("http://only-user@h.test/v1", "http://h.test/v1", ("only-user", "")),
        ("http://:KEY@127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", ("", "KEY")),
        ("http://h.test/v1?who=a@b", "http://h.test/v1?who=a@b", None),
        ("http://h.test/v1", "http://h.test/v1", None),
    ],
)
def test_endpoint_keeps_credentials_apart_from_its_url(
    url: str, bare: str, credentials: tuple[str, str] | None
) -> None:
    ep = Endpoint(url)
    assert ep.url == bare
    assert ep.basic_auth == credentials
    # httpx reads the same credentials from the URL (what it would send as Basic auth).
    if credentials is not None:
        u = httpx.URL(url)
        assert (u.username, u.password) == credentials
        assert "KEY" not in repr(ep) and "p@ss" not in repr(ep) and "E@Y" not in repr(ep)
    assert replace(ep, weight=2.0).basic_auth == credentials  # a copy keeps them
    assert redact_userinfo(url).rstrip("/") == bare
    assert redact_userinfo(f"see {url} now") == f"see {split_userinfo(url)[0]} now"


def test_redact_userinfo_in_any_text() -> None:
    text = f"endpoint http://{USER}:{SECRET}@a.test/v1 failed; try https://{SECRET}@b.test/x"
    out = redact_userinfo(text)
    assert SECRET not in out and USER not in out
    assert out == "endpoint http://a.test/v1 failed; try https://b.test/x"
    assert redact_userinfo("no url here: a@b") == "no url here: a@b"
    assert redact_userinfo("http://h.test/p@th") == "http://h.test/p@th"


def test_bad_urls_and_conflicting_credentials_are_refused_without_the_secret() -> None:
    for url in (f"ftp://{USER}:{SECRET}@h.test/v1", f"http://{USER}:{SECRET}@h.test/v 1"):
        with pytest.raises(ValueError) as info:
            Endpoint(url)
        assert SECRET not in str(info.value)
    with pytest.raises(ValueError, match="once") as info:
        Endpoint(with_userinfo("http://h.test/v1"), basic_auth=("bob", "other"))
    assert SECRET not in str(info.value)
    with pytest.raises(ValueError, match="both an api_key") as info:
        Endpoint(with_userinfo("http://h.test/v1"), api_key="sk-1")
    assert SECRET not in str(info.value)
    with pytest.raises(TypeError, match="pair"):
        Endpoint("http://h.test/v1", basic_auth=("only-one",))  # type: ignore[arg-type]


# -- sending --------------------------------------------------------------------------


async def plain_httpx_authorization(url: str) -> str:
    """The Authorization header a plain httpx client sends for a URL with userinfo."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        await http.post(url + "/chat/completions", json={})
    return seen[0].headers["authorization"]


async def test_credentials_are_sent_as_httpx_sends_them() -> None:
    fake = FakeEngine()
    a, b = with_userinfo("http://a.test/v1"), with_userinfo("http://b.test/v1", "bob", "pw-b")
    # The runtime's key gives way to the credentials an endpoint carries (as httpx's
    # Basic auth replaces openai's bearer header in a plain client).
    async with Runtime(
        [a, b], transport=fake.transport(), routing="round_robin", api_key="sk-rt"
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
        http = rt.http_client()
        await http.post("http://a.test/v1/chat/completions", json={"model": "m", "messages": MSG})
        await rt.openai().chat.completions.create(model="m", messages=MSG)
    by_host = {}
    for seen in fake.seen:
        url = httpx.URL(seen.url)
        assert not url.userinfo  # the URL on the wire carries none
        by_host.setdefault(url.host, set()).add(seen.headers["authorization"])
    assert by_host == {"a.test": {basic(USER, SECRET)}, "b.test": {basic("bob", "pw-b")}}
    assert basic(USER, SECRET) == await plain_httpx_authorization(a)


def test_sync_runtime_sends_them_and_shows_none() -> None:
    fake = FakeEngine()
    url = with_userinfo("http://a.test/v1")
    srt = SyncRuntime([url], transport=fake.transport())
    with srt as rt:
        with rt.job("j") as job, job.session() as s:
            s.chat(model="m", messages=MSG)
        rt.openai().chat.completions.create(model="m", messages=MSG)
        shown = repr(rt)
    assert [x.headers["authorization"] for x in fake.seen] == [basic(USER, SECRET)] * 2
    for text in (shown, repr(srt), job.report.model_dump_json(), str(job.report)):
        assert SECRET not in text and USER not in text


# -- every output ---------------------------------------------------------------------


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader: InMemoryMetricReader | None = None
        if not isinstance(metrics.get_meter_provider(), MeterProvider):
            self.reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))

    def text(self) -> str:
        out = []
        for span in self.spans.get_finished_spans():
            out.append(span.to_json())
        if self.reader is not None:
            data = self.reader.get_metrics_data()
            if data is not None:
                out.append(data.to_json())
        return "\n".join(out)


_OTEL: Otel | None = None


@pytest.fixture
def otel() -> Iterator[Otel]:
    global _OTEL
    if _OTEL is None:  # the global providers may be set once per process
        _OTEL = Otel()
    _OTEL.spans.clear()
    yield _OTEL
    _OTEL.spans.clear()


async def test_no_output_shows_the_credentials(
    tmp_path: Path, otel: Otel, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "runs.jsonl"
    registry = CollectorRegistry()
    events: list[Event] = []
    outputs: dict[str, str] = {}
    async with Cluster(1, small_config()) as cluster:
        live = with_userinfo(cluster.base_urls[0])
        dead = with_userinfo("http://dead.sim/v1")  # no replica there: connection errors
        async with Runtime(
            [dead, live],
            transport=cluster.transport(),
            routing="round_robin",
            retry=FAST,
            journal=journal,
            prometheus=registry,
            hooks=[events.append],
            poll_metrics_s=None,  # a refused poll would mark the dead one down first
        ) as rt:
            outputs["repr"] = repr(rt) + repr(rt.endpoints) + repr(rt.endpoint_loads())
            # A call tried on the dead replica first, then failed over (a retry; not a
            # session move: no reply had come from the dead one); then the session is
            # pinned on the dead replica, and its next call moves off it (a session move).
            async with rt.job("moved") as moved, moved.session("main") as s:
                await s.chat(model="m", messages=MSG, max_tokens=2)
                s.endpoint_index = 0
                await s.chat(model="m", messages=MSG, max_tokens=2, stream=True)
        async with Runtime(
            [dead], transport=cluster.transport(), retry=FAST, journal=journal
        ) as rt2:
            with pytest.raises(EndpointError) as failed:
                async with rt2.job("failed") as job, job.session() as s:
                    await s.chat(model="m", messages=MSG)
            outputs["repr2"] = repr(rt2)
    error = failed.value
    assert "dead.sim" in str(error)  # the error still names the endpoint
    outputs["error"] = f"{error} {error.endpoint} {error!r}"
    reports = [moved.report, job.report]
    assert moved.report.session_moves == 1 and moved.report.retries == 1
    outputs["reports"] = "".join(r.model_dump_json() + repr(r) + str(r) for r in reports)
    outputs["journal"] = journal.read_text()
    outputs["events"] = "".join(repr(e) for e in events)
    outputs["otel"] = otel.text()
    outputs["prometheus"] = generate_latest(registry).decode()
    assert "dead.sim" in outputs["prometheus"] and "dead.sim" in outputs["otel"]

    from agentrt.report import report

    html = tmp_path / "report.html"
    capsys.readouterr()
    report([journal], html_path=html, job_id=moved.id)
    outputs["agentrt report"] = capsys.readouterr().out + html.read_text()

    for name, text in outputs.items():
        assert text, name
        assert SECRET not in text, f"the password shows in {name}"
        assert f"{USER}:" not in text and f"{USER}@" not in text, f"the user shows in {name}"
    assert [r.name for r in read_journal(journal)] == ["moved", "failed"]


def test_agentrt_report_shows_no_endpoint_of_an_old_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal written before endpoints kept their credentials apart (or by another
    tool) holds them in its endpoint and error fields: the report shows neither."""
    secret_url = with_userinfo("http://old.test/v1")
    call = CallReport(
        call_id="c1",
        session_id="s1",
        turn=0,
        endpoint=secret_url,
        path="/chat/completions",
        start_s=0.0,
        latency_s=1.0,
        status="error",
        error=f"endpoint {secret_url} failed after 1 attempt(s): ConnectError",
    )
    data: dict[str, Any] = {
        "job_id": "job-1",
        "name": "old",
        "program_id": "job-1",
        "status": "error",
        "error": call.error,
        "started_at": "2026-01-01T00:00:00Z",
        "jct_s": 1.5,
        "llm_s": 1.0,
        "critical_llm_s": 1.0,
        "queue_s": 0.0,
        "tool_s": 0.0,
        "calls": 1,
        "tool_waits": 0,
        "sessions": 1,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "retries": 0,
        "call_reports": [call.model_dump()],
    }
    journal = tmp_path / "old.jsonl"
    journal.write_text(json.dumps(data, default=str) + "\n")
    assert SECRET in journal.read_text()
    from agentrt.report import report

    capsys.readouterr()
    report([journal], job_id="job-1")
    out = capsys.readouterr().out
    assert "old" in out
    assert SECRET not in out
    assert SECRET not in str(JobReport.model_validate(data))


async def test_metrics_polls_carry_the_credentials_too() -> None:
    polled: list[str | None] = []
    done = anyio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            polled.append(request.headers.get("authorization"))
            done.set()
            return httpx.Response(200, text='vllm:num_requests_running{model_name="m"} 1\n')
        return await FakeEngine().handle(request)

    url = with_userinfo("http://engine.test/v1")
    async with Runtime([url], transport=httpx.MockTransport(handler), poll_metrics_s=0.01):
        with anyio.fail_after(10):
            await done.wait()
    assert polled and set(polled) == {basic(USER, SECRET)}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_bench_against_servers_writes_no_credentials(tmp_path: Path) -> None:
    """``agentrt bench --endpoint http://user:KEY@host/v1``: its results and journals (the
    plain client's, written by the bench itself, included) show no credentials."""
    from agentrt.bench import BenchConfig, run_bench
    from agentrt.sim import serve_async

    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, small_config())
        cfg = BenchConfig(
            workload="react",
            jobs=2,
            clients=("plain", "agentrt"),
            endpoints=[with_userinfo(u) for u in urls],
            tool_wait_s=0.01,
            journal_dir=tmp_path,
        )
        result = await anyio.to_thread.run_sync(run_bench, cfg)
        tg.cancel_scope.cancel()
    journals = [tmp_path / f"journal-{client}.jsonl" for client in cfg.clients]
    texts = [result.to_json()] + [p.read_text() for p in journals]
    assert all(urls[0] in text for text in texts)  # the endpoint, without its credentials
    for text in texts:
        assert SECRET not in text and f"{USER}:" not in text


def test_cli_errors_show_no_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    from agentrt.cli import main

    url = with_userinfo("ftp://127.0.0.1:9/v1")
    assert (
        main(["bench", "--endpoint", url, "--model", "m", "--jobs", "1", "--client", "agentrt"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("agentrt: error: ") and len(err.splitlines()) == 1
    assert "127.0.0.1:9" in err and SECRET not in err and USER not in err


async def test_tool_start_notices_carry_the_credentials_and_show_none() -> None:
    from tests.runtime.test_notice import Server, settle

    server = Server()
    url = with_userinfo("http://engine.test/v1")
    async with Runtime([url], transport=server.transport(), retry=FAST, api_key="sk-rt") as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()
        stats = rt.notice_statistics()
    assert stats.sent == 1 and stats.accepted == 1
    [(notice_url, headers, _)] = server.notices
    assert notice_url == "http://engine.test/v1/agentrt/idle"
    assert headers["authorization"] == basic(USER, SECRET)
    assert SECRET not in repr(stats)


def test_redact_takes_secrets_out_in_plain_and_base64() -> None:
    from agentrt._log import credential_forms, redact

    pair = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    key64 = base64.b64encode(b"sk-key-1").decode()
    text = f"key sk-key-1 ({key64}), Basic {pair}, password {SECRET}"
    out = redact(text, "sk-key-1", SECRET, f"{USER}:{SECRET}")
    assert out == "key *** (***), Basic ***, password ***"
    assert redact("a b c", "a", "") == "a b c"  # too short to look for
    assert set(credential_forms(f"Basic {pair}")) >= {pair, f"{USER}:{SECRET}", SECRET}
    assert "sk-key-1" in credential_forms("Bearer sk-key-1")
    assert credential_forms(None) == ()
