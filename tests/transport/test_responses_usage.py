"""The Responses API's calls are counted (issue 25, item 12): ``client.responses.create``
through agentrt, streamed or not, on asyncio, trio and ``SyncRuntime``, reports its
``usage.input_tokens``, ``output_tokens`` and ``input_tokens_details.cached_tokens`` (in
a stream, the ``response.completed`` event's ``response.usage``), and the job's totals
add them up. Wire-format tests: an ``httpx.MockTransport`` answering as OpenAI's
``/v1/responses`` does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import agentrt

URL = "http://engine.test/v1"
USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 96},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 127,
}


def response(status: str = "completed", usage: Any = USAGE) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": "m",
        "output": []
        if status != "completed"
        else [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def events() -> bytes:
    """A streamed response as OpenAI's server sends it: typed events, no ``[DONE]``; the
    usage only in ``response.completed`` (``null`` before)."""
    out = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": response("in_progress", None),
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "Hello",
            "logprobs": [],
        },
        {"type": "response.completed", "sequence_number": 2, "response": response()},
    ]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in out)


def handler(request: httpx.Request) -> httpx.Response:
    assert request.url.path == "/v1/responses"
    if json.loads(request.content).get("stream"):

        async def body() -> AsyncIterator[bytes]:  # streamed, as a server's (not pre-read)
            for piece in events().split(b"\n\n"):
                yield piece + b"\n\n" if piece else b""

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})
    return httpx.Response(200, json=response())


def runtime(**kw: Any) -> dict[str, Any]:
    return {"transport": httpx.MockTransport(handler), "otel": False} | kw


def assert_counted(report: agentrt.JobReport, calls: int) -> None:
    assert [
        (c.prompt_tokens, c.completion_tokens, c.cached_tokens) for c in report.call_reports
    ] == [(120, 7, 96)] * calls
    assert (report.prompt_tokens, report.completion_tokens, report.cached_tokens) == (
        120 * calls,
        7 * calls,
        96 * calls,
    )


@pytest.mark.anyio
async def test_responses_calls_are_counted_streamed_or_not() -> None:
    async with agentrt.Runtime([URL], **runtime()) as rt:
        client = rt.openai()
        async with rt.job("responses") as job, job.session("s"):
            reply = await client.responses.create(model="m", input="hi")
            assert reply.output_text == "Hello"
            stream = await client.responses.create(model="m", input="hi", stream=True)
            kinds = [event.type async for event in stream]
    assert kinds == ["response.created", "response.output_text.delta", "response.completed"]
    assert [c.stream for c in job.report.call_reports] == [False, True]
    assert_counted(job.report, 2)


@pytest.mark.anyio
async def test_a_responses_call_outside_a_job_is_counted_in_its_implicit_job() -> None:
    async with agentrt.Runtime([URL], **runtime(keep_reports=10)) as rt:
        await rt.openai().responses.create(model="m", input="hi")
        (report,) = rt.reports()
    assert_counted(report, 1)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_runtimes_responses_calls_are_counted(backend: str) -> None:
    with agentrt.SyncRuntime([URL], **runtime(backend=backend)) as rt:
        client = rt.openai()
        with rt.job("responses") as job, job.session("s"):
            client.responses.create(model="m", input="hi")
            with client.responses.create(model="m", input="hi", stream=True) as stream:
                for _ in stream:
                    pass
    assert_counted(job.report, 2)
