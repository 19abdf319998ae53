"""agentrt's async runtime against a fault server on real loopback sockets (asyncio and
trio): every job ends with a status that matches what its caller saw, retries follow the
documented rule, cancellation and deadlines reach the server as a closed connection, and
nothing hangs (each test has a hard timeout)."""

from __future__ import annotations

import email.utils
import json
import random
import time
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from _faultserver import (
    MODEL,
    Fault,
    FaultServer,
    chat_completion,
    chunk,
    fault_server,
    refused_url,
    silent_listener,
)

import agentrt

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = agentrt.Retry(attempts=3, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
DISCONNECT_BOUND_S = 5.0
"""How soon the server must see a cancelled or timed-out request's connection close
(generous: a noisy 2-core machine; in practice it is milliseconds)."""


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


def runtime(*urls: str, retry: agentrt.Retry = FAST, **kwargs: Any) -> agentrt.Runtime:
    return agentrt.Runtime(list(urls), retry=retry, otel=False, **kwargs)


async def run_job(
    rt: agentrt.Runtime, *, stream: bool = False, deadline_s: float | None = None
) -> tuple[agentrt.JobReport, BaseException | None, Any]:
    """One job of one call; returns its report, what the caller caught, and the reply."""
    caught: BaseException | None = None
    reply: Any = None
    job: agentrt.Job | None = None
    try:
        async with rt.job("fault", deadline_s=deadline_s) as job, job.session("s") as s:
            reply = await s.chat(model=MODEL, messages=MESSAGES, stream=stream)
            if stream:
                reply = [c async for c in reply]
    except Exception as exc:
        caught = exc
    assert job is not None
    return job.report, caught, reply


# -- status storms and Retry-After ------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_storm_then_success_is_one_ok_call(server: FaultServer, status: int) -> None:
    server.push(Fault.status(status), Fault.status(status))
    async with runtime(server.url) as rt:
        report, caught, reply = await run_job(rt)
    assert caught is None
    assert reply.choices[0].message.content == "ok"
    assert report.status == "ok"
    (call,) = report.call_reports
    assert (call.status, call.attempts, call.http_status) == ("ok", 3, 200)
    assert report.retries == 2
    assert len(server.chat_requests) == 3


async def test_storm_longer_than_the_attempts_ends_in_the_status_error(
    server: FaultServer,
) -> None:
    server.default = Fault.status(503)
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt)
    assert isinstance(caught, openai.InternalServerError)
    assert caught.status_code == 503
    assert report.status == "error"
    (call,) = report.call_reports
    assert (call.status, call.attempts, call.http_status) == ("error", 3, 503)
    assert len(server.chat_requests) == 3  # no fourth attempt


@pytest.mark.parametrize("status", [400, 404])
async def test_client_errors_are_not_retried(server: FaultServer, status: int) -> None:
    server.push(Fault.status(status))
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt)
    assert isinstance(caught, openai.APIStatusError)
    assert caught.status_code == status
    (call,) = report.call_reports
    assert (call.status, call.attempts) == ("error", 1)
    assert report.status == "error"
    assert len(server.chat_requests) == 1


@pytest.mark.parametrize(
    ("header", "value", "least_s"),
    [("retry_after", "1", 0.9), ("retry_after_ms", "800", 0.7)],
)
async def test_retry_after_is_honoured(
    server: FaultServer, header: str, value: str, least_s: float
) -> None:
    server.push(Fault.status(429, **{header: value}))
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt)
    assert caught is None and report.status == "ok"
    first, second = server.chat_requests
    assert second.at - first.at >= least_s  # not the 10 ms backoff
    assert report.call_reports[0].attempts == 2


@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_retry_after_is_capped(server: FaultServer, form: str) -> None:
    """An hour's Retry-After waits at most ``retry_after_max``, in either form."""
    value = "3600" if form == "seconds" else email.utils.formatdate(time.time() + 3600, usegmt=True)
    server.push(Fault.status(503, retry_after=value))
    retry = agentrt.Retry(attempts=2, wait_initial=0.01, wait_jitter=0.0, retry_after_max=0.3)
    t0 = time.monotonic()
    async with runtime(server.url, retry=retry) as rt:
        report, caught, _ = await run_job(rt)
    assert caught is None and report.status == "ok"
    assert time.monotonic() - t0 < 15.0
    first, second = server.chat_requests
    assert second.at - first.at < 10.0


