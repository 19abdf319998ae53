"""A framework adapter (LangChain's chat model through agentrt) against the fault
server: retries stay in agentrt, failures reach the agent as errors it can see, and the
report agrees with them."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from _faultserver import MODEL, Fault, FaultServer, chunk, fault_server

import agentrt

pytest.importorskip("langchain_openai")

from agentrt.integrations import langchain as lc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = agentrt.Retry(attempts=3, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
DISCONNECT_BOUND_S = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LangChain runs on asyncio


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


async def test_langchain_storm_is_retried_by_agentrt_only(server: FaultServer) -> None:
    server.push(Fault.status(503), Fault.status(429, retry_after="0"))
    async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
        llm = lc.model(rt, MODEL)
        async with rt.job("lc") as job, job.session("agent"):
            reply = await llm.ainvoke("hi")
    assert reply.content == "ok"
    (call,) = job.report.call_reports
    assert (call.status, call.attempts) == ("ok", 3)
    assert len(server.chat_requests) == 3  # openai's own retries are off


async def test_langchain_garbled_reply_is_an_endpoint_error(server: FaultServer) -> None:
    server.push(Fault.json(200, {"error": {"message": "upstream"}}))
    async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
        llm = lc.model(rt, MODEL)
        with pytest.raises(agentrt.EndpointError):
            async with rt.job("lc") as job, job.session("agent"):
                await llm.ainvoke("hi")
    assert job.report.status == "error"
    assert job.report.call_reports[0].status == "error"
    assert len(server.chat_requests) == 1


async def test_langchain_deadline_closes_the_request(server: FaultServer) -> None:
    server.push(Fault.stall())
    async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
        llm = lc.model(rt, MODEL)
        with pytest.raises(TimeoutError):
            async with rt.job("lc", deadline_s=2.0) as job, job.session("agent"):
                await llm.ainvoke("hi")
    assert job.report.status == "deadline"
    assert job.report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


async def test_langchain_cancelled_stream_closes_the_request(server: FaultServer) -> None:
    server.push(Fault.stream([chunk(str(i)) for i in range(100)], interval=0.05))
    async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
        llm = lc.model(rt, MODEL)
        async with rt.job("lc") as job, job.session("agent"):
            with anyio.move_on_after(1.5):  # the stream takes 5 s
                async for _ in llm.astream("hi"):
                    pass
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None
    assert job.report.status == "ok"
    assert job.report.call_reports[0].status == "cancelled"


def test_langchain_sync_stream_is_bounded_by_the_deadline(server: FaultServer) -> None:
    """The adapter on a SyncRuntime: a deadline stops ``llm.stream(...)`` midway."""
    server.push(Fault.stream([chunk(str(i)) for i in range(200)], interval=0.1))
    caught: BaseException | None = None
    with agentrt.SyncRuntime([server.url], retry=FAST, otel=False) as rt:
        llm = lc.model(rt, MODEL)
        try:
            with rt.job("lc-sync", deadline_s=1.0) as job, job.session("agent"):
                for _ in llm.stream("hi"):
                    pass
        except Exception as exc:
            caught = exc
    assert caught is not None
    assert job.report.status == "deadline"
    assert job.report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None
