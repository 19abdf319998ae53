"""Google's Agent Development Kit on agentrt: a LiteLLM model whose calls go through
agentrt, and a runner plugin that maps each run onto a job, each agent onto a session
and each tool call onto a tool wait.

::

    from agentrt.integrations import google_adk

    agent = LlmAgent(name="coder", model=google_adk.model(rt, "my-model"), tools=[run_tests])
    app = App(name="coder", root_agent=agent, plugins=[google_adk.instrument(rt)])
    runner = InMemoryRunner(app=app)
    async for event in runner.run_async(user_id=..., session_id=..., new_message=...):
        ...

- a runner's run (``run_async``) outside any job is a job named after its root agent;
  it ends ``ok``, or ``error`` when the run raises;
- each agent is a session named after it: the model calls it makes are its turns;
- each tool call is a tool wait named after the tool, in its agent's session (``ok``,
  or ``error`` when the tool raised);
- an agent run from a tool (``AgentTool(agent=...)``, whose runner inherits the
  plugins, or a tool that runs it under the same plugin) runs in the same job, in a
  session of its own for that tool call whose parent is the calling agent's session.

ADK's model is LiteLLM's (``LiteLlm``), given agentrt's client: LiteLLM sends through
it. Requires the extra: ``pip install "agentjct[google-adk]"`` (tested with google-adk
2.13 and litellm 1.110). See docs/integrations.md.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from . import Agents, Binding, OpenJob, OpenTool, bind, unbind

try:
    from google.adk.models.lite_llm import LiteLlm
    from google.adk.plugins.base_plugin import BasePlugin
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "agentrt.integrations.google_adk needs Google ADK and LiteLLM: "
        'pip install "agentjct[google-adk]"'
    ) from exc

if TYPE_CHECKING:
    from agentrt import Runtime

__all__ = ["AgentrtPlugin", "instrument", "model"]


def model(rt: Runtime, name: str, **kwargs: Any) -> LiteLlm:
    """A ``LiteLlm`` model whose calls go through agentrt (``rt.openai()``). ``name`` is
    the served model's name (``openai/`` is put before it unless it names a LiteLLM
    provider already); other keyword arguments go to ``LiteLlm``."""
    return LiteLlm(model=name if "/" in name else f"openai/{name}", client=rt.openai(), **kwargs)


def instrument(rt: Runtime) -> AgentrtPlugin:
    """A plugin (``App(..., plugins=[...])``) that maps the runs onto ``rt``'s jobs,
    sessions and tool waits (see the module)."""
    return AgentrtPlugin(rt)


class AgentrtPlugin(BasePlugin):  # type: ignore[misc]  # ADK is not installed for mypy
    """ADK's runner callbacks onto an agentrt runtime (see the module). ADK awaits them
    in the task that runs the agent, its model call or its tool, which is what lets them
    bind a session to the call that follows."""

    def __init__(self, rt: Runtime, name: str = "agentrt") -> None:
        super().__init__(name=name)
        self._agents = Agents.shared(rt)
        self._runs: dict[str, OpenJob] = {}
        self._bindings: dict[Hashable, Binding] = {}
        self._tools: dict[Hashable, OpenTool] = {}

    # -- runs: jobs ----------------------------------------------------------------------

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        """A run starts: a job, unless it runs inside one (an agent run from a tool)."""
        if not self._agents.active or self._agents.in_job():
            return
        opened = self._agents.start_job(str(invocation_context.agent.name))
        if opened is not None:
            self._runs[invocation_context.invocation_id] = opened

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        """The run ended: its job ends ``ok``."""
        opened = self._runs.pop(invocation_context.invocation_id, None)
        if opened is not None:
            self._agents.end_job(opened)

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        """The run raised: its job ends ``error``."""
        opened = self._runs.pop(invocation_context.invocation_id, None)
        if opened is not None:
            self._agents.end_job(opened, error)

    # -- model calls: turns of the agent's session ---------------------------------------

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
        """Bind the agent's session to the model call that follows."""
        session = self._agents.session(str(callback_context.agent_name))
        if session is not None:
            self._bindings[_call_key(callback_context)] = bind(session)

    async def after_model_callback(self, *, callback_context: Any, llm_response: Any) -> None:
        """The model call ended: unbind."""
        binding = self._bindings.pop(_call_key(callback_context), None)
        if binding is not None:
            unbind(binding)

    async def on_model_error_callback(
        self, *, callback_context: Any, llm_request: Any, error: Exception
    ) -> None:
        """The model call failed: unbind."""
        await self.after_model_callback(callback_context=callback_context, llm_response=None)

    # -- tool calls: tool waits ----------------------------------------------------------

    async def before_tool_callback(self, *, tool: Any, tool_args: Any, tool_context: Any) -> None:
        """A tool call starts: a tool wait in its agent's session."""
        opened = self._agents.start_tool(str(tool_context.agent_name), str(tool.name))
        if opened is not None:
            self._tools[_tool_key(tool_context)] = opened

    async def after_tool_callback(
        self, *, tool: Any, tool_args: Any, tool_context: Any, result: Any
    ) -> None:
        """The tool returned: its wait ends ``ok``."""
        opened = self._tools.pop(_tool_key(tool_context), None)
        if opened is not None:
            self._agents.end_tool(opened)

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: Any, tool_context: Any, error: Exception
    ) -> None:
        """The tool raised: its wait ends ``error``."""
        opened = self._tools.pop(_tool_key(tool_context), None)
        if opened is not None:
            self._agents.end_tool(opened, error)


def _call_key(callback_context: Any) -> Hashable:
    return (callback_context.invocation_id, callback_context.agent_name)


def _tool_key(tool_context: Any) -> Hashable:
    return (tool_context.invocation_id, tool_context.function_call_id)
