"""The adapter protocol: how a framework's runs, agents, model requests and tool calls
become agentrt's jobs, sessions, turns and tool waits. Its public names are exported
from :mod:`agentrt.integrations`; every adapter there is built on them alone, and so can
an adapter written outside the project (docs/integrations.md, "Write an adapter").

agentrt's units are blocks (``async with rt.job(...)``, ``job.session(...)``,
``session.tool(...)``) bound to contextvars. A framework's callbacks instead say "X
started" and later "X ended". Two classes map one onto the other, with the blocks'
semantics (the same reports, terminal statuses and events):

- :class:`Bridge` keeps the open units by the framework's own keys (a run id, a span
  id), for frameworks whose callbacks name what they start and end (LangChain,
  LlamaIndex, the OpenAI Agents SDK);
- :class:`Agents`, built on a Bridge, finds them by agent name in the current context,
  for frameworks whose hooks wrap a run, a model request and a tool call in the task
  that runs them (PydanticAI, Strands, Google ADK, AG2), and for frameworks with no
  hooks at all (Agno, AutoGen: its clients and wrapped tools do the work).

:func:`bind` makes the calls made next in this context turns of a session (the transport
looks for it there): an adapter binds an agent's session around each model request.

Every method is synchronous and cheap and must run in the runtime's event-loop thread
(where a framework's callbacks run for async code; :meth:`Bridge.call_in_loop` gets
there from elsewhere). Every job started here ends with a terminal status: ``ok``, or
``error`` / ``cancelled`` for the exception that ended its work; ending a job ends what
is still open in it.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import httpx
import sniffio

from .._clients import AgentOpenAI, client_kwargs
from .._context import _CALL_SESSION, _CURRENT_JOB, Job, Session
from .._errors import WRONG_LOOP_MESSAGE, AgentrtError, WrongLoopError, only_cancelled
from .._platform import give_platform
from .._runtime import Runtime
from .._sync import SyncRuntime
from .._turns import ToolWait
from ..telemetry._report import CallStatus, JobReport

if TYPE_CHECKING:
    import openai

__all__ = ["Agents", "Binding", "Bridge", "OpenJob", "OpenTool", "bind", "unbind"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")

Binding = contextvars.Token[Session | None]
"""What :func:`bind` returns; :func:`unbind` takes it back."""


def bind(session: Session | None) -> Binding:
    """Make the calls made next in this context (this task, and tasks it starts from now
    on) turns of ``session``, as inside ``session.chat`` or ``job.session``'s block: an
    adapter binds an agent's session around its model request. It takes precedence over
    an enclosing ``job.session`` block. None undoes an enclosing binding until
    :func:`unbind`: the calls go where they would without it."""
    return _CALL_SESSION.set(session)


def unbind(binding: Binding) -> None:
    """Undo :func:`bind`. In a context other than the one bound (a callback that ended
    elsewhere) there is nothing to undo here: that context ends with its task."""
    try:
        _CALL_SESSION.reset(binding)
    except ValueError:
        pass


def _outcome(exc: BaseException | None) -> tuple[CallStatus, str | None]:
    """A tool wait's status for the exception that ended it, as ``session.tool``'s block
    records it: ``ok``; ``cancelled`` for the loop's cancellation (alone or in a group);
    else ``error`` and the exception's type."""
    if exc is None:
        return "ok", None
    try:
        cancelled = only_cancelled(exc)
    except sniffio.AsyncLibraryNotFoundError:  # a callback after a SyncRuntime's loop ended
        cancelled = not isinstance(exc, Exception)
    return ("cancelled", None) if cancelled else ("error", type(exc).__name__)


@dataclass(slots=True, eq=False)
class _BridgeJob:
    job: Job
    sessions: dict[Hashable, Session] = field(default_factory=dict)
    tools: dict[Hashable, tuple[Session, ToolWait]] = field(default_factory=dict)
    thread: str | None = None
    """The conversation the job continues (a LangGraph ``thread_id``, an Agents SDK
    ``group_id``): its sessions get ids derived from it (:func:`thread_session_id`)."""
    names: Counter[str | None] = field(default_factory=Counter)
    """Sessions opened so far, by name (the n-th of a name gets its own id)."""


