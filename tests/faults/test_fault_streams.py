"""Streams against the fault server on real loopback sockets (asyncio and trio), through
``session.chat``, ``rt.openai()`` and ``SyncRuntime`` (issue 25, items 3, 7 and 8):

- a stream its caller stops reading (``break``, no ``close()``) is settled when its job or
  session ends: its connection closed, its admission room freed, ``CallEnded`` emitted
  and the call reported ``cancelled``;
- a stream with several choices reaches the caller chunk by chunk (the usage filter holds
  no content chunk), and a usage block the server puts in a content chunk is not shown to
  a caller who did not ask for usage;
- a cancellation that trio delivers wrapped in an exception group (a nursery: while
  connecting, mid-stream) ends the call and the job as asyncio's does: ``cancelled``, or
  at a deadline job ``deadline`` and call ``cancelled``; never ``error``.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import sniffio
from _faultserver import MODEL, Fault, FaultServer, chunk, fault_server

import agentrt
from agentrt.telemetry import CallEnded

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
DISCONNECT_BOUND_S = 5.0
"""How soon the server must see a settled stream's connection close."""
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])
USAGE = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


class Ends:
    """A hook that keeps the CallEnded events."""

    def __init__(self) -> None:
        self.events: list[CallEnded] = []

    def __call__(self, event: object) -> None:
        if isinstance(event, CallEnded):
            self.events.append(event)


def choice(
    index: int,
    content: str | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> bytes:
    """One SSE event of a streamed chat completion, for choice ``index``."""
    body: dict[str, Any] = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": index,
                "delta": {} if content is None else {"content": content},
                "finish_reason": finish,
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def usage_chunk() -> bytes:
    body = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [],
        "usage": USAGE,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def disconnected(server: FaultServer, index: int = 0) -> float | None:
    seen = server.chat_requests[index]
    return await anyio.to_thread.run_sync(server.wait_disconnect, seen, DISCONNECT_BOUND_S)


async def open_stream(rt: agentrt.Runtime, s: agentrt.Session, via: str) -> Any:
    if via == "session.chat":
        return await s.chat(model=MODEL, messages=MESSAGES, stream=True)
    return await rt.openai().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)


# -- item 3: a stream its caller stops reading --------------------------------------------

STALLED_STREAM = Fault.stream([chunk("a"), chunk("b")], then_stall=30.0)
"""Two chunks, then the stream stays open (as a long reply does)."""


@pytest.mark.parametrize("via", ["session.chat", "rt.openai"])
async def test_a_stream_left_unread_is_settled_when_its_job_ends(
    server: FaultServer, via: str
) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    ends = Ends()
    server.push(STALLED_STREAM)
    async with agentrt.Runtime(
        [server.url], concurrency=1, otel=False, prometheus=registry, hooks=[ends]
    ) as rt:
        async with rt.job("left") as job, job.session("s") as s:
            stream = await open_stream(rt, s, via)
            async for _ in stream:
                break  # no close(): the stream is left open
            assert not ends.events  # still open while the job runs
        (call,) = job.report.call_reports
        assert call.status == "cancelled", call.error
        assert call.error is not None and "before its end" in call.error
        assert job.report.status == "ok"  # the caller's choice, not a failure
        assert [e.status for e in ends.events] == ["cancelled"]
        assert ends.events[0].report.status == "cancelled"
        assert registry.get_sample_value("agentrt_calls_in_progress", {"job_name": "left"}) == 0
        count = registry.get_sample_value(
            "agentrt_call_duration_seconds_count",
            {"job_name": "left", "endpoint_url": server.url, "status": "cancelled"},
        )
        assert count == 1
        assert await disconnected(server) is not None
        # Its admission room is free: the next job's call goes at once (concurrency=1).
        with anyio.fail_after(5):
            async with rt.job("next") as job2, job2.session("s") as s2:
                await s2.chat(model=MODEL, messages=MESSAGES)
        assert job2.report.status == "ok"
        del stream


async def test_a_stream_left_unread_is_settled_when_its_session_ends(
    server: FaultServer,
) -> None:
    ends = Ends()
    server.push(STALLED_STREAM)
    async with agentrt.Runtime([server.url], concurrency=1, otel=False, hooks=[ends]) as rt:
        async with rt.job("j") as job:
            async with job.session("a") as a:
                stream = await a.chat(model=MODEL, messages=MESSAGES, stream=True)
                async for _ in stream:
                    break
            assert [e.status for e in ends.events] == ["cancelled"]
            assert await disconnected(server) is not None
            with anyio.fail_after(5):
                async with job.session("b") as b:
                    await b.chat(model=MODEL, messages=MESSAGES)
    first, second = job.report.call_reports
    assert (first.status, second.status) == ("cancelled", "ok")
    assert job.report.status == "ok"
    del stream


