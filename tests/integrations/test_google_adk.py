"""The Google ADK adapter: real agents with real tools, run by ADK's runner through
LiteLLM against the embedded engine in its scripted-reply mode; what the server sees is
recorded by wrapping the cluster's transport."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
adk = pytest.importorskip("google.adk")
# ADK imports LiteLLM at the first model call: here, at collection, where its import (tens
# of seconds on a busy machine) counts against no test's timeout.
pytest.importorskip("litellm")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.apps import App  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.adk.tools.agent_tool import AgentTool  # noqa: E402
from google.genai import types  # noqa: E402

from agentrt import Runtime  # noqa: E402
from agentrt.integrations import google_adk  # noqa: E402
from tests.integrations._sessions import (  # noqa: E402
    SessionRecorder,
    check_lead_and_helper,
    lead_and_helper_question,
    scripted_runtime,
)

pytestmark = [
    pytest.mark.anyio,
    # pydantic (2.14) warns of a TypedDict of LiteLLM's with ReadOnly items as ADK builds
    # a schema from it: nothing of agentrt's.
    pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # ADK runs on asyncio


@pytest.fixture
async def env() -> AsyncIterator[tuple[Runtime, SessionRecorder]]:
    async with scripted_runtime() as env:
        yield env


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def explode() -> str:
    """Fail."""
    raise RuntimeError("tool broke")


async def run(rt: Runtime, agent: LlmAgent, text: str) -> str:
    runner = InMemoryRunner(
        app=App(name="app", root_agent=agent, plugins=[google_adk.instrument(rt)])
    )
    session = await runner.session_service.create_session(app_name="app", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=text)])
    answer = ""
    async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    return answer


# AgentTool hands its runner the parent's plugins through Runner(plugins=...), which ADK
# itself deprecates.
@pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated:DeprecationWarning")
async def test_runs_agents_and_tools_map_to_jobs_sessions_and_waits(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, server = env
    model = google_adk.model(rt, "m")
    helper = LlmAgent(name="helper", model=model, instruction="Add.", tools=[add])
    lead = LlmAgent(name="lead", model=model, instruction="Go.", tools=[add, AgentTool(helper)])
    assert await run(rt, lead, lead_and_helper_question("helper", "request")) == "three"
    (report,) = rt.reports()
    check_lead_and_helper(report, server.sessions, "helper")


async def test_a_failing_tool_is_an_error_wait_and_ends_the_run_with_an_error(
    env: tuple[Runtime, SessionRecorder],
) -> None:
    rt, _ = env
    lead = LlmAgent(name="lead", model=google_adk.model(rt, "m"), tools=[explode])
    with pytest.raises(RuntimeError, match="tool broke"):
        await run(rt, lead, "Try.\nCALL explode {}\nANSWER it broke")
    (report,) = rt.reports()
    assert report.status == "error" and "RuntimeError" in (report.error or "")
    assert [(t.name, t.status) for t in report.tool_reports] == [("explode", "error")]
