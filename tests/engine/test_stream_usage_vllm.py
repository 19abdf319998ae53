"""Streamed calls to a real vLLM CPU replica are counted in the job's report whether or
not the caller asked for usage, and the caller reads the stream vLLM sends a client that
did not ask (compared with openai's own client on the same replica)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest

import agentrt
from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shape(chunks: list[Any]) -> tuple[Any, ...]:
    """What a caller reads in chunks, apart from ids, times and how vLLM happened to batch
    the tokens into chunks: the text, the finish reasons, the fields the chunks set (the
    last one's apart), the last one's fingerprint, and whether any has usage or no
    choices."""
    text, finish = "", []
    for c in chunks:
        for choice in c.choices:
            text += (choice.delta.content if hasattr(choice, "delta") else choice.text) or ""
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    return (
        text,
        finish,
        frozenset().union(*(c.model_fields_set for c in chunks[:-1])),
        frozenset(chunks[-1].model_fields_set),
        chunks[-1].system_fingerprint,
        all(c.choices for c in chunks),
        any(c.usage is not None for c in chunks),
    )


async def test_vllm_streams_are_counted_and_unchanged(vllm_engine: ReplicaServer) -> None:
    model = vllm_engine.model
    # Long enough to fill KV blocks (the prefix cache keeps whole blocks only).
    prompt = uuid.uuid4().hex + " count the files in the repository" * 60
    messages: list[Any] = [{"role": "user", "content": prompt}]
    greedy: dict[str, Any] = {"model": model, "max_tokens": 6, "temperature": 0.0}
    async with httpx.AsyncClient(timeout=120) as http:
        plain = openai.AsyncOpenAI(base_url=vllm_engine.base_url, api_key="x", http_client=http)  # type: ignore[arg-type,unused-ignore]
        reply = await plain.chat.completions.create(messages=messages, **greedy)
        alone = [
            c
            async for c in await plain.chat.completions.create(
                messages=messages, stream=True, **greedy
            )
        ]
        alone_text = [
            c async for c in await plain.completions.create(prompt=prompt, stream=True, **greedy)
        ]
    assert reply.usage is not None
    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        client = rt.openai()
        async with rt.job("vllm-streams") as job, job.session("s") as s:
            unasked = [c async for c in await s.chat(messages=messages, stream=True, **greedy)]
            via_client = [
                c
                async for c in await client.chat.completions.create(
                    messages=messages, stream=True, **greedy
                )
            ]
            text = [c async for c in await s.complete(prompt=prompt, stream=True, **greedy)]
            asked = [
                c
                async for c in await s.chat(
                    messages=messages,
                    stream=True,
                    stream_options={"include_usage": True},
                    **greedy,
                )
            ]
    calls = job.report.call_reports
    assert len(calls) == 4 and all(c.stream and c.status == "ok" for c in calls)
    for call in calls:
        assert call.prompt_tokens is not None and call.prompt_tokens > 0
        assert call.completion_tokens == 6 and call.cached_tokens is not None
    for call in (calls[0], calls[1], calls[3]):
        assert call.prompt_tokens == reply.usage.prompt_tokens
    assert calls[1].cached_tokens  # the same prompt again: its prefix was cached
    usage = asked[-1].usage
    assert asked[-1].choices == [] and usage is not None
    assert (calls[3].prompt_tokens, calls[3].completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert job.report.prompt_tokens == sum(c.prompt_tokens or 0 for c in calls)
    assert job.report.completion_tokens == 24
    assert shape(unasked) == shape(alone)
    assert shape(via_client) == shape(alone)
    assert shape(text) == shape(alone_text)