async def test_a_cancelled_job_still_closes_the_streams_it_left(server: FaultServer) -> None:
    ends = Ends()
    server.push(STALLED_STREAM)
    async with agentrt.Runtime([server.url], concurrency=1, otel=False, hooks=[ends]) as rt:
        with anyio.move_on_after(0.5):
            async with rt.job("j") as job, job.session("s") as s:
                stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True)
                async for _ in stream:
                    break
                await anyio.sleep_forever()  # cancelled here, the stream unread
        assert job.report.status == "cancelled"
        assert [e.status for e in ends.events] == ["cancelled"]
        assert await disconnected(server) is not None  # closed under the cancellation
        with anyio.fail_after(5):
            async with rt.job("next") as job2, job2.session("s") as s2:
                await s2.chat(model=MODEL, messages=MESSAGES)
    del stream


async def test_a_stream_read_to_its_end_or_closed_is_as_before(server: FaultServer) -> None:
    server.push(Fault.stream([chunk("a"), chunk(None, finish="stop")]), STALLED_STREAM)
    async with agentrt.Runtime([server.url], otel=False) as rt:
        async with rt.job("j") as job, job.session("s") as s:
            text = [c async for c in await s.chat(model=MODEL, messages=MESSAGES, stream=True)]
            stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True)
            async for _ in stream:
                break
            await stream.close()
    assert len(text) == 2
    read, closed = job.report.call_reports
    assert read.status == "ok"
    assert closed.status == "cancelled"
    assert closed.error == "the caller closed the stream before its end"


def stalled_sync(server: FaultServer, backend: str) -> tuple[agentrt.SyncRuntime, Ends]:
    """A SyncRuntime of one call at a time whose first call gets STALLED_STREAM."""
    ends = Ends()
    server.push(STALLED_STREAM)
    srt = agentrt.SyncRuntime(
        [server.url], concurrency=1, otel=False, hooks=[ends], backend=backend
    )
    return srt, ends


@BACKENDS
def test_a_sync_stream_left_unread_is_settled_when_its_job_ends(
    server: FaultServer, backend: str
) -> None:
    srt, ends = stalled_sync(server, backend)
    with srt:
        with srt.job("left") as job, job.session("s") as s:
            stream = s.chat(model=MODEL, messages=MESSAGES, stream=True)
            for _ in stream:
                break
        assert [e.status for e in ends.events] == ["cancelled"]
        seen = server.chat_requests[0]
        assert server.wait_disconnect(seen, DISCONNECT_BOUND_S) is not None
        # The room is free: a blocked admission would run into this deadline.
        with srt.job("next", deadline_s=5.0) as job2, job2.session("s") as s2:
            s2.chat(model=MODEL, messages=MESSAGES)
    (call,) = job.report.call_reports
    assert call.status == "cancelled"
    assert job2.report.status == "ok"
    del stream


@BACKENDS
def test_a_sync_stream_left_unread_is_settled_when_its_session_ends(
    server: FaultServer, backend: str
) -> None:
    srt, ends = stalled_sync(server, backend)
    with srt:
        with srt.job("j", deadline_s=10.0) as job:
            with job.session("a"):
                stream = srt.openai().chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True
                )
                for _ in stream:
                    break
            assert [e.status for e in ends.events] == ["cancelled"]
            seen = server.chat_requests[0]
            assert server.wait_disconnect(seen, DISCONNECT_BOUND_S) is not None
            with job.session("b") as b:
                b.chat(model=MODEL, messages=MESSAGES)
    first, second = job.report.call_reports
    assert (first.status, second.status) == ("cancelled", "ok")
    assert job.report.status == "ok"
    del stream


# -- item 7: the usage filter holds no content chunk --------------------------------------

TWO_CHOICES = [
    choice(0, "a"),
    choice(1, "b"),
    choice(0, finish="stop"),  # the first choice is done; the second goes on
    choice(1, "c"),
    choice(1, "d"),
    choice(1, finish="stop"),
    usage_chunk(),
]
INTERVAL_S = 0.2


def spread_after_first_finish(times: list[float]) -> float:
    """From the chunk after the first choice's finish to the last one (0.4 s as sent)."""
    assert len(times) == len(TWO_CHOICES) - 1  # the usage chunk, not asked for, is dropped
    return times[-1] - times[3]