# -- connections that break -------------------------------------------------------------------


async def test_dropped_connections_are_retried(server: FaultServer) -> None:
    server.push(Fault.drop(), Fault.drop())
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt)
    assert caught is None and report.status == "ok"
    assert report.call_reports[0].attempts == 3
    assert len(server.chat_requests) == 3


async def test_dropped_every_time_is_an_endpoint_error_naming_it(server: FaultServer) -> None:
    server.default = Fault.drop()
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.endpoint == server.url and caught.attempts == 3
    assert server.url in str(caught)
    (call,) = report.call_reports
    assert (call.status, call.attempts) == ("error", 3)
    assert call.error == str(caught)
    assert report.status == "error"


async def test_stream_dropped_midway_is_an_error_of_the_call(server: FaultServer) -> None:
    server.push(Fault.stream([chunk("a"), chunk("b")], done=False))
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt, stream=True)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.endpoint == server.url
    # The transport's error is its .error, not its chained cause (one-exception traceback).
    assert caught.error is not None and caught.__cause__ is None and caught.__suppress_context__
    (call,) = report.call_reports
    assert call.status == "error" and call.stream
    assert report.status == "error"
    assert len(server.chat_requests) == 1  # a stream that started is not replayed


async def test_refused_endpoint_fails_fast_with_an_endpoint_error() -> None:
    url = refused_url()
    async with runtime(url) as rt:
        report, caught, _ = await run_job(rt)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.endpoint == url
    assert report.call_reports[0].status == "error"
    assert report.status == "error"


async def test_never_accepting_listener_is_bounded_by_the_timeout() -> None:
    with silent_listener() as url:
        retry = agentrt.Retry(attempts=2, wait_initial=0.01, wait_jitter=0.0)
        async with runtime(url, retry=retry, timeout_s=0.5) as rt:
            report, caught, _ = await run_job(rt)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.attempts == 2
    (call,) = report.call_reports
    assert (call.status, call.attempts) == ("error", 2)
    assert "Timeout" in (call.error or "")


async def test_stall_past_the_timeout_is_retried_and_the_server_sees_it_go(
    server: FaultServer,
) -> None:
    server.push(Fault.stall())
    async with runtime(server.url, timeout_s=0.5) as rt:
        report, caught, _ = await run_job(rt)
    assert caught is None and report.status == "ok"
    assert report.call_reports[0].attempts == 2
    stalled = server.chat_requests[0]
    assert server.wait_disconnect(stalled, DISCONNECT_BOUND_S) is not None


# -- failover between two endpoints -----------------------------------------------------------


async def test_failover_from_a_refused_endpoint(server: FaultServer) -> None:
    dead = refused_url()
    async with runtime(dead, server.url, routing="round_robin") as rt:
        reports = [(await run_job(rt))[0] for _ in range(4)]
    assert [r.status for r in reports] == ["ok"] * 4
    assert all(r.call_reports[0].endpoint == server.url for r in reports)
    assert len(server.chat_requests) == 4


async def test_failover_from_a_stalled_endpoint(server: FaultServer) -> None:
    with fault_server(Fault.stall()) as stalled:
        async with runtime(stalled.url, server.url, timeout_s=0.5, routing="round_robin") as rt:
            report, caught, _ = await run_job(rt)
            report2, caught2, _ = await run_job(rt)
        assert stalled.chat_requests  # round robin sent one of the two there
        for seen in stalled.chat_requests:
            assert stalled.wait_disconnect(seen, DISCONNECT_BOUND_S) is not None
    assert caught is None and caught2 is None
    assert report.call_reports[0].endpoint == report2.call_reports[0].endpoint == server.url


# -- cancellation and deadlines reach the server ---------------------------------------------


