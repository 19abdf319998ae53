"""The event stream: what hooks see, in which order, and what a hook may (not) do."""

from __future__ import annotations

import itertools

import httpx
import pytest

from agentrt import Retry, Runtime
from agentrt.telemetry import (
    AttemptFailed,
    CallEnded,
    CallSent,
    CallStarted,
    Event,
    FirstToken,
    JobEnded,
    JobStarted,
    SessionClosed,
    SessionMoved,
    SessionOpened,
    ToolEnded,
    ToolStarted,
)
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


async def test_a_job_emits_its_events_in_order() -> None:
    events: list[Event] = []
    fake = FakeEngine()
    fake.script.append(lambda request: httpx.Response(503))  # first attempt fails
    async with Runtime([URL], transport=fake.transport(), retry=FAST, hooks=[events.append]) as rt:
        async with rt.job("j") as job, job.session("main") as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("grep", expected_s=1.0):
                pass
            stream = await s.chat(model="m", messages=MSG, stream=True)
            async for _ in stream:  # type: ignore[union-attr]
                pass
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "JobStarted",
        "SessionOpened",
        "CallStarted",
        "CallSent",
        "AttemptFailed",
        "CallSent",
        "CallEnded",
        "ToolStarted",
        "ToolEnded",
        "CallStarted",
        "CallSent",
        "FirstToken",
        "CallEnded",
        "SessionClosed",
        "JobEnded",
    ]
    assert all(e.job_id == job.id for e in events)
    assert all(b.t >= a.t for a, b in itertools.pairwise(events))
    started = events[0]
    assert isinstance(started, JobStarted) and started.name == "j" and not started.implicit
    opened = events[1]
    assert isinstance(opened, SessionOpened) and opened.name == "main"
    assert isinstance(events[2], CallStarted) and events[2].turn == 0
    failed = events[4]
    assert isinstance(failed, AttemptFailed)
    assert failed.error == "HTTP 503" and failed.will_retry and failed.attempt == 1
    sent = events[5]
    assert isinstance(sent, CallSent) and sent.attempt == 2 and sent.endpoint == URL
    ended = events[6]
    assert isinstance(ended, CallEnded) and ended.status == "ok"
    assert ended.report.attempts == 2 and ended.report.completion_tokens == 5
    tool = events[8]
    assert isinstance(tool, ToolEnded) and tool.name == "grep" and tool.status == "ok"
    assert isinstance(events[7], ToolStarted) and events[7].expected_s == 1.0
    assert isinstance(events[11], FirstToken) and events[11].ttft_s >= 0.0
    assert isinstance(events[13], SessionClosed)
    last = events[-1]
    assert isinstance(last, JobEnded) and last.report is job.report


async def test_implicit_jobs_and_failures_end_with_events() -> None:
    events: list[Event] = []

    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    retry = Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0)
    transport = httpx.MockTransport(refuse)
    async with Runtime([URL], transport=transport, retry=retry, hooks=[events.append]) as rt:
        client = rt.openai()
        with pytest.raises(Exception) as caught:
            await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    # openai 3 surfaces agentrt's EndpointError; openai 2 wraps it (as its cause).
    error = caught.value
    assert "failed after 2 attempt" in f"{error} {error.__cause__}"
    started = events[0]
    assert isinstance(started, JobStarted) and started.implicit
    failures = [e for e in events if isinstance(e, AttemptFailed)]
    assert [f.will_retry for f in failures] == [True, False]
    ended = [e for e in events if isinstance(e, CallEnded)]
    assert len(ended) == 1 and ended[0].status == "error"
    last = events[-1]
    assert isinstance(last, JobEnded) and last.report.status == "error"