@pytest.mark.parametrize("via", ["session.chat", "rt.openai"])
async def test_two_choices_stream_chunk_by_chunk(server: FaultServer, via: str) -> None:
    server.push(Fault.stream(TWO_CHOICES, interval=INTERVAL_S))
    async with agentrt.Runtime([server.url], otel=False) as rt:
        async with rt.job("n2") as job, job.session("s") as s:
            if via == "session.chat":
                stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True, n=2)
            else:
                stream = await rt.openai().chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True, n=2
                )
            times, chunks = [], []
            async for c in stream:
                times.append(anyio.current_time())
                chunks.append(c)
    assert [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks] == [
        (0, None),
        (1, None),
        (0, "stop"),
        (1, None),
        (1, None),
        (1, "stop"),
    ]
    assert all(c.usage is None for c in chunks)
    assert spread_after_first_finish(times) > INTERVAL_S, times  # not all at the end
    (call,) = job.report.call_reports
    assert (call.status, call.prompt_tokens, call.completion_tokens) == ("ok", 7, 4)


@BACKENDS
def test_two_choices_stream_chunk_by_chunk_sync(server: FaultServer, backend: str) -> None:
    server.push(Fault.stream(TWO_CHOICES, interval=INTERVAL_S))
    with agentrt.SyncRuntime([server.url], otel=False, backend=backend) as srt:
        with srt.job("n2") as job, job.session("s") as s:
            times = [
                time.monotonic() for _ in s.chat(model=MODEL, messages=MESSAGES, stream=True, n=2)
            ]
    assert spread_after_first_finish(times) > INTERVAL_S, times
    assert job.report.call_reports[0].prompt_tokens == 7


USAGE_IN_FINISH = [choice(0, "a"), choice(0, finish="stop", usage=USAGE)]
"""A server that puts the usage block in the finish chunk (no usage-only chunk)."""


@pytest.mark.parametrize("via", ["session.chat", "rt.openai"])
@pytest.mark.parametrize("asked", [False, True])
async def test_usage_in_the_finish_chunk_reaches_only_a_caller_who_asked(
    server: FaultServer, via: str, asked: bool
) -> None:
    server.push(Fault.stream(USAGE_IN_FINISH))
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked else {}
    async with agentrt.Runtime([server.url], otel=False) as rt:
        async with rt.job("u") as job, job.session("s") as s:
            if via == "session.chat":
                stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True, **extra)
            else:
                stream = await rt.openai().chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True, **extra
                )
            chunks = [c async for c in stream]
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"]
    assert chunks[0].usage is None
    if asked:
        assert chunks[1].usage is not None and chunks[1].usage.prompt_tokens == 7
    else:
        assert chunks[1].usage is None
        assert "usage" not in chunks[1].model_fields_set  # as the server sends it unasked
    assert server.chat_requests[0].json()["stream_options"] == {"include_usage": True}
    (call,) = job.report.call_reports
    assert (call.prompt_tokens, call.completion_tokens) == (7, 4)


def test_usage_in_the_finish_chunk_is_hidden_from_a_sync_caller(server: FaultServer) -> None:
    server.push(Fault.stream(USAGE_IN_FINISH))
    with agentrt.SyncRuntime([server.url], otel=False) as srt:
        with srt.job("u") as job, job.session("s") as s:
            chunks = list(s.chat(model=MODEL, messages=MESSAGES, stream=True))
    assert [c.usage for c in chunks] == [None, None]
    assert job.report.call_reports[0].prompt_tokens == 7


# -- item 8: a cancellation trio wraps in an exception group -----------------------------


async def wait_in_a_nursery() -> None:
    """Wait forever inside a nursery, as ``trio.open_tcp_stream`` connects: on trio a
    cancellation leaves it as a ``BaseExceptionGroup`` of ``Cancelled`` (on asyncio, a
    task group's plain ``CancelledError``)."""
    if sniffio.current_async_library() == "trio":
        import trio

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep_forever)
        await anyio.sleep_forever()


class StallsInANursery(httpx.AsyncByteStream):
    """A streamed reply: one chunk, then a read that waits in a nursery."""

    def __init__(self) -> None:
        self.sent = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if not self.sent:
            self.sent = True
            return chunk("a")
        await wait_in_a_nursery()
        raise StopAsyncIteration  # pragma: no cover


def nursery_transport(phase: str) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        if phase == "connecting":
            await wait_in_a_nursery()
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=StallsInANursery()
        )

    return httpx.MockTransport(handler)


