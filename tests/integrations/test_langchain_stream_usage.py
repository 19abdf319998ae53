"""LangChain streaming through agentrt is counted in the job's report, and LangChain sees
the chunks it sees without agentrt (ChatOpenAI asks for stream usage only when it talks
to OpenAI itself: not with a ``base_url`` or its own HTTP client)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("langchain_openai")

from langchain_openai import ChatOpenAI

import agentrt
from agentrt.integrations import langchain as lc
from agentrt.sim import Cluster, count_tokens, output_text
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio
PROMPT = "Why does test_parse fail? " * 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LangChain runs on asyncio


def seen(chunks: list[Any]) -> list[tuple[Any, Any, Any]]:
    return [(c.content, c.usage_metadata, c.response_metadata.get("finish_reason")) for c in chunks]


async def test_langchain_streams_are_counted_and_unchanged() -> None:
    async with Cluster(1, small_config()) as cluster:
        url = cluster.base_urls[0]
        async with httpx.AsyncClient(transport=cluster.transport()) as http:
            plain = ChatOpenAI(
                model="m", base_url=url, api_key="x", max_tokens=6, http_async_client=http
            )
            alone = [c async for c in plain.astream(PROMPT)]
        async with agentrt.Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            llm = lc.model(rt, "m", max_tokens=6, streaming=True)
            async with rt.job("lc") as job, job.session("s"):
                through = [c async for c in llm.astream(PROMPT)]
                reply = await llm.ainvoke(PROMPT)  # streaming=True: a streamed call too
    assert "".join(str(c.content) for c in through) == output_text(6)
    assert seen(through) == seen(alone)
    assert all(c.usage_metadata is None for c in through)
    assert reply.content == output_text(6)
    calls = job.report.call_reports
    assert len(calls) == 2 and all(c.stream for c in calls)
    for call in calls:
        assert call.prompt_tokens is not None and call.prompt_tokens >= count_tokens(PROMPT)
        assert call.completion_tokens == 6 and call.cached_tokens is not None
    assert calls[1].cached_tokens  # the second call found the first one's prefix
    assert job.report.prompt_tokens == sum(c.prompt_tokens or 0 for c in calls)
    assert job.report.completion_tokens == 12
