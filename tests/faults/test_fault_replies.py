"""2xx replies that are not what the API returns (garbled or truncated JSON, an empty
object, an error object, a malformed SSE event, JSON where a stream was asked for), on
real sockets: each is an ``EndpointError`` of the call naming the endpoint, the status,
the content type and the body's start (never the key), recorded as an error in the report
and the journal, and not retried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _faultserver import MODEL, Fault, FaultServer, chat_completion, chunk, fault_server

import agentrt

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = agentrt.Retry(attempts=3, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
KEY = "sk-fault-SECRET-0123"

GARBLED = {
    "truncated": Fault.raw_reply(
        200, json.dumps(chat_completion())[:60].encode(), "application/json"
    ),
    "invalid": Fault.raw_reply(200, b'{"id": tru', "application/json"),
    "empty-object": Fault.json(200, {}),
    "error-object": Fault.json(200, {"error": {"message": "overloaded"}}),
    "array": Fault.json(200, [chat_completion()]),
    "html": Fault.raw_reply(200, b"<html>gateway</html>", "text/html"),
    "empty-body": Fault.raw_reply(200, b"", "application/json"),
}


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


async def _one(
    server: FaultServer, tmp_path: Path, *, stream: bool
) -> tuple[agentrt.JobReport, BaseException | None, dict[str, Any]]:
    journal = tmp_path / "journal.jsonl"
    caught: BaseException | None = None
    async with agentrt.Runtime(
        [server.url], retry=FAST, otel=False, api_key=KEY, journal=journal
    ) as rt:
        try:
            async with rt.job("garbled") as job, job.session("s") as s:
                reply = await s.chat(model=MODEL, messages=MESSAGES, stream=stream)
                if stream:
                    [c async for c in reply]
        except Exception as exc:
            caught = exc
    (line,) = journal.read_text().splitlines()
    return job.report, caught, json.loads(line)


@pytest.mark.parametrize("kind", sorted(GARBLED))
async def test_a_2xx_reply_that_is_not_a_completion_is_an_endpoint_error(
    server: FaultServer, tmp_path: Path, kind: str
) -> None:
    server.push(GARBLED[kind])
    report, caught, line = await _one(server, tmp_path, stream=False)
    assert isinstance(caught, agentrt.EndpointError), repr(caught)
    assert caught.endpoint == server.url
    message = str(caught)
    assert server.url in message and "200" in message
    assert "SECRET" not in message
    (call,) = report.call_reports
    assert (call.status, call.attempts, call.http_status) == ("error", 1, 200)
    assert call.error == message
    assert report.status == "error"
    assert len(server.chat_requests) == 1  # not retried
    assert line["status"] == "error"
    assert [c["status"] for c in line["call_reports"]] == ["error"]
    assert "SECRET" not in json.dumps(line)


@pytest.mark.parametrize(
    "events",
    [
        [chunk("a"), b"data: {garbled\n\n"],
        [chunk("a"), b"data: [1, 2]\n\n"],
        [b"data: not json at all\n\n"],
    ],
    ids=["garbled", "not-an-object", "first-event"],
)
async def test_a_malformed_stream_event_is_an_endpoint_error(
    server: FaultServer, tmp_path: Path, events: list[bytes]
) -> None:
    server.push(Fault.stream(events))
    report, caught, line = await _one(server, tmp_path, stream=True)
    assert isinstance(caught, agentrt.EndpointError), repr(caught)
    assert caught.endpoint == server.url
    (call,) = report.call_reports
    assert call.status == "error" and call.error == str(caught)
    assert "closed before it ended" not in (call.error or "")
    assert report.status == "error"
    assert line["call_reports"][0]["status"] == "error"
    assert len(server.chat_requests) == 1


async def test_a_json_reply_to_a_streamed_call_is_an_endpoint_error(
    server: FaultServer, tmp_path: Path
) -> None:
    server.push(Fault.ok())
    report, caught, _ = await _one(server, tmp_path, stream=True)
    assert isinstance(caught, agentrt.EndpointError), repr(caught)
    assert report.call_reports[0].status == "error"
    assert report.status == "error"


async def test_a_garbled_reply_does_not_poison_the_next_call(server: FaultServer) -> None:
    server.push(GARBLED["invalid"])
    async with agentrt.Runtime([server.url], retry=FAST, otel=False) as rt:
        async with rt.job("next") as job, job.session("s") as s:
            with pytest.raises(agentrt.EndpointError):
                await s.chat(model=MODEL, messages=MESSAGES)
            reply = await s.chat(model=MODEL, messages=MESSAGES)
    assert reply.choices[0].message.content == "ok"
    assert [c.status for c in job.report.call_reports] == ["error", "ok"]
    assert job.report.status == "ok"
