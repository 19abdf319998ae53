"""Expected tool waits: declared or learned, reported with their error, and predicted
from the tool calls of a reply (agentrt._waits wired into the context and transport)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from agentrt import Retry, Runtime, ToolReport
from agentrt._protocol import parse_agentrt_header
from agentrt.telemetry import Event, ToolStarted
from tests._fake import MSG, FakeEngine, Seen, chat_completion, sse_event

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


def expected(seen: Seen) -> tuple[float | None, str | None]:
    """The expected idle a request carried, and its source, read as a server reads them."""
    m = parse_agentrt_header(seen.headers["x-agentrt"])
    return m.idle_expected_s, m.idle_expected_source


def rt_for(fake: FakeEngine, **kwargs: Any) -> Runtime:
    return Runtime([URL], transport=fake.transport(), retry=FAST, **kwargs)


def tool_call_reply(*names: str) -> httpx.Response:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in enumerate(names)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return httpx.Response(200, json=chat_completion(message, usage, finish_reason="tool_calls"))


def tool_call_stream(*names: str) -> httpx.Response:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return sse_event(obj)

    parts = [chunk({"role": "assistant", "content": None})]
    for i, n in enumerate(names):
        first = {"index": i, "id": f"c{i}", "type": "function"}
        parts.append(chunk({"tool_calls": [{**first, "function": {"name": n, "arguments": ""}}]}))
        parts.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": "{}"}}]}))
    parts.append(chunk({}, "tool_calls"))
    parts.append(b"data: [DONE]\n\n")

    async def body() -> AsyncIterator[bytes]:  # streamed (bytes would come pre-read)
        for part in parts:
            yield part

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


async def test_wait_expectation_declared_then_learned() -> None:
    fake = FakeEngine()
    events: list[Event] = []
    async with rt_for(fake, hooks=[events.append]) as rt:
        async with rt.job("j") as job, job.session() as s:
            async with s.tool("search"):  # never seen: no expectation
                await anyio.sleep(0.02)
            async with s.tool("search"):  # learned from the first
                await anyio.sleep(0.02)
            async with s.tool("search", expected_s=5.0):  # the caller's wins
                pass
    first, second, third = job.report.tool_reports
    assert (first.expected_s, first.expected_source, first.error_s) == (None, None, None)
    assert second.expected_source == "learned"
    assert second.expected_s == pytest.approx(first.duration_s)
    assert second.error_s == pytest.approx(second.duration_s - first.duration_s)
    assert (third.expected_s, third.expected_source) == (5.0, "declared")
    assert third.error_s == pytest.approx(third.duration_s - 5.0)
    started = [e for e in events if isinstance(e, ToolStarted)]
    assert [e.expected_source for e in started] == [None, "learned", "declared"]


async def test_learning_is_per_runtime_and_can_be_off() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("a") as job, job.session() as s, s.tool("t"):
            pass
        async with rt.job("b") as job2, job2.session() as s2, s2.tool("t"):
            pass
    assert job2.report.tool_reports[0].expected_source == "learned"
    async with rt_for(fake, learn_waits=False) as rt:
        async with rt.job("a") as job, job.session() as s:
            async with s.tool("t"):
                pass
            async with s.tool("t"):
                pass
            await s.chat(model="m", messages=MSG)
    assert [t.expected_source for t in job.report.tool_reports] == [None, None]
    assert expected(fake.seen[-1]) == (None, None)
    with pytest.raises(TypeError, match="learn_waits"):
        Runtime([URL], learn_waits=1)  # type: ignore[arg-type]


async def test_cancelled_wait_is_not_learned() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("j") as job, job.session() as s:
            with anyio.move_on_after(0.01):
                async with s.tool("slow"):
                    await anyio.sleep(1)
            async with s.tool("slow"):
                pass
    cancelled, later = job.report.tool_reports
    assert cancelled.status == "cancelled"
    assert later.expected_s is None


async def test_call_after_tool_waits_expects_them_again() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        assert rt._core.waits is not None
        for _ in range(3):  # the waits below (~0 s) do not move the medians
            rt._core.waits.observe("search", 3.0)
            rt._core.waits.observe("fetch", 1.5)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search"):
                pass
            async with s.tool("fetch"):
                pass
            await s.chat(model="m", messages=MSG)  # expects search + fetch again
            await s.chat(model="m", messages=MSG)  # consumed: nothing
            async with s.tool("search"):
                pass
            s.expect_idle(9.0)
            await s.chat(model="m", messages=MSG)  # the declaration wins
    h = [expected(x) for x in fake.seen]
    assert h[0] == (None, None)
    assert h[1] == (4.5, "predicted")
    assert h[2] == (None, None)
    assert h[3] == (9.0, "declared")


@pytest.mark.parametrize("stream", [False, True])
async def test_reply_tool_calls_predict_the_next_idle(stream: bool) -> None:
    fake = FakeEngine()
    reply = tool_call_stream if stream else tool_call_reply
    fake.script = [lambda r: reply("search", "fetch", "unknown"), lambda r: None]
    async with rt_for(fake) as rt:
        assert rt._core.waits is not None
        rt._core.waits.observe("search", 3.0)
        rt._core.waits.observe("fetch", 1.0)
        async with rt.job("j") as job, job.session() as s:
            out: Any = await s.chat(model="m", messages=MSG, stream=stream)
            if stream:
                async for _ in out:
                    pass
            # No tool waits marked: the reply's tool calls are the session's next tools.
            await s.chat(model="m", messages=MSG)
    assert expected(fake.seen[0]) == (None, None)
    assert expected(fake.seen[1]) == (4.0, "predicted")  # unknown adds nothing
    assert job.report.calls == 2


async def test_reply_without_tool_calls_predicts_nothing() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        assert rt._core.waits is not None
        rt._core.waits.observe("search", 3.0)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
    assert expected(fake.seen[1]) == (None, None)
    assert job.report.calls == 2


def test_old_tool_reports_stay_readable() -> None:
    old = {"session_id": "s", "name": "t", "start_s": 0.0, "duration_s": 1.0, "expected_s": 2.0}
    t = ToolReport.model_validate(old)
    assert (t.expected_source, t.error_s) == (None, None)


async def test_mlfq_promotes_on_a_declared_long_wait_not_a_tiny_one() -> None:
    from agentrt.scheduling import MLFQ

    fake = FakeEngine(prompt_tokens=60, completion_tokens=40)  # 100 tokens a call
    policy = MLFQ(base_quota_tokens=100)
    async with rt_for(fake, policy=policy) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            assert policy.level_of(job.id) == 1  # demoted: 100 >= quota(0)
            async with s.tool("think", expected_s=0.0):  # far below the call's service
                pass
            assert policy.level_of(job.id) == 1
            await s.chat(model="m", messages=MSG)
            assert policy.level_of(job.id) == 1  # 100 < quota(1) = 200
            async with s.tool("crawl", expected_s=60.0):  # I/O-bound: promoted at once
                assert policy.level_of(job.id) == 0
        assert rt.reports()[-1].status == "ok"
