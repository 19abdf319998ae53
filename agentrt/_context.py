"""Jobs, sessions and tool waits, and the contextvars that carry them to the transport.

A :class:`Job` is one unit of user-visible work; its completion time (JCT) runs from
entering ``rt.job(...)`` to leaving it. A :class:`Session` is one conversation whose turns
share a KV prefix. A tool wait (``session.tool(...)``) is an idle gap in a session.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import anyio

from ._blocks import async_block
from ._checks import check_expected, check_metadata, check_name
from ._errors import JobClosedError, SessionClosedError, only_cancelled, raise_own_error
from ._ids import new_id
from ._protocol import validate_id, validate_nonneg
from ._turns import NextTurn, ToolWait, TurnStart
from .scheduling._placement import Placement
from .telemetry._events import (
    JobEnded,
    JobStarted,
    SessionClosed,
    SessionOpened,
)
from .telemetry._report import (
    CallStatus,
    JobReport,
    JobStatus,
    SessionReport,
    ToolReport,
    _CallState,
    job_report,
    settle_calls,
)

if TYPE_CHECKING:
    from typing import Unpack

    from openai import AsyncStream
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from ._state import _Core, _Program
    from ._types import ChatArgs, CompleteArgs

__all__ = ["Job", "Session"]

# The session whose call is being made right now (set by Session.chat around one call),
# and the session whose ``async with`` block we are in (for rt.openai() clients).
_CALL_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "agentrt_call_session", default=None
)
_CURRENT_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "agentrt_current_session", default=None
)
# The job whose block we are in (its calls outside any session join its default session).
_CURRENT_JOB: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "agentrt_current_job", default=None
)

DEFAULT_SESSION = "default"
"""The name of a job's default session: the calls made in the job's block outside any
session (through ``rt.openai()``, ``rt.http_client()``, a framework's model)."""


def current_session() -> Session | None:
    """The session a call made now belongs to, if any."""
    return _CALL_SESSION.get() or _CURRENT_SESSION.get()


def call_session(core: _Core) -> Session | None:
    """The session of a call made now through ``core``'s transport: the session whose
    call or block this is, else the default session of the job of ``core`` whose block
    this is (opened by its first such call), else None (a one-call job of its own)."""
    session = _CALL_SESSION.get() or _CURRENT_SESSION.get()
    if session is None:
        job = _CURRENT_JOB.get()
        if job is not None and job._core is core and not job._closed:
            return job._default_session()
    return session


class _OpenStream(Protocol):
    """A streamed reply of one of a job's calls, not closed yet (the transport's
    ``_stream.ObservedStream``), as the job settles it when the caller left it unread."""

    _session: Session

    def _abandon(self, why: str) -> None:
        """End its call as ``cancelled`` (``why``) if it has not ended (its room in the
        admission gate freed, ``CallEnded`` emitted)."""

    async def _shut(self) -> None:
        """Close its connection (and stop counting it as open)."""


_SHUT_S = 1.0
"""How long closing the connections of streams left unread may take when their block
ends (closing a socket takes microseconds; a bound all the same, as it is shielded)."""


class Session:
    """One conversation in a job. Its calls share a KV prefix and are tagged as one.

    Obtained from ``job.session(...)``; usable until its ``async with`` block ends.
    """

    def __init__(
        self,
        job: Job,
        name: str | None,
        session_id: str,
        parent: Session | str | None,
        blocks_parent: bool | None = None,
        *,
        stable: bool = False,
    ) -> None:
        self.job = job
        self.name = name
        self.id = session_id
        self.placement = Placement(session_id, stable)
        """Where its calls go (its replica, its last reply): the router side's."""
        self.root_id: str | None
        """The session at the root of this session's tree of sub-agents (None: this one)."""
        if isinstance(parent, Session):
            self.parent_id: str | None = parent.id
            self.root_id = parent.root_id or parent.id
        else:
            self.parent_id = self.root_id = parent
        self.blocks_parent = blocks_parent
        """Whether the parent waits for this sub-agent's result (None: not said)."""
        self._closed = False
        self._tool_depth = 0
        self._next = NextTurn()
        self.echo: dict[str, str] = {}
        """Response headers the dialect asked to echo back on later calls."""

    def __repr__(self) -> str:
        return f"<Session id={self.id!r} name={self.name!r} job={self.job.id!r}>"

    @property
    def endpoint_index(self) -> int | None:
        """The endpoint this session's KV lives on, as the router last chose it."""
        return self.placement.home

    @endpoint_index.setter
    def endpoint_index(self, index: int | None) -> None:
        self.placement.home = index

    @property
    def turns(self) -> int:
        """Calls made in this session so far."""
        return self._next.turns

    @property
    def idle(self) -> bool:
        """True while the session is inside a tool wait."""
        return self._tool_depth > 0

    def _check_usable(self) -> None:
        if self.job._closed:
            raise JobClosedError(
                f"session {self.id!r} was used after its job {self.job.id!r} ended"
            )
        if self._closed:
            raise SessionClosedError(f"session {self.id!r} was used after its block ended")

    def expect_idle(self, seconds: float | None) -> None:
        """Declare the idle time expected after the session's next reply (a tool wait).

        It travels with the next call as ``idle_expected_s``, so a server can decide at
        completion whether to keep, offload or drop the session's KV. Without it, a
        runtime that learns waits sends its estimate for the tools the session ran last.
        """
        self._next.expect_idle = check_expected(seconds, "expected idle seconds")

    def expect_final(self) -> None:
        """Declare the session's next call its last: no turn follows its reply.

        It travels with that call (``final`` in docs/protocol.md), so that servers can
        end the session there: vllm-router ends the program (``expected_resume: false``),
        Dynamo reads ``X-Dynamo-Session-Final``. ``chat(..., final=True)`` says the same.
        A later call is still allowed (it is tagged as a new turn).
        """
        self._next.final = True

    @overload
    async def chat(
        self,
        *,
        stream: Literal[False] | None = ...,
        final: bool = ...,
        **kwargs: Unpack[ChatArgs],
    ) -> ChatCompletion: ...
    @overload
    async def chat(
        self, *, stream: Literal[True], final: bool = ..., **kwargs: Unpack[ChatArgs]
    ) -> AsyncStream[ChatCompletionChunk]: ...
    @overload
    async def chat(
        self, *, stream: bool, final: bool = ..., **kwargs: Unpack[ChatArgs]
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]: ...
    async def chat(
        self, *, final: bool = False, **kwargs: Any
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """``chat.completions.create`` through agentrt, tagged as this session's next turn.

        Takes the keyword arguments of ``openai.AsyncOpenAI().chat.completions.create``
        (typed as the installed openai types them). It returns a ``ChatCompletion``, or
        with ``stream=True`` the openai ``AsyncStream`` of chunks; the call's tokens are
        counted in the job's report either way. ``final=True`` marks the session's last
        call (see :meth:`expect_final`).
        """
        result: ChatCompletion | AsyncStream[ChatCompletionChunk]
        create = self.job._core.client.chat.completions.create
        result = await self._call(create, kwargs, final)
        return result

    @overload
    async def complete(
        self,
        *,
        stream: Literal[False] | None = ...,
        final: bool = ...,
        **kwargs: Unpack[CompleteArgs],
    ) -> Completion: ...
    @overload
    async def complete(
        self, *, stream: Literal[True], final: bool = ..., **kwargs: Unpack[CompleteArgs]
    ) -> AsyncStream[Completion]: ...
    @overload
    async def complete(
        self, *, stream: bool, final: bool = ..., **kwargs: Unpack[CompleteArgs]
    ) -> Completion | AsyncStream[Completion]: ...
    async def complete(
        self, *, final: bool = False, **kwargs: Any
    ) -> Completion | AsyncStream[Completion]:
        """``completions.create`` (the legacy text API) through agentrt; typed and
        returning as :meth:`chat` does."""
        result: Completion | AsyncStream[Completion]
        result = await self._call(self.job._core.client.completions.create, kwargs, final)
        return result

    async def _call(self, create: Any, kwargs: dict[str, Any], final: bool = False) -> Any:
        """One openai call made as this session's turn (the transport finds it here)."""
        self._check_usable()
        if final.__class__ is not bool:
            raise TypeError(f"final must be a bool, got {type(final).__name__}")
        if final:
            self._next.final = True
        token = _CALL_SESSION.set(self)
        try:
            return await create(**kwargs)
        except Exception as exc:
            raise_own_error(exc)
            raise
        finally:
            _CALL_SESSION.reset(token)

    @async_block("s.tool(...)")
    async def tool(self, name: str, *, expected_s: float | None = None) -> AsyncIterator[None]:
        """Mark a tool's execution: the session is idle inside this block.

        The wait is recorded in the job's report; ``expected_s`` (if given) and the
        measured idle travel with the session's next call. Without ``expected_s``, the
        wait is expected to last the tool's learned typical wait (when the runtime has
        seen the tool before); the report says which expectation was used.
        """
        with self._tool_wait(name, expected_s) as wait:
            if wait.notice is None:
                yield
                return
            # The notice runs beside the tool, in a task group of this block only: it
            # never delays the tool, and one still in flight when the wait ends is moot
            # (cancelled, counted as failed). The tool's own error leaves the group first
            # and is raised as it is, not wrapped in an exception group.
            error: Exception | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait.notice)
                try:
                    yield
                except Exception as exc:
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
            if error is not None:
                raise error

    @contextmanager
    def _tool_wait(self, name: str, expected_s: float | None) -> Iterator[ToolWait]:
        wait = self._start_tool(name, expected_s)
        status: CallStatus = "ok"
        error_type: str | None = None
        try:
            yield wait
        except BaseException as exc:
            if only_cancelled(exc):  # trio's may come in a group (a nursery in the tool)
                status = "cancelled"
            else:
                status = "error"
                error_type = type(exc).__name__
            raise
        finally:
            self._end_tool(wait, status, error_type)

    # -- tool waits and the session's end without a block (framework adapters whose
    # callbacks start and end them: agentrt.integrations._bridge) --------------------------

    def _start_tool(self, name: str, expected_s: float | None) -> ToolWait:
        """Begin a tool wait; end it with :meth:`_end_tool` (what ``tool()`` does)."""
        check_name(name, "tool name")
        if not name:
            raise ValueError("tool name must not be empty")
        expected = check_expected(expected_s, "expected_s")
        self._check_usable()
        now = anyio.current_time()
        core = self.job._core
        source: Literal["declared", "learned"] | None = None
        self._next.tool_started(name, expected)
        if expected is not None:
            source = "declared"
        elif core.waits is not None:
            expected = core.waits.estimate(name)
            if expected is not None:
                source = "learned"
        self._tool_depth += 1
        wait = ToolWait(self.job._tool_seq, name, now, expected, source)
        self.job._tool_seq += 1
        # Policies hear of it; the notice, if any, is posted by the caller (tool()'s block,
        # or the runtime's task group for a framework adapter's wait).
        wait.notice = core.tool_started(
            self.job.id, self.id, self.endpoint_index, name, expected, source
        )
        if core.hooks:
            core.emit(wait.started(self.job.id, self.id))
        return wait

    def _end_tool(self, wait: ToolWait, status: CallStatus, error_type: str | None) -> None:
        """End a tool wait begun by :meth:`_start_tool` (a second call does nothing)."""
        if wait.ended:
            return
        wait.ended = True
        self._tool_depth -= 1
        end = anyio.current_time()
        duration = end - wait.start
        core = self.job._core
        if status != "cancelled":  # a cancelled wait is cut short
            if core.waits is not None:
                core.waits.observe(wait.name, duration)
            core.tool_ended(self.job.id, self.id, duration)
        self.job._tools.append(wait.report(self.id, self.job._t0, end, status))
        if core.hooks:
            core.emit(wait.ended_event(self.job.id, self.id, end, status, error_type))

    def _close(self) -> None:
        """End the session (what leaving ``job.session(...)``'s block does); idempotent.
        The calls of its streams left unread end ``cancelled`` (their connections are
        closed by :meth:`Job._shut_streams`)."""
        if self._closed:
            return
        self._unpin()
        if self.job._streams:
            self.job._settle_streams(self)
        core = self.job._core
        if core.hooks:
            core.emit(SessionClosed(t=anyio.current_time(), job_id=self.job.id, session_id=self.id))

    def _unpin(self) -> None:
        """The session ends: it no longer counts in its endpoint's ``load.sessions``
        (a call still in flight may move it: the transport counts closed sessions
        nowhere). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.placement.unpin(self.job._core.replicas)

    # -- used by the transport -----------------------------------------------------------

    def _begin_turn(self, now: float) -> TurnStart:
        """Claim the session's next turn for a call starting at ``now``."""
        return self._next.begin(now, self.placement.last_reply_at, self.job._core.waits)

    def _tool_calls(self, names: tuple[str, ...]) -> None:
        """A reply called these tools: the session's next waits are expected to be them."""
        self._next.last_tools = names


class Job:
    """One unit of user-visible work. Obtained from ``rt.job(...)``.

    ``job.report`` is filled when the job's block ends, whatever the outcome.
    """

    def __init__(
        self,
        core: _Core,
        name: str,
        *,
        job_id: str | None,
        program_id: str | None,
        deadline_s: float | None,
        metadata: dict[str, Any] | None,
    ) -> None:
        check_name(name, "job name")
        self._core = core
        self.name = name
        self.id = validate_id(job_id, "job_id") if job_id is not None else new_id("job")
        self.program_id = (
            validate_id(program_id, "program_id") if program_id is not None else self.id
        )
        self.deadline_s = validate_nonneg(deadline_s, "deadline_s")
        self.metadata: dict[str, Any] = check_metadata(metadata)
        self._closed = False
        self._deadline_hit = False
        """A call of this job ran into its deadline (the transport bounds every call)."""
        self._t0 = 0.0
        self._started_at = datetime.now(UTC)
        self._calls: list[_CallState] = []
        self._tools: list[ToolReport] = []
        self._tool_seq = 0
        """Tool waits started so far (numbers them for the tool events)."""
        self._session_reports: list[SessionReport] = []
        """The job's sessions as they opened (its report's session tree)."""
        self._report: JobReport | None = None
        self._default: Session | None = None
        """The job's default session, once a call outside any session opened it."""
        self._streams: dict[_OpenStream, None] = {}
        """Its calls' streamed replies not closed yet (in the order they came)."""
        self._program: _Program = None  # type: ignore[assignment]
        """Its program's shared state (attained service), set when the job starts."""

    def __repr__(self) -> str:
        return f"<Job id={self.id!r} name={self.name!r}>"

    @property
    def report(self) -> JobReport:
        """The job's report. Final once the job's block has ended; a live snapshot before."""
        if self._report is not None:
            return self._report
        return self._build_report("ok", None, anyio.current_time())

    @property
    def elapsed_s(self) -> float:
        """Seconds since the job started (its JCT so far)."""
        return anyio.current_time() - self._t0

    @async_block("job.session(...) as s")
    async def session(
        self,
        name: str | None = None,
        *,
        session_id: str | None = None,
        parent: Session | str | None = None,
        blocks_parent: bool | None = None,
    ) -> AsyncIterator[Session]:
        """Open a session (a conversation) in this job. Sessions may run concurrently.

        ``parent`` links a sub-agent's session to the session that spawned it;
        ``blocks_parent`` says whether that parent waits for the sub-agent's result
        (sent to servers that read it, such as vllm-router's program scheduler).
        """
        session = self._open_session(name, session_id, parent, blocks_parent)
        token = _CURRENT_SESSION.set(session)
        try:
            yield session
        finally:
            _CURRENT_SESSION.reset(token)
            session._close()
            if self._streams:  # streams of the session left unread: closed
                await self._shut_streams(session)

    def _settle_streams(self, session: Session | None) -> None:
        """End the calls of the job's streams that are still open (``session``'s only,
        if given) as ``cancelled``: their caller stopped reading them before their end
        (``break`` without ``close()``) and the block that started them has ended. Their
        room in the admission gate goes to the next call at once, not when the stream is
        garbage-collected. (Sync: the job's and the session's ends call it; their
        connections are closed by :meth:`_shut_streams`.)"""
        why = "job" if session is None else "session"
        for stream in list(self._streams):
            if session is None or stream._session is session:
                stream._abandon(f"the caller left the stream before its end; its {why} ended")

    async def _shut_streams(self, session: Session | None) -> None:
        """:meth:`_settle_streams`, and close the connections of those streams (shielded:
        the block may end by a cancellation, and bounded)."""
        self._settle_streams(session)
        streams = [s for s in self._streams if session is None or s._session is session]
        with anyio.move_on_after(_SHUT_S, shield=True):
            for stream in streams:
                await stream._shut()

    def _default_session(self) -> Session:
        """The session of the calls made in the job's block outside any session: opened
        on the first, named ``"default"``, ended with the job (routed, counted and
        reported as any session)."""
        session = self._default
        if session is None:
            session = self._default = self._open_session(DEFAULT_SESSION, None, None)
        return session

    def _open_session(
        self,
        name: str | None,
        session_id: str | None,
        parent: Session | str | None,
        blocks_parent: bool | None = None,
    ) -> Session:
        """Open a session without a block (it ends with ``session._close()``)."""
        session = self._new_session(name, session_id, parent, blocks_parent)
        core = self._core
        if core.hooks:
            core.emit(
                SessionOpened(
                    t=anyio.current_time(),
                    job_id=self.id,
                    session_id=session.id,
                    name=session.name,
                    parent_id=session.parent_id,
                )
            )
        return session

    def _new_session(
        self,
        name: str | None,
        session_id: str | None,
        parent: Session | str | None,
        blocks_parent: bool | None = None,
    ) -> Session:
        check_name(name, "session name")
        sid = validate_id(session_id, "session_id") if session_id is not None else new_id("ses")
        if isinstance(parent, str):
            validate_id(parent, "parent session id")
        elif parent is not None and not isinstance(parent, Session):
            raise TypeError("parent must be a Session, a session id, or None")
        if blocks_parent is not None:
            if blocks_parent.__class__ is not bool:
                raise TypeError(f"blocks_parent must be a bool, got {type(blocks_parent).__name__}")
            if parent is None:
                raise ValueError("blocks_parent is given for a session without a parent")
        if self._closed:
            raise JobClosedError(f"job {self.id!r} has ended; it cannot open a new session")
        self._session_reports.append(
            SessionReport(
                session_id=sid,
                name=name,
                parent_id=parent.id if isinstance(parent, Session) else parent,
                start_s=anyio.current_time() - self._t0,
            )
        )
        return Session(self, name, sid, parent, blocks_parent, stable=session_id is not None)

    # -- lifecycle, driven by Runtime.job ----------------------------------------------

    @classmethod
    def _implicit(cls, core: _Core) -> Job:
        """A started one-call job, for a call made outside any session (the transport
        ends it with :meth:`_end_implicit` when the call ends)."""
        job = cls(core, "call", job_id=None, program_id=None, deadline_s=None, metadata=None)
        job._start(implicit=True)
        return job

    def _start(self, *, implicit: bool = False) -> None:
        """The job starts: its program counts it, the runtime lists it as running, the
        hooks hear of it."""
        core = self._core
        self._program = program = core.program(self.program_id)
        program.jobs += 1
        core.active_jobs[self.id] = self.name
        self._t0 = anyio.current_time()
        if core.hooks:
            core.emit(
                JobStarted(
                    t=self._t0,
                    job_id=self.id,
                    name=self.name,
                    program_id=self.program_id,
                    started_at=self._started_at,
                    implicit=implicit,
                )
            )

    def _finish(self, status: JobStatus, error: str | None) -> JobReport:
        """The job ends: its report is built and handed on (``on_job_end``, the hooks),
        and the runtime's policies and its program forget it. The calls of its streams
        left unread end ``cancelled`` (``Runtime.job`` then closes their connections)."""
        if self._streams:
            self._settle_streams(None)
        if self._default is not None:
            self._default._close()
        core = self._core
        report = self._final_report(status, error if error is None else core.redact(error))
        core.active_jobs.pop(self.id, None)
        core.job_ended(self.id, self.program_id)
        program = core.programs.get(self.program_id)
        if program is not None:
            program.jobs -= 1
            if program.jobs <= 0:
                del core.programs[self.program_id]
        core.on_report(report)
        if core.hooks:
            core.emit(JobEnded(t=anyio.current_time(), job_id=self.id, report=report))
        return report

    # -- used by its calls ---------------------------------------------------------------

    def _open_call(
        self,
        call_id: str,
        session: Session,
        turn: int,
        path: str,
        model: str | None,
        stream: bool,
        now: float,
    ) -> _CallState:
        """A call of ``session`` starts at ``now``: its record, kept for the job's report."""
        state = _CallState(
            call_id, session.id, session.name, turn, path, model, stream, now - self._t0, now
        )
        self._calls.append(state)
        return state

    def _deadline_at(self) -> float | None:
        """When the job's deadline falls (clock time), if it has one."""
        return None if self.deadline_s is None else self._t0 + self.deadline_s

    def _hit_deadline(self) -> str:
        """A call ran into the job's deadline (its report says so); the call's error."""
        self._deadline_hit = True
        return f"deadline of {self.deadline_s:g} s exceeded"

    def _attained(self) -> tuple[float, int]:
        """The service its program has received: seconds, tokens."""
        program = self._program
        return program.service_s, program.service_tokens

    def _served(self, service_s: float, tokens: int) -> None:
        """A call of the job received ``service_s`` of service and ``tokens`` tokens."""
        program = self._program
        program.service_s += service_s
        program.service_tokens += tokens

    def _end_implicit(self) -> None:
        """End a job of :meth:`_implicit` (once) with its call's outcome."""
        if self._closed:
            return
        statuses = {c.status for c in self._calls}
        status: JobStatus = "ok"
        error = None
        if "cancelled" in statuses:
            status, error = "cancelled", "cancelled"
        elif "error" in statuses:
            status = "error"
            error = next((c.error for c in self._calls if c.error), None)
        self._finish(status, error)

    def _final_report(self, status: JobStatus, error: str | None) -> JobReport:
        end = anyio.current_time()
        self._closed = True
        settle_calls(self._calls, end, status)
        self._report = self._build_report(status, error, end)
        return self._report

    def _build_report(self, status: JobStatus, error: str | None, end: float) -> JobReport:
        self._core.note_kv()
        return job_report(
            self._calls,
            self._tools,
            self._session_reports,
            t0=self._t0,
            end=end,
            job_id=self.id,
            name=self.name,
            program_id=self.program_id,
            status=status,
            error=error,
            started_at=self._started_at,
            deadline_s=self.deadline_s,
            metadata=self.metadata,
            arrival_s=self._t0 - self._core.opened_at,
            runtime=self._core.settings,
        )
