"""A job's deadline bounds every call of the job, whatever path it takes: async and sync,
streamed and not, agentrt's own session methods, the openai clients agentrt builds and a
framework adapter's model; the job ends with status ``deadline`` (issue 16: a
SyncRuntime stream ran its full length past the deadline and the job ended ``ok``)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import openai
import pytest

from agentrt import Runtime, SyncRuntime
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"
DEADLINE = 0.5
SLOW = 4.0  # the slow replies take this long; a bounded call ends well before


def slow_stream(_r: httpx.Request) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for i in range(int(SLOW / 0.1)):
            obj = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": str(i)}, "finish_reason": None}],
            }
            yield b"data: " + json.dumps(obj).encode() + b"\n\n"
            await anyio.sleep(0.1)
        yield b"data: [DONE]\n\n"

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def slow_engine(stream: bool) -> FakeEngine:
    if stream:
        return FakeEngine(script=[slow_stream])
    return FakeEngine(delay_s=SLOW)


def check_deadline(report_status: str, call_status: str, error: str | None, took: float) -> None:
    assert report_status == "deadline"
    assert call_status == "cancelled" and error is not None and "deadline" in error
    assert took < SLOW / 2, f"the call ran {took:.2f} s past a {DEADLINE} s deadline"


SYNC_PATHS: dict[str, Callable[..., None]] = {
    "session.chat": lambda rt, s, stream: (
        list(s.chat(model="m", messages=MSG, stream=True))
        if stream
        else s.chat(model="m", messages=MSG)
    ),
    "rt.openai": lambda rt, s, stream: (
        list(rt.openai().chat.completions.create(model="m", messages=MSG, stream=True))
        if stream
        else rt.openai().chat.completions.create(model="m", messages=MSG)
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", list(SYNC_PATHS))
def test_sync_deadline_bounds_every_call(path: str, stream: bool) -> None:
    fake = slow_engine(stream)
    with SyncRuntime([URL], transport=fake.transport()) as rt:
        t0 = time.perf_counter()
        with pytest.raises((TimeoutError, openai.APIConnectionError)):
            with rt.job("j", deadline_s=DEADLINE) as job, job.session() as s:
                SYNC_PATHS[path](rt, s, stream)
        took = time.perf_counter() - t0
    report = job.report
    (call,) = report.call_reports
    check_deadline(report.status, call.status, call.error, took)


def test_a_sync_job_that_ends_past_its_deadline_ends_deadline() -> None:
    with SyncRuntime([URL], transport=FakeEngine().transport()) as rt:
        with pytest.raises(TimeoutError):
            with rt.job("j", deadline_s=1.0) as job, job.session() as s:
                s.chat(model="m", messages=MSG)
                time.sleep(1.1)  # sync work cannot be cancelled; the job ends late
    assert job.report.status == "deadline"
    assert job.report.call_reports[0].status == "ok"


def test_a_sync_job_within_its_deadline_is_ok() -> None:
    with SyncRuntime([URL], transport=FakeEngine().transport()) as rt:
        with rt.job("j", deadline_s=30) as job, job.session() as s:
            assert list(s.chat(model="m", messages=MSG, stream=True))
            s.chat(model="m", messages=MSG)
    assert job.report.status == "ok"
    assert [c.status for c in job.report.call_reports] == ["ok", "ok"]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_async_deadline_bounds_session_and_openai_calls(stream: bool) -> None:
    for use_openai in (False, True):
        fake = slow_engine(stream)
        async with Runtime([URL], transport=fake.transport()) as rt:
            t0 = time.perf_counter()
            with pytest.raises(TimeoutError):
                async with rt.job("j", deadline_s=DEADLINE) as job, job.session() as s:
                    if use_openai:
                        create = rt.openai().chat.completions.create
                        out = await create(model="m", messages=MSG, stream=stream)  # type: ignore[call-overload]
                    else:
                        out = await s.chat(model="m", messages=MSG, stream=stream)
                    if stream:
                        async for _ in out:
                            pass
            took = time.perf_counter() - t0
        (call,) = job.report.call_reports
        check_deadline(job.report.status, call.status, call.error, took)


@pytest.mark.anyio
async def test_a_call_outside_the_jobs_cancel_scope_is_bounded_too() -> None:
    """A task started from a task group outside the job's block carries the job's
    session (contextvars) but not its cancel scope: the transport bounds the call."""
    fake = slow_engine(True)
    errors: list[BaseException] = []
    async with Runtime([URL], transport=fake.transport()) as rt:
        client = rt.openai()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            async with rt.job("j", deadline_s=DEADLINE) as job, job.session():

                async def read() -> None:
                    try:
                        stream = await client.chat.completions.create(
                            model="m",
                            messages=MSG,  # type: ignore[arg-type]
                            stream=True,
                        )
                        async for _ in stream:
                            pass
                    except TimeoutError as exc:
                        errors.append(exc)

                tg.start_soon(read)
                await anyio.sleep(DEADLINE * 0.8)
        took = time.perf_counter() - t0
    # The job's block ended first (its report says the reply was not read); the call
    # itself still ended at the deadline, not after the whole stream.
    assert len(errors) == 1 and took < SLOW / 2
    assert job.report.call_reports[0].status != "ok"


def test_a_framework_model_is_bounded_by_the_jobs_deadline() -> None:
    pytest.importorskip("langchain_openai")
    from agentrt.integrations import langchain

    fake = slow_engine(True)
    with SyncRuntime([URL], transport=fake.transport()) as rt:
        model = langchain.model(rt, "m")
        t0 = time.perf_counter()
        with pytest.raises((TimeoutError, openai.APIConnectionError)):
            with rt.job("j", deadline_s=DEADLINE) as job, job.session():
                for _ in model.stream("hi"):
                    pass
        took = time.perf_counter() - t0
    (call,) = job.report.call_reports
    check_deadline(job.report.status, call.status, call.error, took)
