"""The framework adapters against a real vLLM CPU replica (no mocks).

The replica serves a tiny random-weight model, which cannot choose a tool by itself; the
agents force the choice (``tool_choice``), which vLLM honours with guided decoding, so a
real agent calls a real tool and agentrt sees the whole job.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

import agentrt
from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

TOOL_SLEEP_S = 0.2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the frameworks run on asyncio


async def test_openai_agents_sdk_agent_calls_a_tool_on_vllm(vllm_engine: ReplicaServer) -> None:
    agents = pytest.importorskip("agents")
    from agentrt.integrations import openai_agents

    calls: list[str] = []

    @agents.function_tool
    def ping() -> str:
        """Check that the service answers."""
        time.sleep(TOOL_SLEEP_S)
        calls.append("ping")
        return "pong"

    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        processor = openai_agents.instrument(rt, exclusive=True)
        try:
            agent = agents.Agent(
                name="pinger",
                instructions="Call ping.",
                model=openai_agents.model(rt, vllm_engine.model),
                tools=[ping],
                model_settings=agents.ModelSettings(
                    tool_choice="required", max_tokens=512, temperature=0.0
                ),
                tool_use_behavior="stop_on_first_tool",
            )
            result = await agents.Runner.run(agent, "Is the service up?")
        finally:
            processor.shutdown()
        reports = rt.reports()
    assert result.final_output == "pong" and calls == ["ping"]
    assert len(reports) == 1
    job = reports[0]
    assert job.status == "ok" and job.calls == 1 and job.tool_waits == 1
    assert [t.name for t in job.tool_reports] == ["ping"]
    assert job.tool_s >= TOOL_SLEEP_S * 0.9
    call = job.call_reports[0]
    assert call.status == "ok" and call.prompt_tokens and call.endpoint == vllm_engine.base_url


async def test_langchain_model_and_tool_on_vllm(vllm_engine: ReplicaServer) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_core.runnables import RunnableConfig, RunnableLambda
    from langchain_core.tools import tool

    from agentrt.integrations import langchain

    @tool
    async def ping() -> str:
        """Check that the service answers."""
        await anyio.sleep(TOOL_SLEEP_S)
        return "pong"

    async def run_tool(message: Any, config: RunnableConfig) -> str:
        # The random-weight model's text is noise; the chain calls the tool regardless
        # (LangChain's named tool_choice is not constrained by this vLLM build).
        assert message.content is not None
        return str(await ping.ainvoke({}, config=config))

    async with agentrt.Runtime([vllm_engine.base_url], dialect="vllm") as rt:
        llm = langchain.model(rt, vllm_engine.model, max_tokens=32)
        chain = (llm | RunnableLambda(run_tool)).with_config(run_name="pinger")
        out = await chain.ainvoke(
            "Is the service up?", config={"callbacks": [langchain.instrument(rt)]}
        )
        reports = rt.reports()
    assert out == "pong"
    assert len(reports) == 1
    job = reports[0]
    assert job.name == "pinger" and job.status == "ok"
    assert job.calls == 1 and [t.name for t in job.tool_reports] == ["ping"]
    assert job.tool_s >= TOOL_SLEEP_S * 0.9