async def test_deadline_on_a_stalled_call(server: FaultServer) -> None:
    server.push(Fault.stall())
    async with runtime(server.url) as rt:
        t0 = time.monotonic()
        report, caught, _ = await run_job(rt, deadline_s=2.0)
        elapsed = time.monotonic() - t0
    assert isinstance(caught, TimeoutError)
    assert elapsed < 10.0
    assert report.status == "deadline"
    (call,) = report.call_reports
    assert call.status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


async def test_deadline_on_a_slow_stream(server: FaultServer) -> None:
    server.push(Fault.stream([chunk(str(i)) for i in range(200)], interval=0.1))
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt, stream=True, deadline_s=1.0)
    assert isinstance(caught, TimeoutError)
    assert report.status == "deadline"
    assert report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


async def test_deadline_on_a_slow_drip(server: FaultServer) -> None:
    body = b" " * 100 + json.dumps(chat_completion()).encode()
    server.push(Fault.drip(body, pieces=100, interval=0.1))
    async with runtime(server.url) as rt:
        report, caught, _ = await run_job(rt, deadline_s=1.0)
    assert isinstance(caught, TimeoutError)
    assert report.status == "deadline"
    assert report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


async def test_cancelled_call_closes_its_request_and_the_job_goes_on(
    server: FaultServer,
) -> None:
    server.push(Fault.stall())
    async with runtime(server.url) as rt:
        async with rt.job("cancel") as job, job.session("s") as s:
            with anyio.move_on_after(0.3) as scope:
                await s.chat(model=MODEL, messages=MESSAGES)
            assert scope.cancelled_caught
            reply = await s.chat(model=MODEL, messages=MESSAGES)
    assert reply.choices[0].message.content == "ok"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None
    report = job.report
    assert report.status == "ok"
    assert [c.status for c in report.call_reports] == ["cancelled", "ok"]


async def test_cancelled_job_is_cancelled(server: FaultServer) -> None:
    server.push(Fault.stall())
    job: agentrt.Job | None = None
    async with runtime(server.url) as rt:
        with anyio.move_on_after(0.3):
            async with rt.job("cancel") as job, job.session("s") as s:
                await s.chat(model=MODEL, messages=MESSAGES)
    assert job is not None
    assert job.report.status == "cancelled"
    assert job.report.call_reports[0].status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None


async def test_consumer_that_stops_reading_a_stream_closes_it(server: FaultServer) -> None:
    server.push(Fault.stream([chunk("a"), chunk("b")], then_stall=60.0))
    async with runtime(server.url) as rt:
        async with rt.job("stop") as job, job.session("s") as s:
            stream = await s.chat(model=MODEL, messages=MESSAGES, stream=True)
            got = []
            async for c in stream:
                got.append(c.choices[0].delta.content)
                if len(got) == 2:
                    break
            await stream.close()
    assert got == ["a", "b"]
    assert server.wait_disconnect(server.chat_requests[0], DISCONNECT_BOUND_S) is not None
    assert job.report.status == "ok"
    (call,) = job.report.call_reports
    assert call.status == "cancelled"  # the caller's choice, not the endpoint's failure
    assert call.error == "the caller closed the stream before its end"


# -- odd but valid replies ---------------------------------------------------------------------


async def test_huge_reply(server: FaultServer) -> None:
    content = "x" * (8 * 2**20)
    server.push(Fault.ok(content))
    async with runtime(server.url) as rt:
        report, caught, reply = await run_job(rt)
    assert caught is None
    assert len(reply.choices[0].message.content) == len(content)
    assert report.call_reports[0].status == "ok"
    assert report.call_reports[0].prompt_tokens == 5


async def test_slow_drip_within_the_timeout_is_fine(server: FaultServer) -> None:
    body = json.dumps(chat_completion("dripped")).encode()
    server.push(Fault.drip(body, pieces=20, interval=0.02))
    async with runtime(server.url, timeout_s=5.0) as rt:
        report, caught, reply = await run_job(rt)
    assert caught is None
    assert reply.choices[0].message.content == "dripped"
    assert report.call_reports[0].status == "ok"


