"""The OpenAI Agents SDK on agentrt: a model whose calls go through agentrt, and a tracing
processor that maps the SDK's traces onto agentrt's jobs, sessions and tool waits.

::

    from agentrt.integrations import openai_agents

    openai_agents.instrument(rt)                        # traces -> jobs, agents -> sessions
    agent = Agent(name="coder", model=openai_agents.model(rt, "my-model"), tools=[...])
    result = await Runner.run(agent, "Why does test_parse fail?")

- a trace (one ``Runner.run``, or the user's ``with trace(...)`` around several) is a
  job, named after the workflow; it ends ``ok``, ``error`` when the run raises, or
  ``cancelled``;
- an agent span is a session named after the agent. An agent run as a tool
  (``agent.as_tool``) gets a session whose parent is the calling agent's, and so does the
  agent a handoff passes control to;
- each generation (or response) span binds its agent's session to the model call made
  inside it, so the call is that session's turn, tagged for the engine;
- a function span is a tool wait named after the tool.

Requires the extra: ``pip install "agentjct[openai-agents]"`` (tested with
openai-agents 0.24). See docs/integrations.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import Binding, Bridge, bind, unbind

try:
    from agents import OpenAIChatCompletionsModel, add_trace_processor, set_trace_processors
    from agents.tracing import (
        AgentSpanData,
        FunctionSpanData,
        GenerationSpanData,
        HandoffSpanData,
        ResponseSpanData,
        Span,
        Trace,
        TracingProcessor,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "agentrt.integrations.openai_agents needs the OpenAI Agents SDK: "
        'pip install "agentjct[openai-agents]"'
    ) from exc

if TYPE_CHECKING:
    from agentrt import Runtime

__all__ = ["AgentrtTracingProcessor", "instrument", "model"]


def model(rt: Runtime, name: str, **client_kwargs: Any) -> OpenAIChatCompletionsModel:
    """A chat-completions model whose calls go through agentrt (``rt.openai()``).

    Keyword arguments go to ``rt.openai()`` (e.g. ``base_url`` to pick one endpoint's
    URL; by default the runtime's first endpoint, and agentrt routes among all)."""
    return OpenAIChatCompletionsModel(model=name, openai_client=rt.openai(**client_kwargs))


def instrument(rt: Runtime, *, exclusive: bool = False) -> AgentrtTracingProcessor:
    """Register a tracing processor that maps the SDK's runs onto ``rt``'s jobs.

    ``exclusive=True`` replaces the SDK's processors with this one, among them its default
    one, which exports every trace to OpenAI's tracing backend when ``OPENAI_API_KEY`` is
    set. (``agents.set_tracing_disabled(True)`` would switch off this processor too.)
    Instrument one runtime at a time; a processor does nothing once its runtime is closed
    or :meth:`~AgentrtTracingProcessor.shutdown` is called.
    """
    processor = AgentrtTracingProcessor(rt)
    if exclusive:
        set_trace_processors([processor])
    else:
        add_trace_processor(processor)
    return processor


@dataclass(slots=True, eq=False)
class _TraceState:
    raised_before: BaseException | None
    """The exception being handled when the trace started (not the run's)."""
    agent_of: dict[str, str] = field(default_factory=dict)
    """Each open span's nearest enclosing agent span (its session's key)."""
    bindings: dict[str, Binding] = field(default_factory=dict)
    session_ids: dict[str, str] = field(default_factory=dict)
    """The session id of each agent span, ended or not (a handoff's target names it)."""
    handoff: tuple[str, str] | None = None
    """The last handoff not yet taken: (target agent's name, source session's key)."""


class AgentrtTracingProcessor(TracingProcessor):
    """Maps the Agents SDK's traces and spans onto an agentrt runtime (see the module).

    Its callbacks run synchronously in the task that starts or ends each trace or span,
    which is what lets a generation span bind its session to the model call it wraps.
    """

    def __init__(self, rt: Runtime) -> None:
        self._bridge = Bridge(rt)
        self._traces: dict[str, _TraceState] = {}
        self._closed = False

    # -- traces: jobs ----------------------------------------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        """A trace (one agent run) started: it opens a job."""
        if self._closed:
            return
        metadata: dict[str, Any] = {"trace_id": trace.trace_id}
        group_id = getattr(trace, "group_id", None)
        if group_id is not None:
            metadata["group_id"] = group_id
        thread = group_id if isinstance(group_id, str) else None  # the conversation
        started = self._bridge.start_job(
            trace.trace_id, trace.name, metadata=metadata, thread=thread
        )
        if started is not None:  # (outside the runtime's loop: the calls are implicit jobs)
            self._traces[trace.trace_id] = _TraceState(sys.exc_info()[1])

    def on_trace_end(self, trace: Trace) -> None:
        """A trace ended: its job ends, with its report."""
        state = self._traces.pop(trace.trace_id, None)
        if state is None:
            return
        for binding in state.bindings.values():
            unbind(binding)
        # The SDK ends a run's trace as its ``with`` block exits: an exception leaving
        # the run is the one being handled now.
        raised = sys.exc_info()[1]
        self._bridge.end_job(trace.trace_id, None if raised is state.raised_before else raised)

    # -- spans: sessions, calls, tool waits --------------------------------------------

    def on_span_start(self, span: Span[Any]) -> None:
        """A span started: an agent span opens a session, a function span a tool wait."""
        state = self._traces.get(span.trace_id)
        if state is None:
            return
        data = span.span_data
        parent = None if span.parent_id is None else state.agent_of.get(span.parent_id)
        if isinstance(data, AgentSpanData):
            self._start_agent(state, span, data, parent)
            return
        if parent is None:
            return
        state.agent_of[span.span_id] = parent
        if isinstance(data, GenerationSpanData | ResponseSpanData):
            session = self._bridge.session(parent)
            if session is not None:
                state.bindings[span.span_id] = bind(session)
        elif isinstance(data, FunctionSpanData):
            self._bridge.start_tool(span.span_id, parent, data.name)

    def _start_agent(
        self, state: _TraceState, span: Span[Any], data: AgentSpanData, parent: str | None
    ) -> None:
        if parent is None and state.handoff is not None and state.handoff[0] == data.name:
            parent = state.handoff[1]  # control handed over: the source agent spawned it
            state.handoff = None
        parent_id = None if parent is None else state.session_ids.get(parent)
        session = self._bridge.start_session(
            span.span_id, span.trace_id, data.name, parent=parent_id
        )
        if session is not None:
            state.agent_of[span.span_id] = span.span_id
            state.session_ids[span.span_id] = session.id

    def on_span_end(self, span: Span[Any]) -> None:
        """A span ended: its session or tool wait ends."""
        state = self._traces.get(span.trace_id)
        if state is None:
            return
        data = span.span_data
        agent = state.agent_of.pop(span.span_id, None)
        if agent is None:
            return
        if isinstance(data, AgentSpanData):
            self._bridge.end_session(span.span_id)
        elif isinstance(data, GenerationSpanData | ResponseSpanData):
            binding = state.bindings.pop(span.span_id, None)
            if binding is not None:
                unbind(binding)
        elif isinstance(data, FunctionSpanData):
            if span.error is None:
                self._bridge.end_tool(span.span_id)
            else:  # the exception being handled, if the SDK ends the span in its handler
                raised = sys.exc_info()[1]
                self._bridge.end_tool(
                    span.span_id, raised, status="error" if raised is None else None
                )
        elif isinstance(data, HandoffSpanData) and data.to_agent is not None:
            state.handoff = (data.to_agent, agent)

    # -- the rest of the interface -------------------------------------------------------

    def shutdown(self) -> None:
        """Stop mapping new traces (those in progress still end their jobs)."""
        self._closed = True

    def force_flush(self) -> None:
        """Nothing is buffered: reports are made as jobs end."""
