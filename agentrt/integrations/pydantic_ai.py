"""PydanticAI on agentrt: a model whose calls go through agentrt, and a capability that
maps each run onto a job, each agent onto a session and each tool call onto a tool wait.

::

    from agentrt.integrations import pydantic_ai as agentrt_pydantic_ai

    agent = Agent(agentrt_pydantic_ai.model(rt, "my-model"), name="coder", tools=[run_tests],
                  capabilities=[agentrt_pydantic_ai.instrument(rt)])
    result = await agent.run("Why does test_parse fail?")

- a run (``Agent.run``, ``run_stream``, ``run_stream_events``, ``iter``) outside any
  job is a job named after the agent; it ends ``ok``, ``error`` when the run raises,
  or ``cancelled``;
- each agent is a session named after it: its model requests are its turns (a tool's
  own calls, not made through an agent, go to the job's default session);
- each tool execution is a tool wait named after the tool, in its agent's session
  (``ok``, or ``error`` / ``cancelled`` when the tool raised or was cancelled);
- an agent run from a tool (a tool that calls ``other.run(...)``) runs in the same job,
  in a session of its own for that tool call whose parent is the calling agent's session.

The hooks are PydanticAI's capability wrappers (``wrap_run``, ``wrap_model_request``,
``wrap_tool_execute``). ``wrap_run`` binds the agent's session for the run's body (which
PydanticAI runs in the caller's task, carrying over what ``wrap_run`` set): a streamed
run opens its model requests there, not in ``wrap_model_request``'s task. Requires the
extra: ``pip install "agentjct[pydantic-ai]"`` (tested with pydantic-ai-slim 2.68). See
docs/integrations.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import Agents, bind, unbind

try:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'agentrt.integrations.pydantic_ai needs PydanticAI: pip install "agentjct[pydantic-ai]"'
    ) from exc

if TYPE_CHECKING:
    from agentrt import Runtime

__all__ = ["AgentrtCapability", "instrument", "model"]


def model(rt: Runtime, name: str, **kwargs: Any) -> OpenAIChatModel:
    """A PydanticAI ``OpenAIChatModel`` whose calls go through agentrt (``rt.openai()``);
    other keyword arguments go to ``OpenAIChatModel``."""
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=rt.openai()), **kwargs)


def instrument(rt: Runtime) -> AgentrtCapability:
    """A capability for ``Agent(capabilities=[...])`` that maps the agent's runs onto
    ``rt``'s jobs, sessions and tool waits (see the module)."""
    return AgentrtCapability(rt)


class AgentrtCapability(AbstractCapability[Any]):  # type: ignore[misc]  # not installed for mypy
    """PydanticAI's run, model-request and tool-execution wrappers onto an agentrt
    runtime (see the module). One object serves every agent and run of the runtime."""

    def __init__(self, rt: Runtime) -> None:
        self._agents = Agents.shared(rt)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """None: built from a runtime, not from an agent spec."""
        return None

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        """A run outside any job is a job (a run inside one, a sub-agent's, joins it).

        The agent's session is bound here, before the handler: PydanticAI carries what
        ``wrap_run`` sets into the task that runs the run's body, which is where a
        streamed run (``run_stream``, ``run_stream_events``) opens its model requests
        (``wrap_model_request`` runs in a task of its own there)."""
        if not self._agents.active:
            return await handler()
        if self._agents.in_job():
            return await self._bound(ctx, handler)
        opened = self._agents.start_job(_name(ctx))
        if opened is None:  # pragma: no cover - checked just above
            return await handler()
        try:
            result = await self._bound(ctx, handler)
        except BaseException as exc:
            self._agents.end_job(opened, exc)
            raise
        self._agents.end_job(opened)
        return result

    async def _bound(self, ctx: Any, handler: Any) -> Any:
        """``handler()`` with the calls made in the run bound to the agent's session."""
        session = self._agents.session(_name(ctx))
        if session is None:  # pragma: no cover - the job ended before the run began
            return await handler()
        binding = bind(session)
        try:
            return await handler()
        finally:
            unbind(binding)

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        """The model request is a turn of the agent's session."""
        session = self._agents.session(_name(ctx))
        if session is None:
            return await handler(request_context)
        binding = bind(session)
        try:
            return await handler(request_context)
        finally:
            unbind(binding)

    async def wrap_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        """The tool's execution is a tool wait in the agent's session."""
        opened = self._agents.start_tool(_name(ctx), str(call.tool_name))
        if opened is None:
            return await handler(args)
        # The calls the tool makes itself are not the agent's turns (the run bound them):
        # they go to the job's default session (a sub-agent's run binds its own).
        binding = bind(None)
        try:
            result = await handler(args)
        except BaseException as exc:
            unbind(binding)
            self._agents.end_tool(opened, exc)
            raise
        unbind(binding)
        self._agents.end_tool(opened)
        return result


def _name(ctx: Any) -> str:
    agent = getattr(ctx, "agent", None)
    return str(getattr(agent, "name", None) or "agent")