NURSERY_URL = "http://nursery.test/v1"
PHASES = pytest.mark.parametrize("phase", ["connecting", "mid-stream"])


async def nursery_job(
    phase: str, via: str, *, deadline_s: float | None = None, cancel_after: float | None = None
) -> agentrt.JobReport:
    async with agentrt.Runtime([NURSERY_URL], transport=nursery_transport(phase), otel=False) as rt:
        with anyio.move_on_after(cancel_after if cancel_after is not None else 30.0):
            try:
                async with rt.job("n", deadline_s=deadline_s) as job, job.session("s") as s:
                    stream = await open_stream(rt, s, via)
                    async for _ in stream:
                        pass
            except TimeoutError:
                assert deadline_s is not None
    return job.report


@PHASES
@pytest.mark.parametrize("via", ["session.chat", "rt.openai"])
async def test_a_cancel_in_a_nursery_is_cancelled(phase: str, via: str) -> None:
    report = await nursery_job(phase, via, cancel_after=0.3)
    (call,) = report.call_reports
    assert (report.status, report.error) == ("cancelled", "cancelled")
    assert call.status == "cancelled", call.error
    assert call.error is not None and "cancelled" in call.error


@PHASES
@pytest.mark.parametrize("via", ["session.chat", "rt.openai"])
async def test_a_deadline_in_a_nursery_is_the_deadline(phase: str, via: str) -> None:
    report = await nursery_job(phase, via, deadline_s=0.3)
    (call,) = report.call_reports
    assert report.status == "deadline", report.error
    assert call.status == "cancelled", call.error
    assert call.error == "deadline of 0.3 s exceeded"


@BACKENDS
@PHASES
def test_a_sync_deadline_in_a_nursery_is_the_deadline(backend: str, phase: str) -> None:
    with agentrt.SyncRuntime(
        [NURSERY_URL], transport=nursery_transport(phase), otel=False, backend=backend
    ) as srt:
        with pytest.raises(TimeoutError):
            with srt.job("n", deadline_s=0.3) as job, job.session("s") as s:
                for _ in s.chat(model=MODEL, messages=MESSAGES, stream=True):
                    pass
    (call,) = job.report.call_reports
    assert job.report.status == "deadline", job.report.error
    assert call.status == "cancelled", call.error
    assert call.error == "deadline of 0.3 s exceeded"


MANY = 200


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_many_jobs_cut_mid_stream_or_connecting_are_never_errors(
    server: FaultServer, how: str
) -> None:
    """200 jobs at once, each cut at a random moment: while it connects, waits for its
    reply or reads its stream (no call of them is an ``error``, on either backend)."""
    server.default = Fault.stream([chunk(f"w{i}") for i in range(40)], interval=0.005)
    rng = random.Random(25)
    jobs: list[agentrt.Job] = []
    caught: list[BaseException] = []

    async def one(rt: agentrt.Runtime, cut_s: float) -> None:
        deadline = cut_s if how == "deadline" else None
        with anyio.move_on_after(cut_s if how == "cancel" else 30.0):
            try:
                async with rt.job("cut", deadline_s=deadline) as job, job.session("s") as s:
                    jobs.append(job)
                    stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True)
                    async for _ in stream:
                        pass
            except TimeoutError:
                pass
            except Exception as exc:
                caught.append(exc)

    async with agentrt.Runtime([server.url], otel=False, concurrency=None) as rt:
        async with anyio.create_task_group() as tg:
            for _ in range(MANY):
                tg.start_soon(one, rt, rng.uniform(0.0, 0.25))
    assert not caught
    assert len(jobs) == MANY
    job_statuses = Counter(j.report.status for j in jobs)
    call_statuses = Counter(c.status for j in jobs for c in j.report.call_reports)
    errors = [c.error for j in jobs for c in j.report.call_reports if c.status == "error"]
    assert "error" not in job_statuses, (job_statuses, errors[:3])
    assert not errors, (call_statuses, errors[:3])
    cut = "deadline" if how == "deadline" else "cancelled"
    assert set(job_statuses) <= {"ok", cut}
    assert job_statuses[cut] >= MANY // 2  # most were cut before their stream's end


async def test_a_tool_wait_cancelled_in_a_nursery_is_cancelled(server: FaultServer) -> None:
    async with agentrt.Runtime([server.url], otel=False) as rt:
        with anyio.move_on_after(0.3):
            async with rt.job("t") as job, job.session("s") as s, s.tool("pytest"):
                await wait_in_a_nursery()
    (tool,) = job.report.tool_reports
    assert (job.report.status, tool.status) == ("cancelled", "cancelled")
