"""Framework adapters, and the protocol they are built on.

The adapters: LangChain / LangGraph, LlamaIndex, the OpenAI Agents SDK, PydanticAI,
Strands, Google ADK and AG2, each in its own module that imports its framework lazily
(install the matching extra: ``agentjct[langchain]``, ...). Import the one you need:
``from agentrt.integrations import langchain``. Each has ``model(rt, name, ...)``, the
framework's model object on agentrt's clients, and ``instrument(rt, ...)``, the
framework's own hook object that maps its runs onto jobs, sessions and tool waits.

The protocol, exported here: :class:`Bridge` (jobs, sessions and tool waits opened and
ended by a framework's callbacks, kept by the framework's keys), :class:`Agents` (the
same found by agent name in the current context; also the recipe for frameworks with no
hooks, such as Agno and AutoGen), and :func:`bind` / :func:`unbind` (a session around a
model request). See docs/integrations.md, "Write an adapter".
"""

from ._bridge import Agents, Binding, Bridge, OpenJob, OpenTool, bind, unbind

__all__ = ["Agents", "Binding", "Bridge", "OpenJob", "OpenTool", "bind", "unbind"]
