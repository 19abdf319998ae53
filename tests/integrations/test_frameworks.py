"""The agent frameworks of the adapters built on ``Agents`` and of the recipes
(PydanticAI, Agno, Strands, AutoGen, AG2, Google ADK, smolagents, CrewAI), and the toy
framework of docs/integrations.md's "Write an adapter": each example runs as written
against ``agentrt sim serve --replies agent`` on loopback, and its job report shows the
agents' sessions (the researcher's under the assistant's) and each tool wait in its
agent's session.

Each test runs where its framework is installed (scripts/test_frameworks.sh makes a
virtual environment per framework, pinned and newest)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import anyio
import pytest

from agentrt.sim import PRESETS, serve_async

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]

EXAMPLES = {
    "pydantic_ai_agent": "pydantic_ai",
    "agno_agent": "agno",
    "strands_agent": "strands",
    "autogen_agent": "autogen_agentchat",
    "ag2_agent": "ag2",
    "google_adk_agent": "google.adk",
    "smolagents_agent": "smolagents",
    "crewai_agent": "crewai",
    "custom_adapter_agent": "openai",  # its framework is in the example
}
"""Each example and the module its framework installs."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn, and most frameworks, run on asyncio


# A fresh interpreter imports its framework (LiteLLM, CrewAI: tens of seconds on a busy
# machine) before the run.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
async def test_example_against_sim_serve(example: str, tmp_path: Path) -> None:
    if not _installed(EXAMPLES[example]):
        pytest.skip(f"{EXAMPLES[example]} is not installed")
    pytest.importorskip("uvicorn")
    (tmp_path / "README.md").write_text("one two three four\n", encoding="utf-8")
    config = PRESETS["h100-8b"].replace(replies="agent")
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, config)
        with anyio.fail_after(540):
            run = await anyio.run_process(
                [sys.executable, str(ROOT / "examples" / f"{example}.py"), "--base-url", urls.url],
                cwd=tmp_path,
                check=False,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
        tg.cancel_scope.cancel()
    out = run.stdout.decode()
    assert run.returncode == 0, out + run.stderr.decode()[-4000:]
    assert "answer: 391; the researcher counted the words." in out
    assert "status=ok" in out and "calls=5 sessions=2" in out, out
    lines = out.splitlines()
    assert "  session assistant" in lines
    assert "  session researcher (parent: assistant)" in lines
    tools = sorted(line.split(":")[0].strip() for line in lines if line.startswith("  tool "))
    assert tools == [
        "tool ask_researcher in assistant",
        "tool calculator in assistant",
        "tool word_count in researcher",
    ], out
    assert all(line.endswith("(ok)") for line in lines if line.startswith("  tool "))
    turns = [line.split(":")[0].strip() for line in lines if " turn " in line]
    assert turns == [
        "assistant turn 0",
        "assistant turn 1",
        "researcher turn 0",
        "researcher turn 1",
        "assistant turn 2",
    ], out
