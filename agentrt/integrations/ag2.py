"""AG2 on agentrt: a model config whose calls go through agentrt, and a middleware that
maps each turn onto a job, each agent onto a session and each tool call onto a tool
wait.

::

    from agentrt.integrations import ag2 as agentrt_ag2

    agent = Agent("coder", config=agentrt_ag2.model(rt, "my-model"), tools=[run_tests],
                  middleware=[agentrt_ag2.instrument(rt, "coder")])
    reply = await agent.ask("Why does test_parse fail?")

- a turn (``Agent.ask``) outside any job is a job named after the agent; it ends
  ``ok``, ``error`` when the turn raises, or ``cancelled``;
- the agent is a session named after it: its model calls (``on_llm_call``) are its turns;
- each tool execution (``on_tool_execution``) is a tool wait named after the tool, in the
  agent's session (``ok``, or ``error`` when the tool failed);
- an agent asked from a tool runs in the same job, in a session of its own for that
  tool call whose parent is the calling agent's session.

AG2's middleware is told nothing of the agent it serves, so :func:`instrument` takes
the agent's name. Requires the extra: ``pip install "agentjct[ag2]"`` (tested with
ag2 1.2). See docs/integrations.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import Agents, Bridge, bind, unbind

try:
    from ag2.config import OpenAIConfig
    from ag2.events import ToolErrorEvent
    from ag2.middleware import BaseMiddleware
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('agentrt.integrations.ag2 needs AG2: pip install "agentjct[ag2]"') from exc

if TYPE_CHECKING:
    from agentrt import Runtime

__all__ = ["AgentrtMiddleware", "instrument", "model"]


def model(rt: Runtime, name: str, **kwargs: Any) -> OpenAIConfig:
    """An AG2 ``OpenAIConfig`` serving ``name`` (AG2's model, ``Agent(config=...)``)
    whose calls go through agentrt (``rt.http_client()``, the runtime's first endpoint
    and key, ``max_retries=0``); other keyword arguments go to ``OpenAIConfig``."""
    kwargs = Bridge(rt).client_kwargs(**kwargs)
    return OpenAIConfig(model=name, http_client=rt.http_client(), **kwargs)


def instrument(rt: Runtime, agent: str) -> AgentrtMiddleware:
    """A middleware factory for ``Agent(middleware=[...])`` that maps the runs of the
    agent named ``agent`` onto ``rt``'s jobs, sessions and tool waits (see the module)."""
    return AgentrtMiddleware(rt, agent)


class AgentrtMiddleware:
    """AG2's turn, model-call and tool-execution wrappers onto an agentrt runtime (see the
    module): a factory AG2 calls at each turn for the middleware of that turn."""

    def __init__(self, rt: Runtime, agent: str) -> None:
        self._agents = Agents.shared(rt)
        self._agent = agent

    def __call__(self, event: Any, context: Any) -> BaseMiddleware:
        """The middleware of one turn."""
        return _Turn(event, context, self._agents, self._agent)


class _Turn(BaseMiddleware):  # type: ignore[misc]  # AG2 is not installed for mypy
    def __init__(self, event: Any, context: Any, agents: Agents, agent: str) -> None:
        super().__init__(event, context)
        self._agents = agents
        self._agent = agent

    async def on_turn(self, call_next: Any, event: Any, context: Any) -> Any:
        if not self._agents.active or self._agents.in_job():
            return await call_next(event, context)
        opened = self._agents.start_job(self._agent)
        if opened is None:  # pragma: no cover - checked just above
            return await call_next(event, context)
        try:
            response = await call_next(event, context)
        except BaseException as exc:
            self._agents.end_job(opened, exc)
            raise
        self._agents.end_job(opened)
        return response

    async def on_llm_call(self, call_next: Any, events: Any, context: Any) -> Any:
        session = self._agents.session(self._agent)
        if session is None:
            return await call_next(events, context)
        binding = bind(session)
        try:
            return await call_next(events, context)
        finally:
            unbind(binding)

    async def on_tool_execution(self, call_next: Any, event: Any, context: Any) -> Any:
        opened = self._agents.start_tool(self._agent, str(event.name))
        if opened is None:
            return await call_next(event, context)
        try:
            result = await call_next(event, context)
        except BaseException as exc:
            self._agents.end_tool(opened, exc)
            raise
        self._agents.end_tool(opened, result.error if isinstance(result, ToolErrorEvent) else None)
        return result
