"""LlamaIndex: an LLM whose calls go through agentrt, and a span handler that maps workflow
(agent) runs onto jobs, their agents onto sessions and tool calls onto tool waits.

Two lines::

    llm = agentrt.integrations.llamaindex.model(rt, "my-model")
    agentrt.integrations.llamaindex.instrument(rt)

    agent = FunctionAgent(tools=[...], llm=llm)
    await agent.run(user_msg="...")          # one job, its JobReport in rt.reports()

How runs map (docs/integrations.md, "LlamaIndex"):

- a top-level workflow run (``FunctionAgent.run``, ``AgentWorkflow.run``, any
  ``Workflow.run``) is a job, named after the agent (``name``) or the workflow class. It
  ends when the run does: ``ok``, ``error`` when the run raises, ``cancelled`` when it is
  cancelled;
- the run's LLM calls are one session, named after the agent; in an ``AgentWorkflow`` each
  agent gets its own session, whose parent is the session of the agent that handed off
  to it; a run started inside a tool (a sub-agent) is a session of the same job whose
  parent is the calling agent's session;
- each tool call (``BaseTool.acall`` / ``call``) is a tool wait named after the tool;
  ``error`` when the tool raised (FunctionAgent then hands the error text to the model and
  the run goes on).

The handler hears LlamaIndex's span enter/exit callbacks (``get_dispatcher()``, the root
dispatcher) and drives an :class:`agentrt.integrations.Bridge`. The session of an
LLM call is found the way the transport always finds it: each workflow step is bound to
its agent's session while it runs (a step's span is entered and left in the step's own
context), so the streamed replies FunctionAgent reads inside the step are that session's
turns.

The LLM is async only through agentrt: its synchronous client raises (agent workflows
call ``achat`` / ``astream_chat``). (``llm(rt, model=...)``, its name in 0.2, still works
and warns: it goes in the next release.)
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from agentrt import AgentrtError

from . import Binding, Bridge, bind, unbind

if TYPE_CHECKING:
    from agentrt import Runtime, Session

__all__ = ["instrument", "model", "uninstrument"]

INSTALL_HINT = 'pip install "agentjct[llamaindex]"'
_T = TypeVar("_T")


def _import_error(exc: ImportError) -> ImportError:
    return ImportError(
        f"agentrt.integrations.llamaindex needs LlamaIndex ({exc.name or exc}): {INSTALL_HINT}"
    )


def model(rt: Runtime, name: str, **kwargs: Any) -> Any:
    """A LlamaIndex ``OpenAILike`` LLM serving ``name`` whose calls go through ``rt``
    (tagged, scheduled, routed and reported; inside an instrumented run they are its
    session's turns).

    It talks to the runtime's first endpoint unless ``api_base`` says otherwise, is a
    chat and function-calling model (agents can call tools), and has ``max_retries=0``
    (agentrt retries). Other keyword arguments go to ``OpenAILike``.
    """
    return _openai_like(rt, name, kwargs)


def llm(rt: Runtime, *, model: str, **kwargs: Any) -> Any:
    """Deprecated: ``model(rt, model, **kwargs)`` (its name in 0.2; it goes in the next
    release)."""
    warnings.warn(
        "agentrt.integrations.llamaindex.llm(rt, model=...) is deprecated and goes in the "
        "next release: use model(rt, name)",
        DeprecationWarning,
        stacklevel=2,
    )
    return _openai_like(rt, model, kwargs)


def _openai_like(rt: Runtime, name: str, kwargs: dict[str, Any]) -> Any:
    try:
        from llama_index.llms.openai_like import OpenAILike
    except ImportError as exc:
        raise _import_error(exc) from exc
    for arg in ("http_client", "async_http_client"):
        if arg in kwargs:
            raise ValueError(f"model() builds the {arg} itself (agentrt's); do not pass one")
    base = Bridge(rt).client_kwargs(max_retries=kwargs.pop("max_retries", 0))
    kwargs.setdefault("api_base", base["base_url"])
    kwargs.setdefault("api_key", base["api_key"])
    kwargs.setdefault("is_chat_model", True)
    kwargs.setdefault("is_function_calling_model", True)
    return OpenAILike(
        model=name,
        max_retries=0,
        async_http_client=rt.http_client(),
        http_client=httpx.Client(transport=_AsyncOnly()),  # openai 3.x takes httpx's too
        **kwargs,
    )


class _AsyncOnly(httpx.BaseTransport):
    """The LLM's synchronous transport: agentrt's runtime is async, so a synchronous call
    would bypass it (or block its event loop). It says so instead."""

    def handle_request(self, request: Any) -> Any:
        raise AgentrtError(
            "the agentrt LlamaIndex LLM is async only: use achat / astream_chat / acomplete "
            "(agent workflows do)"
        )


# -- the span handler -----------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Run:
    """One workflow run: its job's key in the bridge, and its sessions by agent name."""

    span_id: str
    job_key: Hashable
    owns_job: bool
    multi_agent: bool
    parent: Session | None
    """The session that started this run (a sub-agent's caller), if any."""
    sessions: dict[str, Session] = field(default_factory=dict)
    current: Session | None = None
    """The session of the agent whose turn it is."""


class _Tracker:
    """The span handler's logic (plain Python): LlamaIndex span callbacks in, bridge calls
    out. All state is keyed by span id and dropped when the span ends."""

    def __init__(self, rt: Runtime, workflow_cls: type, tool_cls: type) -> None:
        self.rt = rt
        self.bridge = Bridge(rt)
        self._workflow_cls = workflow_cls
        self._tool_cls = tool_cls
        self._parents: dict[str, str | None] = {}
        """Every open span's parent (LlamaIndex's span tree)."""
        self._runs: dict[str, _Run] = {}
        self._session_of: dict[str, Session] = {}
        """The session of each open step and tool span."""
        self._bindings: dict[str, Binding] = {}
        self._tools: set[str] = set()
        self._keys: dict[str, Hashable] = {}
        """The bridge key of each session this handler opened, by session id."""

    # -- callbacks ----------------------------------------------------------------------

    def enter(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any,
        parent_id: str | None,
    ) -> None:
        self._parents[id_] = parent_id
        if isinstance(instance, self._workflow_cls) and "init_state" in bound_args.arguments:
            self._start_run(id_, instance, parent_id)
            return
        run = None if parent_id is None else self._runs.get(parent_id)
        if run is not None:
            # A step of the run: its body (and any stream it reads) makes the agent's calls.
            session = self._step_session(run, bound_args.arguments.get("ev"))
            if session is not None:
                self._session_of[id_] = session
                self._bindings[id_] = bind(session)
            return
        if isinstance(instance, self._tool_cls) and id_.split("-", 1)[0].endswith(
            (".acall", ".call")
        ):
            self._open_tool(id_, instance, parent_id)

    def exit(self, id_: str, result: Any) -> None:
        cancelled = None
        if id_ in self._runs and result is None:
            # A run cancelled by the user (handler.cancel_run()) exits with no result.
            cancelled = asyncio.CancelledError("workflow cancelled by user")
        self._end(id_, cancelled)

    def drop(self, id_: str, err: BaseException | None) -> None:
        self._end(id_, err or RuntimeError("span dropped"))

    # -- runs ---------------------------------------------------------------------------

    def _start_run(self, id_: str, workflow: Any, parent_id: str | None) -> None:
        outer = self._above(parent_id, self._runs)
        multi = hasattr(workflow, "root_agent") and hasattr(workflow, "agents")
        first = str(workflow.root_agent) if multi else _name_of(workflow)
        if outer is None:
            name = _name_of(workflow)
            metadata = {"framework": "llamaindex", "workflow": type(workflow).__name__}
            if self.bridge.start_job(id_, name, metadata=metadata) is None:
                return  # the runtime is closed
            run = _Run(id_, id_, True, multi, None)
        else:
            run = _Run(id_, outer.job_key, False, multi, self._above(parent_id, self._session_of))
        self._runs[id_] = run
        self._switch(run, first)

    def _switch(self, run: _Run, agent: str) -> Session | None:
        """Make ``agent`` the run's current agent, opening its session on first use
        (its parent: the session of the agent before it, or the run's caller)."""
        session = run.sessions.get(agent)
        if session is None:
            parent = run.current or run.parent
            key = (run.span_id, agent)
            session = self.bridge.start_session(key, run.job_key, agent, parent=parent)
            if session is None:
                return run.current
            run.sessions[agent] = session
            self._keys[session.id] = key
        run.current = session
        return session

    def _step_session(self, run: _Run, event: Any) -> Session | None:
        agent = getattr(event, "current_agent_name", None)
        if run.multi_agent and isinstance(agent, str) and agent:
            return self._switch(run, agent)
        return run.current

    def _end_run(self, run: _Run, exc: BaseException | None) -> None:
        if run.owns_job:
            self.bridge.end_job(run.job_key, exc)
        else:
            for agent in run.sessions:
                self.bridge.end_session((run.span_id, agent))
        for session in run.sessions.values():
            self._keys.pop(session.id, None)

    # -- tools --------------------------------------------------------------------------

    def _open_tool(self, id_: str, tool: Any, parent_id: str | None) -> None:
        session = None
        span = parent_id
        while span is not None:
            if span in self._tools:
                return  # a tool inside a tool: the outer one is the wait
            if span in self._runs:
                break
            session = session or self._session_of.get(span)
            span = self._parents.get(span)
        key = None if session is None else self._keys.get(session.id)
        if session is None or key is None:
            return
        name = str(getattr(getattr(tool, "metadata", None), "name", None) or type(tool).__name__)
        self.bridge.start_tool(id_, key, name)
        self._tools.add(id_)
        self._session_of[id_] = session

    # -- the span tree ------------------------------------------------------------------

    def _above(self, span: str | None, table: dict[str, _T]) -> _T | None:
        """The entry of ``table`` for ``span`` or its nearest ancestor that has one."""
        while span is not None:
            found = table.get(span)
            if found is not None:
                return found
            span = self._parents.get(span)
        return None

    def _end(self, id_: str, exc: BaseException | None) -> None:
        self._parents.pop(id_, None)
        self._session_of.pop(id_, None)
        binding = self._bindings.pop(id_, None)
        if binding is not None:
            unbind(binding)
        if id_ in self._tools:
            self._tools.discard(id_)
            self.bridge.end_tool(id_, exc)
        run = self._runs.pop(id_, None)
        if run is not None:
            self._end_run(run, exc)


def _name_of(workflow: Any) -> str:
    name = getattr(workflow, "name", None)
    return name if isinstance(name, str) and name else type(workflow).__name__


# -- registration -----------------------------------------------------------------------

_HANDLERS: list[Any] = []
"""The handlers :func:`instrument` registered (:func:`uninstrument` removes them)."""


def instrument(rt: Runtime) -> Any:
    """Register a span handler on LlamaIndex's root dispatcher that maps workflow runs
    onto ``rt``'s jobs, agents onto sessions and tool calls onto tool waits (see the
    module's docstring). Returns the handler; calling it again for ``rt`` returns the same
    one. :func:`uninstrument` removes it."""
    try:
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.tools.types import BaseTool
        from llama_index.core.workflow import Workflow
    except ImportError as exc:
        raise _import_error(exc) from exc
    for handler in _HANDLERS:
        if handler._agentrt.rt is rt:
            return handler
    tracker = _Tracker(rt, Workflow, BaseTool)
    if not tracker.bridge.active:
        raise AgentrtError(
            "llamaindex.instrument(rt) takes an open runtime, in its event loop: call it "
            "inside 'async with Runtime(...) as rt:' (this one is closed or not entered)"
        )
    handler = _handler_class()()
    handler._agentrt = tracker
    get_dispatcher().add_span_handler(handler)
    _HANDLERS.append(handler)
    return handler


def uninstrument(rt: Runtime | None = None) -> None:
    """Remove the handler :func:`instrument` registered for ``rt`` (all of them without
    ``rt``). Call it between runs: a run in progress is not followed further, and its
    job stays open (leaving the Runtime's block then reports it)."""
    try:
        from llama_index.core.instrumentation import get_dispatcher
    except ImportError as exc:
        raise _import_error(exc) from exc
    dispatcher = get_dispatcher()
    for handler in list(_HANDLERS):
        if rt is None or handler._agentrt.rt is rt:
            _HANDLERS.remove(handler)
            if handler in dispatcher.span_handlers:
                dispatcher.span_handlers.remove(handler)


_HANDLER_CLASS: list[type] = []


def _handler_class() -> type:
    """The ``BaseSpanHandler`` subclass, defined on first use (LlamaIndex is imported
    lazily). It forwards the dispatcher's callbacks to a :class:`_Tracker`."""
    if _HANDLER_CLASS:
        return _HANDLER_CLASS[0]
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
    from pydantic import PrivateAttr

    class AgentrtSpanHandler(BaseSpanHandler[Any]):  # type: ignore[misc,unused-ignore]
        """Maps LlamaIndex workflow runs, agents and tool calls onto agentrt jobs,
        sessions and tool waits (agentrt.integrations.llamaindex.instrument)."""

        _agentrt: _Tracker = PrivateAttr()

        @classmethod
        def class_name(cls) -> str:
            return "AgentrtSpanHandler"

        def span_enter(
            self,
            id_: str,
            bound_args: inspect.BoundArguments,
            instance: Any = None,
            parent_id: str | None = None,
            tags: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            self._agentrt.enter(id_, bound_args, instance, parent_id)

        def span_exit(
            self,
            id_: str,
            bound_args: inspect.BoundArguments,
            instance: Any = None,
            result: Any = None,
            **kwargs: Any,
        ) -> None:
            self._agentrt.exit(id_, result)

        def span_drop(
            self,
            id_: str,
            bound_args: inspect.BoundArguments,
            instance: Any = None,
            err: BaseException | None = None,
            **kwargs: Any,
        ) -> None:
            self._agentrt.drop(id_, err)

        def new_span(self, *args: Any, **kwargs: Any) -> None:
            return None

        def prepare_to_exit_span(self, *args: Any, **kwargs: Any) -> None:
            return None

        def prepare_to_drop_span(self, *args: Any, **kwargs: Any) -> None:
            return None

    _HANDLER_CLASS.append(AgentrtSpanHandler)
    return AgentrtSpanHandler
