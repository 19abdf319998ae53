"""LangChain / LangGraph: a chat model wired to agentrt, and a callback handler that maps
LangChain's run tree onto jobs, sessions and tool waits.

Two lines::

    llm = agentrt.integrations.langchain.model(rt, "my-model")
    agent.invoke(inputs, config={"callbacks": [agentrt.integrations.langchain.instrument(rt)]})

- the top-level run (a graph, an agent, a chain, or a lone model or tool call) is a job,
  named after the run;
- the chat-model calls of one agent are one session: those of one graph node (one
  ``langgraph_path``) in one graph, so a react agent's turns share a session, and each
  branch of a fan-out (``Send``) gets its own. A run started inside a tool (a sub-agent)
  is a new agent whose sessions name the tool's session as their parent;
- a tool run is a tool wait, with the tool's name, in the session whose call ended last
  in its graph (the one that asked for the tool).

``rt`` is a :class:`~agentrt.Runtime` (``await agent.ainvoke(...)``) or a
:class:`~agentrt.SyncRuntime` (``agent.invoke(...)``). Needs ``pip install
"agentjct[langchain]"``. See docs/integrations.md. (``chat_model`` and ``callbacks``,
their names in 0.2, still work and warn: they go in the next release.)
"""

from __future__ import annotations

import contextvars
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from agentrt import AgentrtError, Runtime, SyncRuntime

from . import Bridge, bind, unbind

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_openai import ChatOpenAI as _ChatOpenAIBase
except ImportError as exc:
    raise ImportError(
        f"agentrt.integrations.langchain needs LangChain ({exc.name or exc} is missing); "
        'install it with: pip install "agentjct[langchain]"'
    ) from exc

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForLLMRun,
        CallbackManagerForLLMRun,
    )
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatGenerationChunk, ChatResult

    from agentrt import Session

__all__ = ["AgentrtCallbackHandler", "ChatOpenAI", "instrument", "model"]

_Kind = Literal["chain", "llm", "tool"]
_FRAMEWORK_KEYS = ("langgraph_", "ls_", "lc_", "checkpoint_")
"""Run metadata LangChain and LangGraph add themselves (a job's metadata is the user's)."""
_Branch = tuple[str, str | None]
"""A session's branch in its agent: the graph namespace and the node's path."""
_Key = tuple[UUID, _Branch]
"""A session's key in the bridge: its agent's root run and its branch."""


def model(rt: Runtime | SyncRuntime, name: str, **kwargs: Any) -> ChatOpenAI:
    """A ``langchain_openai.ChatOpenAI`` serving ``name`` whose calls go through agentrt.

    With a :class:`~agentrt.Runtime` it serves async invocation (``ainvoke``,
    ``astream``); with a :class:`~agentrt.SyncRuntime`, sync invocation (``invoke``,
    ``stream``). ``base_url`` and ``api_key`` default to the runtime's first endpoint and
    key; ``max_retries`` is 0 (agentrt retries). Other keyword arguments go to
    ``ChatOpenAI``. Its calls are the turns of the session that
    :func:`instrument`'s handler gives their run, or of the enclosing
    ``job.session(...)`` block without one.
    """
    return _chat_openai(rt, name, kwargs)


def instrument(rt: Runtime | SyncRuntime) -> AgentrtCallbackHandler:
    """The callback handler to pass in ``config={"callbacks": [handler]}``.

    One handler serves any number of runs, concurrent ones included."""
    return AgentrtCallbackHandler(rt)


def chat_model(rt: Runtime | SyncRuntime, *, model: str, **kwargs: Any) -> ChatOpenAI:
    """Deprecated: ``model(rt, model, **kwargs)`` (its name in 0.2; it goes in the next
    release)."""
    _deprecated("chat_model(rt, model=...)", "model(rt, name)")
    return _chat_openai(rt, model, kwargs)


def callbacks(rt: Runtime | SyncRuntime) -> AgentrtCallbackHandler:
    """Deprecated: :func:`instrument` (its name in 0.2; it goes in the next release)."""
    _deprecated("callbacks(rt)", "instrument(rt)")
    return instrument(rt)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"agentrt.integrations.langchain.{old} is deprecated and goes in the next release: "
        f"use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def _chat_openai(rt: Runtime | SyncRuntime, name: str, kwargs: dict[str, Any]) -> ChatOpenAI:
    for arg in ("http_client", "http_async_client"):
        if arg in kwargs:
            raise ValueError(f"model() builds its own {arg}: it goes through agentrt")
    kwargs = Bridge(rt).client_kwargs(**kwargs)
    if isinstance(rt, SyncRuntime):
        kwargs["http_client"] = rt.http_client()
    else:
        kwargs["http_async_client"] = rt.http_client()
    llm = ChatOpenAI(model=name, **kwargs)
    llm._agentrt_sync = isinstance(rt, SyncRuntime)
    return llm


