"""The caller's own metadata wins (issue 25, item 14): a header or body field the caller
set is never overwritten by a dialect (or a hook), in every dialect, through
``session.chat``, ``rt.openai()`` and ``SyncRuntime`` (docs/protocol.md, section 3). With
``dialect="vllm"`` the caller's ``X-Session-ID`` used to become agentrt's session id on
the wire while its body ``session_id`` was kept."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import agentrt
from agentrt._protocol import CallMetadata
from agentrt.dialects import DIALECTS, DialectOptions, get_dialect
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"
TOKEN = "engine-token"
NAMES = [*sorted(DIALECTS), "session-header:x-tenant-session,x-tenant-job"]

SAMPLE = CallMetadata(
    call_id="call-1",
    job_id="job-1",
    session_id="sess-1",
    program_id="job-1",
    parent_session_id="sess-0",
    turn=1,
    first_turn=False,
    service_s=1.5,
    service_tokens=10,
    idle_expected_s=5.0,
    idle_expected_source="declared",
    idle_s=0.5,
    priority=2,
    expected_output_tokens=16,
    echo={"x-session-token": TOKEN},
)


def fields(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The headers and top-level body fields ``name`` sets on a call like the test's
    second (its session's second turn, an expected idle, a priority), each with a value
    of the caller's own; not ``x-agentrt``, agentrt's own, which describes the call and
    replaces a caller's (tests/transport/test_hot_path.py)."""
    enc = get_dialect(name).encode(SAMPLE, DialectOptions(send_priority=True))
    headers = {k: f"caller-{k}" for k in enc.headers if k != "x-agentrt"}
    headers["traceparent"] = "00-caller-01"  # a hook's (OpenTelemetry's) header
    return headers, {k: f"caller-{k}" for k in enc.body}


class RecordingEngine:
    """The fake engine's replies, each with an ``x-session-token`` (the llm-d dialect
    echoes it on the session's next call); records each request as sent."""

    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.ends: list[httpx.Request] = []
        self.fake = FakeEngine()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/finish_session"):  # a session's end, not a call
            self.ends.append(request)
            return httpx.Response(200, request=request)
        self.seen.append(request)
        response = await self.fake.handle(request)
        response.headers["x-session-token"] = TOKEN
        return response


def kwargs(name: str, engine: RecordingEngine, **kw: Any) -> dict[str, Any]:
    return {
        "dialect": name,
        "send_priority": True,
        "transport": httpx.MockTransport(engine),
        "otel": False,
    } | kw


def assert_callers(request: httpx.Request, headers: dict[str, str], body: dict[str, str]) -> None:
    sent = json.loads(request.content)
    assert {k: request.headers.get_list(k) for k in headers} == {k: [v] for k, v in headers.items()}
    assert {k: sent.get(k) for k in body} == body


def trace_hook(event: Any) -> None:
    """A hook that sets a header on every attempt (as the OpenTelemetry exporter sets
    ``traceparent``)."""
    if hasattr(event, "headers"):
        event.headers["traceparent"] = "00-hook-01"


@pytest.mark.anyio
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("via", ["session.chat", "rt.openai()"])
async def test_the_callers_headers_and_body_fields_win_in_every_dialect(
    name: str, via: str
) -> None:
    headers, body = fields(name)
    engine = RecordingEngine()
    async with agentrt.Runtime([URL], **kwargs(name, engine, hooks=[trace_hook])) as rt:
        async with rt.job("mine") as job, job.session("s", parent=None) as s:
            await s.chat(model="m", messages=MSG)
            s.expect_idle(5.0)
            extra = {"extra_headers": headers, "extra_body": body}
            if via == "session.chat":
                await s.chat(model="m", messages=MSG, **extra)
            else:
                await rt.openai().chat.completions.create(model="m", messages=MSG, **extra)
    first, second = engine.seen
    assert_callers(second, headers, body)
    # Where the caller set nothing, agentrt's fields are there as before.
    assert first.headers["traceparent"] == "00-hook-01" and "x-agentrt" in first.headers


@pytest.mark.parametrize("name", ["vllm", "sglang", "dynamo", "llm-d"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_runtime_keeps_the_callers_fields_too(name: str, backend: str) -> None:
    headers, body = fields(name)
    engine = RecordingEngine()
    with agentrt.SyncRuntime([URL], **kwargs(name, engine, backend=backend)) as rt:
        with rt.job("mine") as job, job.session("s") as s:
            s.chat(model="m", messages=MSG)
            rt.openai().chat.completions.create(
                model="m", messages=MSG, extra_headers=headers, extra_body=body
            )
    assert_callers(engine.seen[1], headers, body)
    assert job.report.status == "ok"


@pytest.mark.anyio
async def test_vllm_keeps_the_callers_session_header_and_body_alike() -> None:
    """The issue's case: both of the caller's session ids reach the server as set."""
    engine = RecordingEngine()
    async with agentrt.Runtime([URL], **kwargs("vllm", engine)) as rt:
        async with rt.job("mine") as job, job.session("s") as s:
            await s.chat(
                model="m",
                messages=MSG,
                extra_headers={"X-Session-ID": "conv-42"},
                extra_body={"session_id": "conv-42"},
            )
            await s.chat(model="m", messages=MSG)
    mine, plain = engine.seen
    assert mine.headers.get_list("x-session-id") == ["conv-42"]
    assert json.loads(mine.content)["session_id"] == "conv-42"
    # The request id and agentrt's header, which the caller did not set, are agentrt's.
    assert mine.headers["x-request-id"] == job.report.call_reports[0].call_id
    assert plain.headers["x-session-id"] == s.id == json.loads(plain.content)["session_id"]
