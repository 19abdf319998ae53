"""Scripted replies: an embedded engine that plays an agent's model, deterministically.

With ``EngineConfig(replies="agent")`` a chat request is answered by following
directives written in the conversation's last user message, so that real agent
frameworks (LangGraph, LlamaIndex, the OpenAI Agents SDK) call real tools against the
embedded engine, in a known order:

    CALL get_weather {"city": "Paris"}
    CALL add {"a": 1, "b": 2} && CALL mul {"a": 2, "b": 3}
    ANSWER It is sunny in Paris.

Each ``CALL`` line is one model turn: the reply asks for those tool calls (several on one
line, joined by ``&&``, are parallel calls in one reply), ``finish_reason="tool_calls"``.
Which line is due is counted from the conversation: the assistant messages with tool
calls after the last user message are the turns already taken. When every line has
been played, the reply is the ``ANSWER`` text (or ``done``), ``finish_reason="stop"``.
A tool not offered in the request's ``tools`` is not called: the reply says so, in text.
Requests without directives get the engine's usual filler text, its first line a hint
that says so (and the header ``x-agentrt-sim-hint``: ``agentrt.sim._app``).

The engine still models the reply's timing: its output length is the scripted reply's
size (about 4 characters a token), at most ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["ScriptedReply", "agent_reply"]

_CALL: Final = re.compile(r"^\s*CALL\s+([A-Za-z0-9_.\-]{1,64})\s*(\{.*\})?\s*$")
_ANSWER: Final = re.compile(r"^\s*ANSWER\s+(.*)$")


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def num_tokens(self) -> int:
        """The reply's size in tokens (about 4 characters each), at least 1."""
        size = len(self.content) + sum(len(c.name) + len(c.arguments) for c in self.tool_calls)
        return max(1, (size + 3) // 4)

    def message(self) -> dict[str, Any]:
        """The assistant message of a non-streamed reply."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        msg["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in self.tool_calls
        ]
        return msg


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _tool_names(tools: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(tools, list):
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
    return names


def _directives(content: Any) -> tuple[list[list[tuple[str, str]]], str | None]:
    """The rounds of ``CALL`` lines of a message, and its ``ANSWER`` text (None: none)."""
    rounds: list[list[tuple[str, str]]] = []
    answer = None
    for line in _text(content).splitlines():
        if found := _ANSWER.match(line):
            answer = found.group(1).strip() or "done"
            continue
        calls = []
        for part in line.split("&&"):
            if found := _CALL.match(part):
                calls.append((found.group(1), found.group(2) or "{}"))
        if calls:
            rounds.append(calls)
    return rounds, answer


def _is_tool_turn(m: Any) -> bool:
    """An assistant message that asked for tools: with ``tool_calls``, or written out as
    text the way smolagents sends its history (``Calling tools:`` ...)."""
    if not isinstance(m, dict) or m.get("role") != "assistant":
        return False
    return bool(m.get("tool_calls")) or _text(m.get("content")).startswith("Calling tools:")


def agent_reply(body: dict[str, Any]) -> ScriptedReply | None:
    """The scripted reply to a chat request, or None when it carries no directives."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    for last_user in reversed(users):
        rounds, answer = _directives(messages[last_user].get("content"))
        if rounds or answer not in (None, "done"):
            break
        # A framework that sends tool calls and results as text (smolagents: an assistant
        # "Calling tools: ..." message, then a user "Observation: ..." one) puts user
        # messages after the directives: look further back past those only.
        if not any(_is_tool_turn(m) for m in messages[last_user - 1 : last_user]):
            return None
    else:
        return None
    answer = answer or "done"
    taken = sum(1 for m in messages[last_user + 1 :] if _is_tool_turn(m))
    if taken >= len(rounds):
        return ScriptedReply(answer)
    offered = _tool_names(body.get("tools"))
    calls = rounds[taken]
    missing = [name for name, _ in calls if name not in offered]
    if missing:
        return ScriptedReply(f"cannot call {', '.join(missing)}: not among the tools offered")
    out = []
    for i, (name, args) in enumerate(calls):
        try:
            arguments = json.dumps(json.loads(args))
        except ValueError:
            return ScriptedReply(f"bad arguments for {name}: {args}")
        out.append(ToolCall(f"call_{last_user}_{taken}_{i}", name, arguments))
    return ScriptedReply("", tuple(out))
