"""The framework adapters' models refuse calls once their runtime's block has ended, with
the error ``rt.job`` raises, before anything reaches the (embedded) engine."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt import Runtime, RuntimeClosedError
from agentrt.sim import Cluster
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the frameworks run on asyncio


def received(cluster: Cluster) -> int:
    return sum(s.requests_received for s in cluster.stats())


async def test_langchain_model() -> None:
    pytest.importorskip("langchain_openai")
    from agentrt.integrations import langchain as lc

    async with Cluster(1, small_config()) as cluster:
        async with Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt:
            llm = lc.model(rt, "m", max_tokens=2)
            handler = lc.instrument(rt)
            await llm.ainvoke("hello", config={"callbacks": [handler]})
        with pytest.raises(RuntimeClosedError, match="this Runtime is closed"):
            await llm.ainvoke("hello", config={"callbacks": [handler]})
        with pytest.raises(RuntimeClosedError):
            async for _ in llm.astream("hello"):
                pass
        assert received(cluster) == 1
    assert [r.status for r in rt.reports()] == ["ok"]


async def test_openai_agents_model() -> None:
    pytest.importorskip("agents")
    from agents import ModelSettings, ModelTracing

    from agentrt.integrations import openai_agents

    async def ask(model: Any) -> Any:
        return await model.get_response(
            system_instructions=None,
            input="hello",
            model_settings=ModelSettings(max_tokens=2),
            tools=[],
            output_schema=None,
            handoffs=[],
            tracing=ModelTracing.DISABLED,
        )

    async with Cluster(1, small_config()) as cluster:
        async with Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt:
            model = openai_agents.model(rt, "m")
            assert (await ask(model)).output
        with pytest.raises(RuntimeClosedError, match="this Runtime is closed"):
            await ask(model)
        assert received(cluster) == 1


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")
async def test_llamaindex_model() -> None:
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage

    from agentrt.integrations import llamaindex

    async with Cluster(1, small_config()) as cluster:
        async with Runtime(list(cluster.base_urls), transport=cluster.transport()) as rt:
            llm = llamaindex.model(rt, "m", max_tokens=2)
            await llm.achat([ChatMessage(role="user", content="hello")])
        with pytest.raises(RuntimeClosedError, match="this Runtime is closed"):
            await llm.achat([ChatMessage(role="user", content="hello")])
        assert received(cluster) == 1
