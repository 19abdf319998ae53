"""The embedded engine's scripted-reply mode: directives in the last user message become
tool calls and a final answer, deterministically, streamed or not."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from agentrt.sim import PRESETS, Cluster
from agentrt.sim._replies import agent_reply

pytestmark = pytest.mark.anyio

TOOLS: Any = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "add", "mul")
]
TASK = (
    "Weather in Paris, then some maths.\n"
    'CALL get_weather {"city": "Paris"}\n'
    'CALL add {"a": 1, "b": 2} && CALL mul {"a": 2, "b": 3}\n'
    "ANSWER sunny; 3 and 6"
)


def test_directives_are_played_in_order() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    first = agent_reply({"messages": messages, "tools": TOOLS})
    assert first is not None and first.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    messages += [first.message(), {"role": "tool", "tool_call_id": "x", "content": "sunny"}]
    second = agent_reply({"messages": messages, "tools": TOOLS})
    assert second is not None and [c.name for c in second.tool_calls] == ["add", "mul"]
    assert len({c.id for c in (*first.tool_calls, *second.tool_calls)}) == 3
    messages += [second.message(), {"role": "tool", "tool_call_id": "y", "content": "3"}]
    final = agent_reply({"messages": messages, "tools": TOOLS})
    assert final is not None and final.finish_reason == "stop"
    assert final.content == "sunny; 3 and 6" and not final.tool_calls
    # A new user message starts over from its own directives.
    messages.append({"role": "user", "content": "thanks"})
    assert agent_reply({"messages": messages, "tools": TOOLS}) is None


def test_a_tool_not_offered_is_not_called() -> None:
    reply = agent_reply({"messages": [{"role": "user", "content": "CALL rm {}"}], "tools": TOOLS})
    assert reply is not None and not reply.tool_calls and "rm" in reply.content


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_client_gets_tool_calls(stream: bool) -> None:
    cfg = PRESETS["h100-8b"].replace(replies="agent")
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as h:
        client: Any = openai.AsyncOpenAI(
            base_url=cluster.base_urls[0],
            api_key="x",
            http_client=h,  # type: ignore[arg-type,unused-ignore]
            max_retries=0,
        )
        messages: list[Any] = [{"role": "user", "content": TASK}]
        names: list[list[str]] = []
        for _ in range(3):
            if stream:
                chunks = await client.chat.completions.create(
                    model="m",
                    messages=messages,
                    tools=TOOLS,
                    stream=True,
                )
                calls: dict[int, dict[str, Any]] = {}
                text, finish = "", None
                async for chunk in chunks:
                    choice = chunk.choices[0]
                    text += choice.delta.content or ""
                    for d in choice.delta.tool_calls or []:
                        calls.setdefault(d.index, {"id": d.id, "name": "", "args": ""})
                        if d.function is not None:
                            calls[d.index]["name"] += d.function.name or ""
                            calls[d.index]["args"] += d.function.arguments or ""
                    finish = choice.finish_reason or finish
                tool_calls = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["args"]},
                    }
                    for _, c in sorted(calls.items())
                ]
            else:
                reply = await client.chat.completions.create(
                    model="m",
                    messages=messages,
                    tools=TOOLS,
                )
                msg = reply.choices[0].message
                text, finish = msg.content or "", reply.choices[0].finish_reason
                tool_calls = [c.model_dump() for c in msg.tool_calls or []]
            if not tool_calls:
                assert finish == "stop" and text == "sunny; 3 and 6"
                break
            assert finish == "tool_calls"
            names.append([c["function"]["name"] for c in tool_calls])
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            for c in tool_calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})
        assert names == [["get_weather"], ["add", "mul"]]


async def test_a_request_without_directives_gets_a_hint() -> None:
    """With ``replies="agent"``, a prompt without CALL/ANSWER lines still gets filler (of
    the requested length), whose first line, and a response header, say why."""
    from agentrt.sim import output_text
    from agentrt.sim._app import NO_DIRECTIVES_HINT

    async with Cluster(1, PRESETS["h100-8b"].replace(replies="agent")) as cluster:
        http = httpx.AsyncClient(transport=cluster.transport())
        url = f"{cluster.base_urls[0]}/chat/completions"
        plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
        reply = await http.post(url, json=plain)
        content = reply.json()["choices"][0]["message"]["content"]
        assert content.startswith(NO_DIRECTIVES_HINT + "\n")
        assert len(content) == len(output_text(40))  # the same length: the same timing
        assert "docs/sim.md" in reply.headers["x-agentrt-sim-hint"]
        async with http.stream("POST", url, json={**plain, "stream": True}) as streamed:
            assert "x-agentrt-sim-hint" in streamed.headers
            events = [line async for line in streamed.aiter_lines() if line.startswith("data: {")]
        text = "".join(
            json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events
        )
        assert text == content
        scripted = {**plain, "messages": [{"role": "user", "content": "ANSWER 42"}]}
        answered = await http.post(url, json=scripted)
        assert answered.json()["choices"][0]["message"]["content"] == "42"
        assert "x-agentrt-sim-hint" not in answered.headers
    async with Cluster(1, PRESETS["h100-8b"]) as cluster:  # filler replies: no hint
        http = httpx.AsyncClient(transport=cluster.transport())
        reply = await http.post(f"{cluster.base_urls[0]}/chat/completions", json=plain)
        assert reply.json()["choices"][0]["message"]["content"] == output_text(40)
        assert "x-agentrt-sim-hint" not in reply.headers
