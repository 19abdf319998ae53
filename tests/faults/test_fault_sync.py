"""SyncRuntime against the fault server: the same truthful endings for code that is not
async (its calls run on the runtime's event loop in a thread)."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest
from _faultserver import MODEL, Fault, FaultServer, chunk, fault_server, refused_url

import agentrt

pytestmark = pytest.mark.timeout(30)

FAST = agentrt.Retry(attempts=3, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
DISCONNECT_BOUND_S = 5.0


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


def sync_job(
    server_urls: list[str], *, stream: bool = False, deadline_s: float | None = None, **kw: Any
) -> tuple[agentrt.JobReport, BaseException | None]:
    caught: BaseException | None = None
    with agentrt.SyncRuntime(server_urls, retry=FAST, otel=False, **kw) as rt:
        try:
            with rt.job("sync-fault", deadline_s=deadline_s) as job, job.session("s") as s:
                reply = s.chat(model=MODEL, messages=MESSAGES, stream=stream)
                if stream:
                    list(reply)  # type: ignore[arg-type]
        except Exception as exc:
            caught = exc
    return job.report, caught


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_storm_then_success(server: FaultServer, backend: str) -> None:
    server.push(Fault.status(503), Fault.drop())
    report, caught = sync_job([server.url], backend=backend)
    assert caught is None
    assert report.status == "ok"
    # The drop comes on the 503's kept-alive connection: resent at once on a new one, in
    # the same attempt (tests/faults/test_fault_transport.py).
    assert report.call_reports[0].attempts == 2
    assert [(s.fault, s.reused) for s in server.chat_requests] == [
        ("503", False),
        ("drop", True),
        ("ok", False),
    ]


def test_sync_storm_past_the_attempts(server: FaultServer) -> None:
    server.default = Fault.status(429)
    report, caught = sync_job([server.url])
    assert isinstance(caught, openai.RateLimitError)
    (call,) = report.call_reports
    assert (call.status, call.attempts, call.http_status) == ("error", 3, 429)
    assert report.status == "error"


def test_sync_refused_endpoint_fails_over(server: FaultServer) -> None:
    report, caught = sync_job([refused_url(), server.url], routing="round_robin")
    assert caught is None and report.status == "ok"
    assert report.call_reports[0].endpoint == server.url


def test_sync_deadline_on_a_stalled_call(server: FaultServer) -> None:
    server.push(Fault.stall())
    t0 = time.monotonic()
    report, caught = sync_job([server.url], deadline_s=2.0)
    assert isinstance(caught, TimeoutError)
    assert time.monotonic() - t0 < 10.0
    assert report.status == "deadline"
    assert report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


def test_sync_dropped_stream_is_an_endpoint_error(server: FaultServer) -> None:
    server.push(Fault.stream([chunk("a")], done=False))
    report, caught = sync_job([server.url], stream=True)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.endpoint == server.url
    assert report.call_reports[0].status == "error"
    assert report.status == "error"


def test_sync_garbled_reply_is_an_endpoint_error(server: FaultServer) -> None:
    server.push(Fault.raw_reply(200, b'{"choices": [', "application/json"))
    report, caught = sync_job([server.url])
    assert isinstance(caught, agentrt.EndpointError)
    assert report.call_reports[0].status == "error"
    assert report.status == "error"
    assert len(server.chat_requests) == 1


def test_sync_deadline_bounds_a_stream(server: FaultServer) -> None:
    """A deadline stops a stream the sync iterator is reading, not only the call that
    opened it."""
    server.push(Fault.stream([chunk(str(i)) for i in range(200)], interval=0.1))
    t0 = time.monotonic()
    report, caught = sync_job([server.url], stream=True, deadline_s=1.0)
    assert isinstance(caught, TimeoutError), repr(caught)
    assert time.monotonic() - t0 < 15.0  # the stream alone runs 20 s
    assert report.status == "deadline"
    assert report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


@pytest.mark.parametrize("stream", [False, True])
def test_sync_deadline_bounds_an_openai_client_call(server: FaultServer, stream: bool) -> None:
    """``rt.openai()`` (a sync openai client) inside a job with a deadline: the job ends
    ``deadline`` whatever the client wrapped the timeout in."""
    server.push(
        Fault.stream([chunk(str(i)) for i in range(200)], interval=0.1) if stream else Fault.stall()
    )
    caught: BaseException | None = None
    t0 = time.monotonic()
    with agentrt.SyncRuntime([server.url], retry=FAST, otel=False) as rt:
        client = rt.openai()
        try:
            with rt.job("sync-openai", deadline_s=1.0) as job, job.session("s"):
                reply = client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=stream
                )
                if stream:
                    list(reply)  # type: ignore[call-overload]
        except Exception as exc:
            caught = exc
    assert caught is not None
    assert time.monotonic() - t0 < 15.0
    assert job.report.status == "deadline"
    assert job.report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None