def thread_session_id(thread: str, name: str | None, n: int) -> str:
    """The id of the ``n``-th session named ``name`` in a job of conversation ``thread``:
    the same in every run of the thread and in every process, so that a later run,
    wherever it runs, is routed to the replica holding the thread's KV (a caller-given
    id is placed by hashing it: docs/routing.md, "Fleets")."""
    key = f"{thread}\x00{name or ''}\x00{n}".encode("utf-8", "surrogatepass")
    return "thr-" + hashlib.blake2b(key, digest_size=12).hexdigest()


class Bridge:
    """A runtime's jobs, sessions and tool waits, opened and ended by a framework's
    callbacks and kept by the framework's keys (any hashable ids).

    ``rt`` is a :class:`~agentrt.Runtime`, or a :class:`~agentrt.SyncRuntime` for a
    framework whose callbacks run in the caller's thread (:meth:`call_in_loop` takes
    them to the runtime's loop). A key names one unit for as long as it is open; ending
    a job ends what is still open in it (tool waits, then sessions), so every job gets
    a terminal status.
    """

    def __init__(self, rt: Runtime | SyncRuntime) -> None:
        if not isinstance(rt, Runtime | SyncRuntime):
            raise TypeError(f"expected an agentrt.Runtime or SyncRuntime, got {type(rt).__name__}")
        self._srt = rt if isinstance(rt, SyncRuntime) else None
        self.rt: Runtime = rt.runtime if isinstance(rt, SyncRuntime) else rt
        """The async runtime (a SyncRuntime's, underneath)."""
        self._jobs: dict[Hashable, _BridgeJob] = {}
        self._job_of: dict[Hashable, Hashable] = {}
        """The job key of each open session and tool wait."""
        self._loop_thread: int | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        if self._srt is None:
            self._capture()

    def __repr__(self) -> str:
        return f"<Bridge of {self.rt!r}: {len(self._jobs)} open jobs>"

    @property
    def active(self) -> bool:
        """Whether a job can start here and now: the runtime is open and this is its
        event loop's thread (a callback of a framework's synchronous run, which runs in a
        loop of its own, is not: its calls are implicit one-call jobs)."""
        rt = self.rt
        return rt._opened and not rt._closed and threading.get_ident() == rt._core.loop_thread

    # -- the runtime: its loop and its clients' settings -----------------------------

    def _capture(self) -> bool:
        try:
            self._token = anyio.lowlevel.current_token()
        except RuntimeError:
            return False
        self._loop_thread = threading.get_ident()
        return True

    def call_in_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` run in the runtime's event-loop thread, from wherever a framework
        calls back: directly in that thread; through a SyncRuntime's loop from a caller's
        thread; from a worker thread of an async runtime's loop (seen once in that loop).
        Once a SyncRuntime has closed it runs ``fn`` here (a closed runtime's bridge
        starts no job)."""
        srt = self._srt
        if srt is not None:
            if srt._closed:  # its loop is gone: nothing runs concurrently any more
                return fn(*args)
            return srt._call(fn, *args)  # type: ignore[no-any-return]
        if threading.get_ident() == self._loop_thread or (
            self._loop_thread is None and self._capture()
        ):
            return fn(*args)
        if self._token is None:
            raise AgentrtError(
                "an agentrt adapter of an async Runtime was called outside its event loop "
                "before any call inside it; run the framework's async API, or use a SyncRuntime"
            )
        return anyio.from_thread.run_sync(fn, *args, token=self._token)

    def client_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments of an OpenAI client on this runtime, for a framework
        that builds its own from them: ``base_url`` (the runtime's first endpoint; agentrt
        routes among all), ``api_key`` (the runtime's, else ``OPENAI_API_KEY``, else a
        placeholder never sent) and ``max_retries=0`` (agentrt retries), with ``kwargs``
        over them. Pass ``rt.http_client()`` (or the SyncRuntime's) as its HTTP client.
        Raises if the runtime is closed, a retry count other than 0 or an
        ``http_client`` is given."""
        self.rt._check_open()
        return client_kwargs(self.rt._core, kwargs)

    # -- jobs --------------------------------------------------------------------------

    def start_job(
        self,
        key: Hashable,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread: str | None = None,
    ) -> Job | None:
        """Start a job (``rt.job(name)`` without a block); None unless :attr:`active`.
        ``thread``: the conversation it continues, whose sessions keep their ids from
        run to run (docs/integrations.md, "Conversations that resume on another
        worker"). It takes no deadline: no block encloses its work to cancel."""
        if not self.active:
            return None
        if key in self._jobs:
            raise ValueError(f"a job with key {key!r} is already open")
        job = self.rt._open_job(name, job_id=job_id, program_id=program_id, metadata=metadata)
        self._jobs[key] = _BridgeJob(job, thread=thread or None)
        return job

    def job(self, key: Hashable) -> Job | None:
        """The open job with this key."""
        state = self._jobs.get(key)
        return None if state is None else state.job

    def end_job(self, key: Hashable, exc: BaseException | None = None) -> JobReport | None:
        """End the job: ``ok``, or ``cancelled`` / ``error`` for the exception that ended
        its work (as ``rt.job``'s block reports it), and return its report. Tool waits
        and sessions still open in it end first (a tool wait as ``error`` for an error,
        else ``cancelled``). None if no job with this key is open."""
        state = self._jobs.pop(key, None)
        if state is None:
            return None
        status, error_type = _outcome(exc)
        if status == "ok":
            status = "cancelled"  # the job's end cut the wait short
        for tool_key, (session, wait) in state.tools.items():
            self._job_of.pop(tool_key, None)
            session._end_tool(wait, status, error_type)
        for session_key, session in state.sessions.items():
            self._job_of.pop(session_key, None)
            session._close()
        return self.rt._close_job(state.job, exc)

    # -- sessions ----------------------------------------------------------------------

    def start_session(
        self,
        key: Hashable,
        job_key: Hashable,
        name: str | None,
        *,
        parent: Session | str | None = None,
    ) -> Session | None:
        """Open a session in the job ``job_key`` (``job.session(name, parent=...)``
        without a block): ``parent`` is the session (or its id) that spawned it, a
        sub-agent's caller. None if that job is not open."""
        state = self._jobs.get(job_key)
        if state is None:
            return None
        if key in self._job_of:
            raise ValueError(f"a session or tool wait with key {key!r} is already open")
        session_id = None
        if state.thread is not None:
            n = state.names[name]
            state.names[name] = n + 1
            session_id = thread_session_id(state.thread, name, n)
        session = state.job._open_session(name, session_id, parent)
        state.sessions[key] = session
        self._job_of[key] = job_key
        return session

    def session(self, key: Hashable) -> Session | None:
        """The open session with this key."""
        job_key = self._job_of.get(key)
        state = None if job_key is None else self._jobs.get(job_key)
        return None if state is None else state.sessions.get(key)

    def end_session(self, key: Hashable) -> None:
        """End the session (as leaving its block does)."""
        job_key = self._job_of.get(key)
        state = None if job_key is None else self._jobs.get(job_key)
        if state is None or key not in state.sessions:
            return
        del self._job_of[key]
        state.sessions.pop(key)._close()

    # -- tool waits --------------------------------------------------------------------

    def start_tool(
        self,
        key: Hashable,
        session_key: Hashable,
        name: str,
        *,
        expected_s: float | None = None,
    ) -> None:
        """Begin a tool wait in the open session ``session_key`` (``session.tool(name,
        expected_s=...)`` without a block): the session is idle until :meth:`end_tool`;
        ``expected_s``, if given, is how long it is expected to be (else the tool's
        learned typical wait). Nothing if that session is not open."""
        job_key = self._job_of.get(session_key)
        state = None if job_key is None else self._jobs.get(job_key)
        if state is None or session_key not in state.sessions:
            return
        if key in self._job_of:
            raise ValueError(f"a session or tool wait with key {key!r} is already open")
        session = state.sessions[session_key]
        wait = session._start_tool(name, expected_s)
        state.tools[key] = (session, wait)
        self._job_of[key] = job_key
        notices = session.job._core.notices
        if wait.notice is not None and notices is not None:
            # No block holds this wait: the runtime's task group carries the notice.
            notices.spawn(wait.notice)

    def end_tool(
        self,
        key: Hashable,
        exc: BaseException | None = None,
        *,
        status: CallStatus | None = None,
    ) -> None:
        """End the tool wait: ``ok``, or ``error`` (naming the exception's type) /
        ``cancelled`` for the exception that ended the tool. ``status`` overrides it,
        for a framework that reports a failure without its exception."""
        job_key = self._job_of.pop(key, None)
        state = None if job_key is None else self._jobs.get(job_key)
        if state is None or key not in state.tools:
            return
        found, error_type = _outcome(exc)
        session, wait = state.tools.pop(key)
        session._end_tool(wait, status or found, error_type)


# -- agents: units found by agent name in the current context ----------------------------

_JOB: contextvars.ContextVar[tuple[Agents, Hashable] | None] = contextvars.ContextVar(
    "agentrt_agents_job", default=None
)
"""The job of :class:`Agents` this context runs in: its Agents and the job's key."""
_TOOL: contextvars.ContextVar[tuple[Hashable, Hashable] | None] = contextvars.ContextVar(
    "agentrt_agents_tool", default=None
)
"""The tool wait this context runs in: its key and its session's key."""

_SHARED: weakref.WeakKeyDictionary[Runtime, Agents] = weakref.WeakKeyDictionary()


@dataclass(slots=True, eq=False)
class OpenJob:
    """A job started by :meth:`Agents.start_job`; :meth:`Agents.end_job` ends it."""

    key: Hashable
    job: Job
    _token: contextvars.Token[tuple[Agents, Hashable] | None]
    _job_token: contextvars.Token[Job | None]


@dataclass(slots=True, eq=False)
class OpenTool:
    """A tool wait begun by :meth:`Agents.start_tool`; :meth:`Agents.end_tool` ends it."""

    key: Hashable
    _token: contextvars.Token[tuple[Hashable, Hashable] | None]


class Agents:
    """A runtime's jobs, one session per agent (by name) in each, and the agents' tool
    waits, found in the current context: for a framework whose hooks wrap a run, a model
    request and a tool call in the task that runs them, or one that takes an OpenAI (or
    HTTP) client and plain functions as tools.

    - :meth:`job` (a block) or :meth:`start_job` / :meth:`end_job` (a run hook): a job,
      this context's;
    - :meth:`session` (bound around a model request with :func:`bind`), or the calls
      of :meth:`openai` / :meth:`http_client`: turns of the job's session named after
      the agent, opened by its first use;
    - :meth:`tool` (a wrapper) or :meth:`start_tool` / :meth:`end_tool` (a tool hook):
      a tool wait in that session. An agent whose session is first used *inside* a tool
      wait is a sub-agent: it gets a session of its own for that tool call, whose parent
      is the waiting agent's session, ended with the wait.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._bridge = Bridge(rt)
        self._keys = itertools.count()
        self._children: dict[Hashable, list[Hashable]] = {}
        """The sub-agents' sessions opened inside each open tool wait."""

    def __repr__(self) -> str:
        return f"<Agents of {self.rt!r}>"

    @classmethod
    def shared(cls, rt: Runtime) -> Agents:
        """The one Agents of ``rt`` that adapters' hook objects share: an agent run inside
        another's run, whatever hook object it was given, then joins that run's job."""
        agents = _SHARED.get(rt)
        if agents is None:
            agents = _SHARED[rt] = cls(rt)
        return agents

    @property
    def active(self) -> bool:
        """Whether a job can start here and now (:attr:`Bridge.active`)."""
        return self._bridge.active

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
        opened = self.start_job(
            name, job_id=job_id, program_id=program_id, metadata=metadata, thread=thread
        )
        if opened is None:  # open, so: another thread's loop
            raise WrongLoopError(WRONG_LOOP_MESSAGE)
        raised: BaseException | None = None
        try:
            yield opened.job
        except BaseException as exc:
            raised = exc
            raise
        finally:
            self.end_job(opened, raised)

    def start_job(
        self,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread: str | None = None,
    ) -> OpenJob | None:
        """Start a job and make it this context's (for a framework's run-start hook):
        the arguments of :meth:`job`. None unless :attr:`active`. :meth:`end_job` ends
        it; a hook that runs inside a job already (a sub-agent's run: :meth:`in_job`)
        starts none."""
        key = ("job", next(self._keys))
        job = self._bridge.start_job(
            key, name, job_id=job_id, program_id=program_id, metadata=metadata, thread=thread
        )
        if job is None:
            return None
        # other clients' calls: the job's default session
        return OpenJob(key, job, _JOB.set((self, key)), _CURRENT_JOB.set(job))

    def end_job(self, opened: OpenJob, exc: BaseException | None = None) -> JobReport | None:
        """End a job of :meth:`start_job`: ``ok``, or ``error`` / ``cancelled`` for the
        exception that ended its work (what is still open in it ends first); its report."""
        _reset(_CURRENT_JOB, opened._job_token)
        _reset(_JOB, opened._token)
        return self._bridge.end_job(opened.key, exc)

    def in_job(self) -> bool:
        """Whether this context runs in one of this object's jobs (a sub-agent's run, in
        a framework's run hook, opens none of its own)."""
        found = _JOB.get()
        return found is not None and found[0] is self and self._bridge.job(found[1]) is not None

    # -- sessions: one per agent (and per tool call that runs a sub-agent) --------------

    def _session_key(self, agent: str) -> Hashable | None:
        """The key of the session of ``agent`` in this context's job, opened if needed;
        None outside this object's jobs."""
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
        outside this object's jobs: :func:`bind` it around the agent's model request."""
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
        kwargs = self._bridge.client_kwargs(**kwargs)
        client = AgentOpenAI(http_client=self.http_client(agent), **kwargs)  # type: ignore[arg-type,unused-ignore]
        give_platform(client, self.rt._platform)
        return client

    def client_kwargs(self, agent: str, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments of an ``openai.AsyncOpenAI`` like :meth:`openai`'s
        (``base_url``, ``api_key``, ``max_retries=0``, ``http_client``), for a framework
        that builds its own client from them (AutoGen's ``OpenAIChatCompletionClient``)."""
        return dict(self._bridge.client_kwargs(**kwargs), http_client=self.http_client(agent))

    # -- tools -------------------------------------------------------------------------

    @overload
    def tool(
        self,
        agent: str,
        fn: Callable[_P, Awaitable[_R]],
        *,
        name: str = "",
        expected_s: float | None = None,
    ) -> Callable[_P, Awaitable[_R]]: ...
    @overload
    def tool(
        self, agent: str, fn: Callable[_P, _R], *, name: str = "", expected_s: float | None = None
    ) -> Callable[_P, Awaitable[_R]]: ...
    def tool(
        self,
        agent: str,
        fn: Callable[_P, Awaitable[_R]] | Callable[_P, _R],
        *,
        name: str = "",
        expected_s: float | None = None,
    ) -> Callable[_P, Awaitable[_R]]:
        """``fn`` as an async tool of ``agent``: each call is a tool wait named ``name``
        (default: the function's name; given, it renames the wrapper, which frameworks
        name the tool after) in the agent's session, ``ok``, or ``error`` /
        ``cancelled`` as the call ends; ``expected_s`` as in :meth:`start_tool`. A
        synchronous ``fn`` runs in a worker thread. The wrapper keeps ``fn``'s name,
        docstring and signature, which frameworks read to describe the tool to the
        model."""
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
            opened = self.start_tool(agent, tool_name, expected_s=expected_s)
            if opened is None:
                return await run(*args, **kwargs)
            try:
                result = await run(*args, **kwargs)
            except BaseException as exc:
                self.end_tool(opened, exc)
                raise
            self.end_tool(opened)
            return result

        if name:  # frameworks name the tool after the function
            wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper

    def start_tool(
        self, agent: str, name: str, *, expected_s: float | None = None
    ) -> OpenTool | None:
        """Begin a tool wait named ``name`` in ``agent``'s session and make it this
        context's (a sub-agent run from here is its child): for a framework's tool-start
        hook. ``expected_s``: how long it is expected to last (else the tool's learned
        typical wait). None outside this object's jobs. :meth:`end_tool` ends it."""
        session_key = self._session_key(agent)
        if session_key is None:
            return None
        key = ("tool", next(self._keys))
        self._bridge.start_tool(key, session_key, name, expected_s=expected_s)
        return OpenTool(key, _TOOL.set((key, session_key)))

    def end_tool(self, opened: OpenTool, exc: BaseException | None = None) -> None:
        """End a tool wait of :meth:`start_tool`: ``ok``, or ``error`` / ``cancelled``
        for the exception that ended the tool. The sessions of sub-agents run in it end
        with it."""
        _reset(_TOOL, opened._token)
        for child in self._children.pop(opened.key, ()):
            self._bridge.end_session(child)
        self._bridge.end_tool(opened.key, exc)


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
        session = self._agents.session(self._agent)
        if session is None:
            return await self._inner.handle_async_request(request)
        binding = bind(session)
        try:
            return await self._inner.handle_async_request(request)
        finally:
            unbind(binding)

    async def aclose(self) -> None:
        return None  # the runtime's transport outlives its clients