async def test_wrong_content_type_is_an_endpoint_error(server: FaultServer) -> None:
    server.push(Fault.raw_reply(200, b"<html><body>proxy login</body></html>", "text/html"))
    async with runtime(server.url, api_key="sk-fault-SECRET") as rt:
        report, caught, _ = await run_job(rt)
    assert isinstance(caught, agentrt.EndpointError)
    assert caught.endpoint == server.url
    message = str(caught)
    assert "text/html" in message and "200" in message and "proxy login" in message
    assert "SECRET" not in message
    (call,) = report.call_reports
    assert call.status == "error" and call.error == message
    assert report.status == "error"


# -- many jobs on a flaky endpoint --------------------------------------------------------------


async def test_many_jobs_on_a_flaky_endpoint_all_end_and_agree(
    server: FaultServer, tmp_path: Path
) -> None:
    """40 jobs of 3 calls, 20 in flight; a seeded fifth of the attempts fail (503s,
    drops). Every job ends; the reports count exactly the attempts the server saw, and
    every call the caller saw fail is an error in its report; the journal holds every
    job's line, the same as its report, and counts none lost."""
    rng = random.Random(16)
    faults = [
        rng.choice([Fault.status(503), Fault.drop(), Fault.status(429)])
        if rng.random() < 0.2
        else Fault.ok()
        for _ in range(300)
    ]
    server.push(*faults)
    failures: dict[str, int] = {}
    reports: list[agentrt.JobReport] = []

    async def one(i: int, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            try:
                async with rt.job(f"j{i}") as job, job.session("s") as s:
                    for _ in range(3):
                        try:
                            await s.chat(model=MODEL, messages=MESSAGES)
                        except (openai.APIStatusError, agentrt.EndpointError):
                            failures[job.id] = failures.get(job.id, 0) + 1
            finally:
                reports.append(job.report)

    journal = tmp_path / "journal.jsonl"
    async with runtime(server.url, journal=journal) as rt:
        limiter = anyio.CapacityLimiter(20)
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i, limiter)
        stats = rt.journal_statistics()
    assert (stats.written, stats.lost, stats.hook_errors) == (40, 0, 0)
    lines = {d["job_id"]: d for d in map(json.loads, journal.read_text().splitlines())}
    assert len(lines) == 40
    for r in reports:
        line = lines[r.job_id]
        assert line["status"] == r.status
        assert [c["attempts"] for c in line["call_reports"]] == [c.attempts for c in r.call_reports]
    assert len(reports) == 40
    assert all(r.status == "ok" for r in reports)  # the caller caught every failure
    calls = [c for r in reports for c in r.call_reports]
    assert len(calls) == 120
    # A drop on a kept-alive connection is resent at once in the same attempt (a stale
    # connection, not a failure: tests/faults/test_fault_transport.py).
    resent = sum(s.fault == "drop" and s.reused for s in server.chat_requests)
    assert sum(c.attempts for c in calls) == len(server.chat_requests) - resent
    for r in reports:
        assert sum(c.status == "error" for c in r.call_reports) == failures.get(r.job_id, 0)
    assert sum(c.attempts > 1 for c in calls) > 0  # the storm did hit


# -- bad input never reaches the server -------------------------------------------------------


@pytest.mark.parametrize("value", [object(), b"\xff\xfe"], ids=["object", "non-utf8-bytes"])
async def test_unserializable_metadata_is_refused_before_any_request(
    server: FaultServer, value: object
) -> None:
    async with runtime(server.url) as rt:
        with pytest.raises((TypeError, ValueError)):
            async with rt.job("bad", metadata={"k": value}) as job, job.session("s") as s:
                await s.chat(model=MODEL, messages=MESSAGES)
    assert server.seen == []


@pytest.mark.parametrize("key", ["sk-é", "sk-1\r\nx-evil: 1", " sk-1"])
async def test_a_key_that_cannot_be_a_header_is_refused_before_any_request(
    server: FaultServer, key: str
) -> None:
    with pytest.raises(ValueError) as info:
        runtime(server.url, api_key=key)
    assert key.strip() not in str(info.value)
    assert server.seen == []
