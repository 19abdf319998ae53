"""Streamed calls against the embedded engine are counted in the job's report, whether or
not the caller asked for usage, and the caller's chunks are those the engine sends a
client that did not ask: through ``session.chat``, ``session.complete``, ``rt.openai()``
(in-process, on asyncio and trio) and over HTTP on loopback."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import agentrt
from agentrt.sim import Cluster, count_tokens, prompt_for_blocks, serve_async
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio

PROMPT = prompt_for_blocks(range(6), 64)
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]


def shape(chunks: list[Any]) -> list[tuple[bool, set[str], str]]:
    """What a caller can tell of chunks apart from ids and times: whether each has choices,
    the fields its JSON set, and its text."""
    out = []
    for c in chunks:
        text = ""
        if c.choices:
            part = c.choices[0]
            text = (
                getattr(part, "text", None)
                or (part.delta.content if hasattr(part, "delta") else "")
                or ""
            )
        out.append((bool(c.choices), set(c.model_fields_set), text))
    return out


async def test_streams_are_counted_and_unchanged() -> None:
    async with Cluster(1, small_config()) as cluster:
        url = cluster.base_urls[0]
        async with httpx.AsyncClient(transport=cluster.transport()) as http:
            plain = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http)  # type: ignore[arg-type,unused-ignore]
            # What the engine sends a client that does not ask for usage.
            alone = [
                c
                async for c in await plain.chat.completions.create(
                    model="m", messages=MSG, max_tokens=5, stream=True
                )
            ]
            alone_text = [
                c
                async for c in await plain.completions.create(
                    model="m", prompt="Say hello", max_tokens=3, stream=True
                )
            ]
        async with agentrt.Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            client = rt.openai()
            async with rt.job("streams") as job, job.session("s") as s:
                reply = await s.chat(model="m", messages=MSG, max_tokens=5)
                asked = [
                    c
                    async for c in await s.chat(
                        model="m",
                        messages=MSG,
                        max_tokens=5,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                ]
                unasked = [
                    c
                    async for c in await s.chat(model="m", messages=MSG, max_tokens=5, stream=True)
                ]
                via_client = [
                    c
                    async for c in await client.chat.completions.create(
                        model="m", messages=MSG, max_tokens=5, stream=True
                    )
                ]
                text = [
                    c
                    async for c in await s.complete(
                        model="m", prompt="Say hello", max_tokens=3, stream=True
                    )
                ]
    report = job.report
    calls = report.call_reports
    assert [c.stream for c in calls] == [False, True, True, True, True]
    # The caller who asked got the usage chunk, and the report says the same.
    usage = asked[-1].usage
    assert asked[-1].choices == [] and usage is not None
    assert usage.prompt_tokens_details is not None
    assert (calls[1].prompt_tokens, calls[1].completion_tokens, calls[1].cached_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens,
    )
    # Unasked streams are counted as the non-streamed call of the same prompt is.
    assert reply.usage is not None and reply.usage.prompt_tokens == count_tokens(PROMPT)
    for call in calls[2:4]:
        assert call.prompt_tokens == reply.usage.prompt_tokens
        assert call.completion_tokens == 5
        assert call.cached_tokens is not None and call.cached_tokens >= 6 * 64 - 16
    assert calls[4].prompt_tokens == count_tokens("Say hello")
    assert calls[4].completion_tokens == 3 and calls[4].cached_tokens is not None
    assert report.prompt_tokens == sum(c.prompt_tokens or 0 for c in calls)
    assert report.completion_tokens == 5 * 4 + 3
    assert report.cached_tokens == sum(c.cached_tokens or 0 for c in calls)
    # ...and their callers read the chunks the engine sends a client that did not ask.
    assert shape(unasked) == shape(via_client) == shape(alone)
    assert shape(text) == shape(alone_text)
    assert all(c.choices and "usage" not in c.model_fields_set for c in unasked + text)
    assert shape(asked[:-1]) != shape(alone)  # asking is visible: "usage": null is set


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn serves on asyncio
async def test_a_stream_over_loopback_is_counted() -> None:
    async with anyio.create_task_group() as tg:
        urls = await tg.start(
            lambda task_status: serve_async(
                1, port=0, preset=small_config(), task_status=task_status
            )
        )
        async with agentrt.Runtime(list(urls)) as rt:
            client = rt.openai()
            async with rt.job("loopback") as job, job.session("s"):
                stream = await client.chat.completions.create(
                    model="m", messages=MSG, max_tokens=4, stream=True
                )
                chunks = [c async for c in stream]
        tg.cancel_scope.cancel()
    assert chunks and all(c.choices for c in chunks)
    (call,) = job.report.call_reports
    assert call.stream and call.status == "ok"
    assert call.prompt_tokens == count_tokens(PROMPT) and call.completion_tokens == 4
    assert job.report.prompt_tokens == call.prompt_tokens
    assert job.report.completion_tokens == 4