async def test_session_moves_are_events() -> None:
    events: list[Event] = []
    down: set[str] = set()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("refused", request=request)
        return await FakeEngine().handle(request)

    eps = ["http://a.test/v1", "http://b.test/v1"]
    transport = httpx.MockTransport(handler)
    async with Runtime(eps, transport=transport, retry=FAST, hooks=[events.append]) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            assert s.endpoint_index is not None
            home = eps[s.endpoint_index]
            down.add(httpx.URL(home).host)
            await s.chat(model="m", messages=MSG)
    moves = [e for e in events if isinstance(e, SessionMoved)]
    assert len(moves) == 1
    assert moves[0].from_endpoint == home and moves[0].to_endpoint != home
    assert moves[0].reason == "unavailable"
    assert job.report.session_moves == 1


async def test_hooks_may_add_headers_to_the_request() -> None:
    fake = FakeEngine()

    def trace(event: Event) -> None:
        if isinstance(event, CallSent):
            event.headers["traceparent"] = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"

    async with Runtime([URL], transport=fake.transport(), hooks=[trace]) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert fake.seen[0].headers["traceparent"].startswith("00-aaaa")


async def test_a_bad_header_from_a_hook_fails_the_call_before_sending() -> None:
    fake = FakeEngine()

    def evil(event: Event) -> None:
        if isinstance(event, CallSent):
            event.headers["x-evil"] = "a\r\nb"

    async with Runtime([URL], transport=fake.transport(), hooks=[evil]) as rt:
        with pytest.raises(ValueError, match=r"CR/LF|control"):
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert fake.seen == []
    assert job.report.status == "error"


async def test_a_raising_hook_warns_once_and_the_call_goes_on() -> None:
    fake = FakeEngine()

    def broken(event: Event) -> None:
        raise KeyError("oops")

    async with Runtime([URL], transport=fake.transport(), hooks=[broken]) as rt:
        with pytest.warns(RuntimeWarning, match="raised KeyError") as caught:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
                await s.chat(model="m", messages=MSG)
    assert len(caught) == 1
    assert job.report.status == "ok" and job.report.calls == 2


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match="hook must be a callable"):
        Runtime([URL], hooks=["not a hook"])  # type: ignore[list-item]


async def test_content_is_captured_only_on_request() -> None:
    for capture in (False, True):
        events: list[Event] = []
        fake = FakeEngine()
        async with Runtime(
            [URL], transport=fake.transport(), hooks=[events.append], capture_content=capture
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
                stream = await s.chat(model="m", messages=MSG, stream=True)
                async for _ in stream:  # type: ignore[union-attr]
                    pass
        started = [e for e in events if isinstance(e, CallStarted)]
        ended = [e for e in events if isinstance(e, CallEnded)]
        if capture:
            assert started[0].content == MSG
            assert ended[0].output == "hello"
            assert ended[1].output  # the streamed deltas, joined
        else:
            assert all(e.content is None for e in started)
            assert all(e.output is None for e in ended)
        assert job.report.status == "ok"


async def test_tool_waits_are_numbered_and_failures_named() -> None:
    events: list[Event] = []
    async with Runtime([URL], transport=FakeEngine().transport(), hooks=[events.append]) as rt:
        async with rt.job("j") as job, job.session() as s:
            async with s.tool("a"), s.tool("b"):  # nested: both open at once
                pass
            with pytest.raises(KeyError):
                async with s.tool("c"):
                    raise KeyError("missing")
            await s.chat(model="m", messages=MSG)
    started = [e for e in events if isinstance(e, ToolStarted)]
    ended = {e.wait_id: e for e in events if isinstance(e, ToolEnded)}
    assert [(e.wait_id, e.name) for e in started] == [(0, "a"), (1, "b"), (2, "c")]
    assert {i: e.name for i, e in ended.items()} == {0: "a", 1: "b", 2: "c"}
    assert ended[2].status == "error" and ended[2].error_type == "KeyError"
    call_end = next(e for e in events if isinstance(e, CallEnded))
    assert call_end.finish_reason == "stop"
    assert job.report.status == "ok"
