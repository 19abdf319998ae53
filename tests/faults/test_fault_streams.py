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
import time
from typing import Any

import anyio
import pytest
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
