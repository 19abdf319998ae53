"""The examples run: the ReAct agent against a scripted OpenAI-compatible fake."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

import agentrt
from tests._fake import FakeEngine

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def reply(text: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 8, "total_tokens": 58},
        },
    )


async def test_react_agent_uses_both_tools_and_reports() -> None:
    react = load("react_agent")
    fake = FakeEngine()
    fake.script = [
        lambda r: reply("Thought: multiply.\nAction: calculator: 17 * 23"),
        lambda r: reply(f"Action: word_count: {ROOT / 'pyproject.toml'}"),
        lambda r: reply("Final: 391"),
    ]
    async with agentrt.Runtime(["http://x.test/v1"], transport=fake.transport()) as rt:
        report = await react.run_agent(rt, "m", "17*23?", max_steps=5)
    assert report.status == "ok" and report.calls == 3 and report.tool_waits == 2
    assert [t.name for t in report.tool_reports] == ["calculator", "word_count"]
    # The observation of the first tool went back to the model.
    assert fake.seen[1].body["messages"][-1]["content"] == "Observation: 391"
    assert report.jct_s >= report.critical_llm_s


def test_calculator_is_arithmetic_only() -> None:
    react = load("react_agent")
    assert react.calculator("2 ** 10 - 24") == "1000"
    assert react.calculator("__import__('os')").startswith("error")
