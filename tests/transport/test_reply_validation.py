"""A 2xx reply the caller's client cannot read (not JSON, cut short, not a completion; a
stream event that is not a JSON object) is an error of the call: an ``EndpointError``
that names the endpoint, the status, the content type and the start of the body, never
the key; recorded as such in the report, the journal and the events; not retried
(issue 16). Wire-format tests on ``httpx.MockTransport``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from agentrt import EndpointError, Runtime, SyncRuntime
from agentrt.telemetry import CallEnded, Event, read_journal
from tests._fake import MSG, FakeEngine, sse_event

URL = "http://engine.test/v1"
KEY = "sk-secret-123"

GOOD = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
TRUNCATED = json.dumps(GOOD).encode()[:-9]
GARBLED_MIDDLE = json.dumps(GOOD).encode().replace(b'"hi"', b'"hi"x')


def reply(
    body: bytes, ctype: str = "application/json"
) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _r: httpx.Response(200, headers={"content-type": ctype}, content=body)


BAD_REPLIES = [
    (TRUNCATED, "not valid JSON"),
    (GARBLED_MIDDLE, "not valid JSON"),
    (b"{not json}", "not valid JSON"),
    (b"<html>hi</html>", "not valid JSON"),
    (b"{}", "not a completion"),
    (b'{"error": {"message": "overloaded"}}', "an error object"),
    (b"[1, 2]", "JSON list"),
    (b"\xff\xfe{", "not valid JSON"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "problem"), BAD_REPLIES)
async def test_an_unreadable_reply_is_an_endpoint_error(
    body: bytes, problem: str, tmp_path: object
) -> None:
    fake = FakeEngine(script=[reply(body)])
    events: list[Event] = []
    journal = f"{tmp_path}/j.jsonl"
    registry = CollectorRegistry()
    async with Runtime(
        [URL],
        api_key=KEY,
        transport=fake.transport(),
        hooks=[events.append],
        journal=journal,
        prometheus=registry,
    ) as rt:
        with pytest.raises(EndpointError) as info:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    message = str(info.value)
    assert URL in message and problem in message
    assert "HTTP 200" in message and "application/json" in message
    assert repr(body[:20])[2:-1] in message  # the start of the body
    assert KEY not in message
    assert info.value.endpoint == URL
    assert len(fake.seen) == 1  # not retried: the server took the call
    (call,) = job.report.call_reports
    assert call.status == "error" and call.error == message and call.http_status == 200
    assert job.report.status == "error"
    (ended,) = [e for e in events if isinstance(e, CallEnded)]
    assert ended.status == "error"
    (line,) = read_journal(journal)
    assert line.call_reports[0].status == "error" and line.call_reports[0].error == message
    count = "agentrt_call_duration_seconds_count"
    labels = {"job_name": "j", "endpoint_url": URL}
    assert registry.get_sample_value(count, {**labels, "status": "error"}) == 1
    assert not registry.get_sample_value(count, {**labels, "status": "ok"})


@pytest.mark.anyio
async def test_through_rt_openai_the_caller_sees_the_endpoint_error() -> None:
    fake = FakeEngine(script=[reply(TRUNCATED)])
    async with Runtime([URL], transport=fake.transport()) as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session():
            with pytest.raises((EndpointError, openai.APIConnectionError)) as info:
                await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
            err = info.value
            cause = err if isinstance(err, EndpointError) else err.__cause__
            assert isinstance(cause, EndpointError)
            assert not isinstance(err, json.JSONDecodeError)
    assert job.report.call_reports[0].status == "error"


@pytest.mark.anyio
async def test_a_good_reply_is_read_once_for_usage() -> None:
    fake = FakeEngine(script=[reply(b"  " + json.dumps(GOOD).encode() + b"\n")])
    async with Runtime([URL], transport=fake.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            out = await s.chat(model="m", messages=MSG)
    assert out.choices[0].message.content == "hi"
    (call,) = job.report.call_reports
    assert call.status == "ok" and call.prompt_tokens == 3 and call.completion_tokens == 1


@pytest.mark.anyio
async def test_other_apis_need_valid_json_but_no_choices() -> None:
    emb = {"object": "list", "data": [{"embedding": [0.1], "index": 0}], "model": "m"}
    fake = FakeEngine(script=[reply(json.dumps(emb).encode()), reply(b'{"data": [1')])
    async with Runtime([URL], transport=fake.transport()) as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session():
            await client.embeddings.create(model="m", input="x")
            with pytest.raises((EndpointError, openai.APIConnectionError)):
                await client.embeddings.create(model="m", input="x")
    assert [c.status for c in job.report.call_reports] == ["ok", "error"]


# -- streams --------------------------------------------------------------------------------


def sse(*events: bytes) -> Callable[[httpx.Request], httpx.Response]:
    async def body() -> AsyncIterator[bytes]:
        for e in events:
            yield e

    return lambda _r: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=body()
    )


def chunk(text: str) -> bytes:
    obj = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return sse_event(obj)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (b'data: {"id": "c", "choices": [\n\n', "not valid JSON"),
        (b"data: {not json}\n\n", "not valid JSON"),
        (b"data: 42\n\n", "JSON int"),
    ],
)
async def test_a_malformed_stream_event_is_an_endpoint_error(bad: bytes, problem: str) -> None:
    fake = FakeEngine(script=[sse(chunk("a"), bad, chunk("b"), b"data: [DONE]\n\n")])
    seen: list[str] = []
    async with Runtime([URL], api_key=KEY, transport=fake.transport()) as rt:
        with pytest.raises(EndpointError) as info:
            async with rt.job("j") as job, job.session() as s:
                async for c in await s.chat(model="m", messages=MSG, stream=True):
                    seen.extend(ch.delta.content or "" for ch in c.choices)
    message = str(info.value)
    assert "malformed stream event" in message and problem in message and URL in message
    assert KEY not in message
    assert seen == ["a"]  # what came before the bad event reached the caller
    (call,) = job.report.call_reports
    assert call.status == "error" and call.error == message
    assert "closed before it ended" not in (call.error or "")


@pytest.mark.anyio
async def test_an_event_split_over_data_lines_is_read_whole() -> None:
    obj = json.loads(chunk("a")[6:])
    text = json.dumps(obj, indent=1).encode()
    split = b"".join(b"data: " + line + b"\n" for line in text.split(b"\n")) + b"\n"
    fake = FakeEngine(script=[sse(split, b"data: [DONE]\n\n")])
    async with Runtime([URL], transport=fake.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            got = [c async for c in await s.chat(model="m", messages=MSG, stream=True)]
    assert got[0].choices[0].delta.content == "a"
    assert job.report.call_reports[0].status == "ok"


@pytest.mark.anyio
async def test_a_json_reply_to_a_streamed_call_is_an_endpoint_error() -> None:
    fake = FakeEngine(script=[reply(b'{"error": {"message": "no streams here"}}')])
    async with Runtime([URL], transport=fake.transport()) as rt:
        with pytest.raises(EndpointError, match="not an event stream"):
            async with rt.job("j") as job, job.session() as s:
                async for _ in await s.chat(model="m", messages=MSG, stream=True):
                    pass
    assert job.report.call_reports[0].status == "error"


def test_sync_runtime_raises_the_endpoint_error_too() -> None:
    fake = FakeEngine(script=[reply(b"{}"), sse(chunk("a"), b"data: {oops\n\n")])
    with SyncRuntime([URL], transport=fake.transport()) as rt:
        with pytest.raises(EndpointError, match="not a completion"):
            with rt.job("a") as job, job.session() as s:
                s.chat(model="m", messages=MSG)  # type: ignore[arg-type]
        with pytest.raises(EndpointError, match="malformed stream event"):
            with rt.job("b") as job2, job2.session() as s:
                for _ in s.chat(model="m", messages=MSG, stream=True):  # type: ignore[arg-type]
                    pass
    assert job.report.call_reports[0].status == "error"
    assert job2.report.call_reports[0].status == "error"


@pytest.mark.anyio
async def test_a_malformed_last_event_without_its_blank_line_is_caught() -> None:
    fake = FakeEngine(script=[sse(chunk("a"), b'data: {"id": "c", "choi')])
    async with Runtime([URL], transport=fake.transport()) as rt:
        with pytest.raises(EndpointError, match="malformed stream event"):
            async with rt.job("j") as job, job.session() as s:
                async for _ in await s.chat(model="m", messages=MSG, stream=True):
                    pass
    assert job.report.call_reports[0].status == "error"
