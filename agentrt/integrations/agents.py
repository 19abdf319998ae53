"""Any agent framework on agentrt: a job around each run, a client per agent, and tools
that report their waits.

Most agent frameworks take an OpenAI client (or an HTTP client, or a base URL and
headers) for their model, and plain Python functions as tools. That is all this module
needs, so it serves frameworks without a tracing or callback API of their own
(Agno, AutoGen, ...)::

    from agentrt.integrations.agents import Agents

    agents = Agents(rt)
    model = SomeModel(openai_client=agents.openai("assistant"))      # its calls: turns
    agent = SomeAgent(model, tools=[agents.tool("assistant", calculator)])
    async with agents.job("assistant"):                               # the run: a job
        await agent.run("What is 17 * 23?")

- ``agents.job(name)`` is a job, as ``rt.job(name)``; it ends what is still open in it;
- ``agents.openai(agent)`` / ``agents.http_client(agent)``: each call made through it in
  a job is a turn of that job's session named ``agent`` (opened by the first call);
- ``agents.tool(agent, fn)``: each call of ``fn`` is a tool wait named after it in that
  session. An agent whose client is used *inside* a tool wait is a sub-agent: it gets a
  session of its own for that tool call, whose parent is the waiting agent's session,
  and that session ends with the tool wait.

Calls made outside ``agents.job`` are counted as agentrt's implicit one-call jobs, and
the tools just run. See docs/integrations.md.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import anyio
import anyio.to_thread
import httpx

from .._clients import AgentOpenAI, client_kwargs
from .._context import _CURRENT_JOB, Job, Session
from .._platform import give_platform
from ..telemetry._report import CallStatus
from ._bridge import Bridge, bind, unbind

if TYPE_CHECKING:
    import openai

    from .._runtime import Runtime

__all__ = ["Agents"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_JOB: contextvars.ContextVar[tuple[Agents, Hashable] | None] = contextvars.ContextVar(
    "agentrt_agents_job", default=None
)
"""The ``agents.job`` block this context runs in: its Agents and the job's key."""
_TOOL: contextvars.ContextVar[tuple[Hashable, Hashable] | None] = contextvars.ContextVar(
    "agentrt_agents_tool", default=None
)
"""The tool wait this context runs in: its key and its session's key."""


_SHARED: weakref.WeakKeyDictionary[Runtime, Agents] = weakref.WeakKeyDictionary()


def _shared(rt: Runtime) -> Agents:
    """The one :class:`Agents` of ``rt`` that the framework adapters' hooks share, so
    that an agent run inside another's run, whatever hook object it was given, joins
    that run's job."""
    agents = _SHARED.get(rt)
    if agents is None:
        agents = _SHARED[rt] = Agents(rt)
    return agents


