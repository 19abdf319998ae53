"""Strands Agents on agentrt: a model whose calls go through agentrt, and a hook provider
that maps each invocation onto a job, each agent onto a session and each tool call onto
a tool wait.

::

    from agentrt.integrations import strands as agentrt_strands

    hooks = agentrt_strands.instrument(rt)                # runs -> jobs, agents -> sessions
    agent = Agent(name="coder", model=agentrt_strands.model(rt, "my-model"),
                  tools=[run_tests], hooks=[hooks])
    result = await agent.invoke_async("Why does test_parse fail?")

- an invocation (``invoke_async``, ``stream_async``) of an agent outside any job is a
  job named after the agent; it ends ``ok``, ``error`` when the invocation raises, or
  ``cancelled``;
- each agent is a session named after it: the model calls it makes are its turns;
- each tool call is a tool wait named after the tool, in its agent's session (``ok``,
  or ``error`` when the tool raised);
- an agent invoked from a tool (``other.as_tool()``, or a tool that invokes it) runs in
  the same job, in a session of its own for that tool call whose parent is the calling
  agent's session.

Every agent of a run needs the hooks (the same object, or another of the same runtime's
:func:`instrument`). Requires the extra: ``pip install "agentjct[strands]"`` (tested with
strands-agents 1.62; it needs openai<3). See docs/integrations.md.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from . import Agents, Binding, OpenJob, OpenTool, bind, unbind

try:
    from strands.hooks import (
        AfterInvocationEvent,
        AfterModelCallEvent,
        AfterToolCallEvent,
        BeforeInvocationEvent,
        BeforeModelCallEvent,
        BeforeToolCallEvent,
        HookRegistry,
    )
    from strands.models.openai import OpenAIModel
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'agentrt.integrations.strands needs Strands Agents: pip install "agentjct[strands]"'
    ) from exc

if TYPE_CHECKING:
    from agentrt import Runtime

__all__ = ["AgentrtHooks", "instrument", "model"]


def model(rt: Runtime, name: str, **config: Any) -> OpenAIModel:
    """A Strands ``OpenAIModel`` serving ``name`` whose calls go through agentrt
    (``rt.openai()``); other keyword arguments are the model's config
    (``params={"max_tokens": ...}``)."""
    return OpenAIModel(client=rt.openai(), model_id=name, **config)


def instrument(rt: Runtime) -> AgentrtHooks:
    """A hook provider for ``Agent(hooks=[...])`` that maps the agents' runs onto ``rt``'s
    jobs, sessions and tool waits (see the module)."""
    return AgentrtHooks(rt)


class AgentrtHooks:
    """Strands' lifecycle hooks onto an agentrt runtime (see the module): a Strands
    ``HookProvider`` (a protocol: nothing to subclass). Its callbacks
    are synchronous: Strands calls them in the task that runs the invocation, the model
    call or the tool, which is what lets them bind a session to the call that follows."""

    def __init__(self, rt: Runtime) -> None:
        self._agents = Agents.shared(rt)
        self._runs: dict[int, tuple[OpenJob, BaseException | None]] = {}
        self._bindings: dict[int, Binding] = {}
        self._tools: dict[str, OpenTool] = {}

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Subscribe to the invocation, model-call and tool-call events."""
        registry.add_callback(BeforeInvocationEvent, self._before_invocation)
        registry.add_callback(AfterInvocationEvent, self._after_invocation)
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(AfterModelCallEvent, self._after_model)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolCallEvent, self._after_tool)

    def _before_invocation(self, event: BeforeInvocationEvent) -> None:
        if not self._agents.active:
            return  # a sync ``agent(...)`` runs in a loop of its own: implicit jobs
        if self._agents.in_job():
            return  # a sub-agent: its calls join the job of the run that invoked it
        opened = self._agents.start_job(_name(event.agent))
        if opened is not None:
            self._runs[id(event.agent)] = (opened, sys.exc_info()[1])

    def _after_invocation(self, event: AfterInvocationEvent) -> None:
        run = self._runs.pop(id(event.agent), None)
        if run is None:
            return
        opened, raised_before = run
        # Strands fires this event in a ``finally``: an exception leaving the
        # invocation is the one being handled now.
        raised = sys.exc_info()[1]
        self._agents.end_job(opened, None if raised is raised_before else raised)

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        session = self._agents.session(_name(event.agent))
        if session is not None:
            self._bindings[id(event.agent)] = bind(session)

    def _after_model(self, event: AfterModelCallEvent) -> None:
        binding = self._bindings.pop(id(event.agent), None)
        if binding is not None:
            unbind(binding)

    def _before_tool(self, event: BeforeToolCallEvent) -> None:
        opened = self._agents.start_tool(_name(event.agent), event.tool_use["name"])
        if opened is not None:
            self._tools[event.tool_use["toolUseId"]] = opened

    def _after_tool(self, event: AfterToolCallEvent) -> None:
        opened = self._tools.pop(event.tool_use["toolUseId"], None)
        if opened is not None:
            self._agents.end_tool(opened, event.exception)


def _name(agent: Any) -> str:
    return str(getattr(agent, "name", None) or "agent")