@dataclass(slots=True, eq=False)
class _Agent:
    """One agent: the runs under a top-level run, or under a tool (a sub-agent)."""

    job_key: UUID
    root: UUID
    name: str
    parent: Session | None
    """The session of the tool that started this agent (None at the top)."""
    sessions: dict[_Branch, _Key] = field(default_factory=dict)
    first: _Key | None = None
    """The agent's first session: the parent of its later ones."""
    last: dict[str, _Key] = field(default_factory=dict)
    """By graph namespace: the session whose call ended last (a tool waits in it)."""


@dataclass(slots=True, eq=False)
class _Run:
    agent: _Agent
    kind: _Kind
    ns: str
    session: _Key | None = None
    """A chat-model run's session, or the session a tool waits in."""


def _graph_ns(metadata: Mapping[str, Any]) -> str:
    """The namespace of the graph a run belongs to (its checkpoint namespace without
    the node's own segment): nested graphs differ, a graph's nodes share it."""
    ns = metadata.get("langgraph_checkpoint_ns")
    return ns.rpartition("|")[0] if isinstance(ns, str) else ""


def _run_name(serialized: Mapping[str, Any] | None, kwargs: Mapping[str, Any], default: str) -> str:
    name = kwargs.get("name") or (serialized or {}).get("name")
    if not isinstance(name, str) or not name:
        return default
    return _clip(name.replace("\r", " ").replace("\n", " ").replace("\x00", " "))


def _clip(name: str, limit: int = 200) -> str:
    """``name`` cut to at most ``limit`` UTF-8 bytes (agentrt's names take 256)."""
    return name.encode("utf-8", "ignore")[:limit].decode("utf-8", "ignore")