class Agents:
    """A runtime's jobs, one session per agent, and the agents' tool waits, for a
    framework that takes an OpenAI (or HTTP) client and plain functions as tools."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._bridge = Bridge(rt)
        self._keys = itertools.count()
        self._children: dict[Hashable, list[Hashable]] = {}
        """The sub-agents' sessions opened inside each open tool wait."""

    def __repr__(self) -> str:
        return f"<Agents of {self.rt!r}>"

    # -- jobs --------------------------------------------------------------------------

    @asynccontextmanager
    async def job(
        self,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread: str | None = None,
    ) -> AsyncIterator[Job]:
        """Run one job (``rt.job(name)``): the agents' calls made in the block are turns
        of its sessions. ``thread``: the conversation the run continues, whose sessions
        then keep their ids from run to run (docs/integrations.md, "Conversations that
        resume on another worker"). Its report is ``job.report`` after the block (and
        ``rt.reports()[-1]``); it ends ``ok``, ``error`` or ``cancelled`` as the block
        does."""
        self.rt._check_open()
        opened = self._start_job(
            name, job_id=job_id, program_id=program_id, metadata=metadata, thread=thread
        )
        if opened is None:  # pragma: no cover - _check_open raised first
            raise RuntimeError("the runtime is closed")
        raised: BaseException | None = None
        try:
            yield opened.job
        except BaseException as exc:
            raised = exc
            raise
        finally:
            self._end_job(opened, raised)

    def _start_job(self, name: str, **kwargs: Any) -> _OpenJob | None:
        """Open a job and make it this context's (for a framework's run-start hook);
        None if the runtime is closed. :meth:`_end_job` ends it."""
        key = ("job", next(self._keys))
        job = self._bridge.start_job(key, name, **kwargs)
        if job is None:
            return None
        # other clients' calls: the job's default session
        return _OpenJob(key, job, _JOB.set((self, key)), _CURRENT_JOB.set(job))

    def _end_job(self, opened: _OpenJob, exc: BaseException | None = None) -> None:
        """End a job of :meth:`_start_job` (what is still open in it first)."""
        _reset(_CURRENT_JOB, opened.job_token)
        _reset(_JOB, opened.token)
        self._bridge.end_job(opened.key, exc)

    def in_job(self) -> bool:
        """Whether this context runs in one of this object's jobs (a sub-agent's run, in
        a framework's run hook, opens none of its own)."""
        found = _JOB.get()
        return found is not None and found[0] is self and self._bridge.job(found[1]) is not None

    # -- sessions: one per agent (and per tool call that runs a sub-agent) --------------

    def _session_key(self, agent: str) -> Hashable | None:
        """The key of the session of ``agent`` in this context's job, opened if needed;
        None outside this runtime's ``agents.job``."""
        found = _JOB.get()
        if found is None or found[0] is not self:
            return None
        job_key = found[1]
        tool = _TOOL.get()
        key = (job_key, agent, None if tool is None else tool[0])
        if self._bridge.session(key) is not None:
            return key
        parent = None if tool is None else self._bridge.session(tool[1])
        if parent is not None and parent.name == agent:
            return tool[1] if tool is not None else None  # the agent's own tool calls it
        if self._bridge.start_session(key, job_key, agent, parent=parent) is None:
            return None  # the job has ended
        if tool is not None:
            self._children.setdefault(tool[0], []).append(key)
        return key

    def session(self, agent: str) -> Session | None:
        """The session of ``agent`` in this context's job (opened if needed), or None
        outside ``agents.job``: for ``expect_idle`` and the like."""
        key = self._session_key(agent)
        return None if key is None else self._bridge.session(key)

    # -- clients -----------------------------------------------------------------------

    def http_client(self, agent: str) -> httpx.AsyncClient:
        """An async HTTP client whose requests go through agentrt (``rt.http_client()``),
        each a turn of ``agent``'s session in the job of the context that sends it."""
        rt = self.rt
        rt._check_open()
        lib = rt._lib
        transport = lib.derive(_AgentTransport)(self, agent, rt._http_transport())
        return lib.mod.AsyncClient(transport=transport, timeout=rt._timeout)  # type: ignore[no-any-return]

    def openai(self, agent: str, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` (as ``rt.openai(**kwargs)``) whose calls are turns of
        ``agent``'s session in the job of the context that makes them."""
        rt = self.rt
        rt._check_open()
        kwargs = client_kwargs(rt._core, kwargs)
        client = AgentOpenAI(http_client=self.http_client(agent), **kwargs)  # type: ignore[arg-type,unused-ignore]
        give_platform(client, rt._platform)
        return client

    def client_kwargs(self, agent: str, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments of an ``openai.AsyncOpenAI`` like :meth:`openai`'s
        (``base_url``, ``api_key``, ``max_retries=0``, ``http_client``), for a framework
        that builds its own client from them (AutoGen's ``OpenAIChatCompletionClient``)."""
        self.rt._check_open()
        return dict(client_kwargs(self.rt._core, kwargs), http_client=self.http_client(agent))

    # -- tools -------------------------------------------------------------------------

    @overload
    def tool(
        self, agent: str, fn: Callable[_P, Awaitable[_R]], *, name: str = ""
    ) -> Callable[_P, Awaitable[_R]]: ...
    @overload
    def tool(
        self, agent: str, fn: Callable[_P, _R], *, name: str = ""
    ) -> Callable[_P, Awaitable[_R]]: ...
    def tool(
        self, agent: str, fn: Callable[_P, Awaitable[_R]] | Callable[_P, _R], *, name: str = ""
    ) -> Callable[_P, Awaitable[_R]]:
        """``fn`` as an async tool of ``agent``: each call is a tool wait named ``name``
        (default: the function's name; given, it renames the wrapper, which frameworks
        name the tool after) in the agent's session, ``ok``, or ``error`` /
        ``cancelled`` as the call ends. A synchronous ``fn`` runs in a worker thread.
        The wrapper keeps ``fn``'s name, docstring and signature, which frameworks read
        to describe the tool to the model."""
        tool_name = name or getattr(fn, "__name__", "tool")
        is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn)  # an object whose __call__ is async
            and inspect.iscoroutinefunction(type(fn).__call__)
        )

        async def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            if is_async:
                return await fn(*args, **kwargs)  # type: ignore[no-any-return,misc]
            call: Callable[[], _R] = functools.partial(fn, *args, **kwargs)  # type: ignore[assignment]
            return await anyio.to_thread.run_sync(call)

        @functools.wraps(fn)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            opened = self._start_tool(agent, tool_name)
            if opened is None:
                return await run(*args, **kwargs)
            try:
                result = await run(*args, **kwargs)
            except BaseException as exc:
                self._end_tool(opened, exc)
                raise
            self._end_tool(opened)
            return result

        if name:  # frameworks name the tool after the function
            wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper

    def _start_tool(self, agent: str, name: str) -> _OpenTool | None:
        """Begin a tool wait named ``name`` in ``agent``'s session and make it this
        context's (a sub-agent run from here is its child): for a framework's tool-start
        hook. None outside this object's jobs. :meth:`_end_tool` ends it."""
        session_key = self._session_key(agent)
        if session_key is None:
            return None
        key = ("tool", next(self._keys))
        self._bridge.start_tool(key, session_key, name)
        return _OpenTool(key, _TOOL.set((key, session_key)))

    def _end_tool(self, opened: _OpenTool, exc: BaseException | None = None) -> None:
        """End a tool wait of :meth:`_start_tool`: ``ok``, or ``error`` / ``cancelled``
        for the exception that ended the tool. The sessions of sub-agents run in it end
        with it."""
        _reset(_TOOL, opened.token)
        for child in self._children.pop(opened.key, ()):
            self._bridge.end_session(child)
        if exc is None:
            self._bridge.end_tool(opened.key)
        else:
            cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
            status: CallStatus = "cancelled" if cancelled else "error"
            self._bridge.end_tool(opened.key, status, type(exc).__name__)


@dataclass(slots=True, eq=False)
class _OpenJob:
    key: Hashable
    job: Job
    token: contextvars.Token[tuple[Agents, Hashable] | None]
    job_token: contextvars.Token[Job | None]


@dataclass(slots=True, eq=False)
class _OpenTool:
    key: Hashable
    token: contextvars.Token[tuple[Hashable, Hashable] | None]


def _reset(var: contextvars.ContextVar[Any], token: contextvars.Token[Any]) -> None:
    """Undo ``var.set``; in another context (a hook that ends elsewhere) there is
    nothing to undo here."""
    try:
        var.reset(token)
    except (ValueError, RuntimeError):
        pass


class _AgentTransport:
    """The runtime's transport, each request bound to an agent's session first."""

    _lib: Any
    _bases = ("AsyncBaseTransport",)

    def __init__(self, agents: Agents, agent: str, inner: httpx.AsyncBaseTransport) -> None:
        self._agents = agents
        self._agent = agent
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = self._agents._session_key(self._agent)
        session = None if key is None else self._agents._bridge.session(key)
        if session is None:
            return await self._inner.handle_async_request(request)
        binding = bind(session)
        try:
            return await self._inner.handle_async_request(request)
        finally:
            unbind(binding)

    async def aclose(self) -> None:
        return None  # the runtime's transport outlives its clients