class AgentrtCallbackHandler(BaseCallbackHandler):
    """Maps LangChain's runs onto agentrt's jobs, sessions and tool waits (see the
    module's docstring). Obtained from :func:`callbacks`.

    It runs inline (in the task or thread that makes the call), so a call's session is
    known before its request is sent."""

    run_inline = True

    def __init__(self, rt: Runtime | SyncRuntime) -> None:
        super().__init__()
        self._bridge = Bridge(rt)
        self._runs: dict[UUID, _Run] = {}

    def session_of(self, run_id: UUID) -> Session | None:
        """The session a chat-model run's calls belong to (while the run is open)."""
        run = self._runs.get(run_id)
        if run is None or run.session is None:
            return None
        return self._bridge.session(run.session)

    # -- LangChain's callbacks ---------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any],
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A chain (a graph, a node, an agent) started: mapped as the class docstring says."""
        name = _run_name(serialized, kwargs, "chain")
        self._bridge.call_in_loop(self._start, run_id, parent_run_id, "chain", name, metadata or {})

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A chat model call started: it becomes a call of the run's session."""
        name = _run_name(serialized, kwargs, "chat_model")
        self._bridge.call_in_loop(self._start, run_id, parent_run_id, "llm", name, metadata or {})
        _STARTED.set((self, run_id))

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A completion model call started: it becomes a call of the run's session."""
        name = _run_name(serialized, kwargs, "llm")
        self._bridge.call_in_loop(self._start, run_id, parent_run_id, "llm", name, metadata or {})
        _STARTED.set((self, run_id))

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A tool started: the session's tool wait begins."""
        name = _run_name(serialized, kwargs, "tool")
        self._bridge.call_in_loop(self._start, run_id, parent_run_id, "tool", name, metadata or {})

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A retriever started: treated as a chain run (not a tool wait)."""
        name = _run_name(serialized, kwargs, "retriever")
        self._bridge.call_in_loop(self._start, run_id, parent_run_id, "chain", name, metadata or {})

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A chain ended: what it opened (a job, a session) ends with it."""
        self._end_soon(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A chain failed: what it opened (a job, a session) ends with the error."""
        self._end_soon(run_id, error)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A model call ended."""
        self._end_soon(run_id, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A model call failed."""
        self._end_soon(run_id, error)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A tool ended: the session's tool wait ends."""
        self._end_soon(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A tool failed: the session's tool wait ends with the error."""
        self._end_soon(run_id, error)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A retriever ended, as a chain run ends."""
        self._end_soon(run_id, None)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A retriever failed, as a chain run fails."""
        self._end_soon(run_id, error)

    # -- the run tree, in the runtime's loop -------------------------------------------

    def _end_soon(self, run_id: UUID, error: BaseException | None) -> None:
        if run_id in self._runs:  # runs we do not track end without a trip to the loop
            self._bridge.call_in_loop(self._end, run_id, error)

    def _start(
        self,
        run_id: UUID,
        parent_id: UUID | None,
        kind: _Kind,
        name: str,
        metadata: Mapping[str, Any],
    ) -> None:
        parent = None if parent_id is None else self._runs.get(parent_id)
        if parent is None:
            # A top-level run (or one whose parent ran without this handler): a job.
            job_metadata = {
                k: v
                for k, v in metadata.items()
                if isinstance(v, str | int | float | bool) and not k.startswith(_FRAMEWORK_KEYS)
            }
            thread = metadata.get("thread_id")  # LangGraph's, from config["configurable"]
            thread = str(thread) if isinstance(thread, str | int) and thread != "" else None
            if self._bridge.start_job(run_id, name, metadata=job_metadata, thread=thread) is None:
                return  # the runtime is closed
            agent = _Agent(run_id, run_id, name, None)
        elif parent.kind == "tool":
            # A run inside a tool: a sub-agent, whose sessions the tool's session spawned.
            spawner = None if parent.session is None else self._bridge.session(parent.session)
            agent = _Agent(parent.agent.job_key, run_id, name, spawner)
        else:
            agent = parent.agent
        ns = _graph_ns(metadata)
        run = self._runs[run_id] = _Run(agent, kind, ns)
        if kind == "llm":
            run.session = self._session(agent, ns, metadata)
        elif kind == "tool":
            run.session = agent.last.get(ns) or agent.first or self._session(agent, ns, metadata)
            if run.session is not None:
                self._bridge.start_tool(run_id, run.session, name)

    def _session(self, agent: _Agent, ns: str, metadata: Mapping[str, Any]) -> _Key | None:
        """The session of this agent's branch (graph namespace and node path)."""
        path = metadata.get("langgraph_path")
        branch = (ns, None if path is None else str(path))
        key = agent.sessions.get(branch)
        if key is not None:
            return key
        name = agent.name
        node = metadata.get("langgraph_node")
        if isinstance(node, str) and node:
            name = f"{name}/{node}"
            if isinstance(path, tuple) and len(path) > 1 and path[0] == "__pregel_push":
                name = f"{name}[{path[1]}]"
        key = (agent.root, branch)
        parent = agent.parent if agent.first is None else self._bridge.session(agent.first)
        if self._bridge.start_session(key, agent.job_key, _clip(name), parent=parent) is None:
            return None
        agent.sessions[branch] = key
        agent.first = agent.first or key
        return key

    def _end(self, run_id: UUID, error: BaseException | None) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        agent = run.agent
        if run.kind == "tool":
            self._bridge.end_tool(run_id, error)
        elif run.kind == "llm" and run.session is not None:
            agent.last[run.ns] = run.session
        if agent.root != run_id:
            return
        if agent.job_key == run_id:
            self._bridge.end_job(run_id, error)
            # Runs the framework never ended (it dropped them) go with their job.
            for rid in [r for r, x in self._runs.items() if x.agent.job_key == run_id]:
                del self._runs[rid]
        else:
            for key in agent.sessions.values():
                self._bridge.end_session(key)


class ChatOpenAI(_ChatOpenAIBase):
    """``langchain_openai.ChatOpenAI`` whose calls are the turns of the session the agentrt callback
    handler gave their run (found through the run's callback manager)."""

    _agentrt_sync: bool = False

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._check_side(sync=True)
        with _bound(run_manager):
            return super()._generate(messages, stop, run_manager, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._check_side(sync=False)
        with _bound(run_manager):
            return await super()._agenerate(messages, stop, run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        *,
        stream_usage: bool | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        self._check_side(sync=True)
        chunks = super()._stream(messages, stop, run_manager, stream_usage=stream_usage, **kwargs)
        try:
            while True:
                # Bound for each step only: the caller's context between chunks is its own.
                with _bound(run_manager):
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                yield chunk
        finally:
            chunks.close()  # type: ignore[attr-defined]

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        *,
        stream_usage: bool | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        self._check_side(sync=False)
        chunks = super()._astream(messages, stop, run_manager, stream_usage=stream_usage, **kwargs)
        try:
            while True:
                with _bound(run_manager):
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    def _check_side(self, *, sync: bool) -> None:
        if sync and not self._agentrt_sync:
            raise AgentrtError(
                "this chat model runs on an async agentrt.Runtime: call ainvoke / astream, "
                "or build it from an agentrt.SyncRuntime for invoke / stream"
            )
        if not sync and self._agentrt_sync:
            raise AgentrtError(
                "this chat model runs on an agentrt.SyncRuntime: call invoke / stream, "
                "or build it from an async agentrt.Runtime for ainvoke / astream"
            )


_STARTED: contextvars.ContextVar[tuple[AgentrtCallbackHandler, UUID] | None]
_STARTED = contextvars.ContextVar("agentrt_langchain_llm_run", default=None)
"""The model run started last in this context, and the handler that saw it start (the
handler runs inline: in the context that then makes the call). ``BaseChatModel.astream``
and ``stream`` call ``_astream`` / ``_stream`` without their run manager."""


@contextmanager
def _bound(run_manager: Any) -> Iterator[None]:
    """Bind the session agentrt's handler gave this run to the calls made in here."""
    session = None
    if run_manager is not None:
        for handler in run_manager.handlers:
            if isinstance(handler, AgentrtCallbackHandler):
                session = handler.session_of(run_manager.run_id)
                if session is not None:
                    break
    else:
        started = _STARTED.get()
        if started is not None:
            session = started[0].session_of(started[1])
    if session is None:
        yield
        return
    binding = bind(session)
    try:
        yield
    finally:
        unbind(binding)
