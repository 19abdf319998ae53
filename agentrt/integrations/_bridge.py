"""The one mechanism the framework adapters share: start/end callbacks drive agentrt's
jobs, sessions and tool waits.

agentrt's units are blocks (``async with rt.job(...)``, ``job.session(...)``,
``session.tool(...)``) bound to contextvars. A framework's tracing or callback API
instead says "X started" and later "X ended", each time with the framework's own id
(a trace or span id, a run id). A :class:`Bridge` keeps the open units by those ids,
ends them with the semantics of the blocks (the same report, terminal statuses, events),
and binds a session to the calls made next in the current context, where the transport
looks for it (``agentrt._context.current_session``).

Every method is synchronous and cheap, and must run in the event loop's thread (where
the framework's callbacks run for async code). A Bridge whose runtime is closed ignores
new jobs.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import sniffio

from .._context import _CALL_SESSION, Job, Session
from .._turns import ToolWait
from ..telemetry._report import CallStatus, JobReport

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["Binding", "Bridge", "bind", "in_event_loop", "unbind"]

Binding = contextvars.Token[Session | None]
"""What :func:`bind` returns; :func:`unbind` takes it back."""


def bind(session: Session | None) -> Binding:
    """Make the calls made next in this context (this task, and tasks it starts from now
    on) turns of ``session``, as inside ``session.chat`` or ``job.session``'s block.
    It takes precedence over an enclosing ``job.session`` block. None undoes an
    enclosing binding until :func:`unbind`: the calls go where they would without it."""
    return _CALL_SESSION.set(session)


def in_event_loop() -> bool:
    """Whether this thread runs an event loop (a framework's callback in async code)."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


def unbind(binding: Binding) -> None:
    """Undo :func:`bind`. In a context other than the one bound (a callback that ended
    elsewhere) there is nothing to undo here: that context ends with its task."""
    try:
        _CALL_SESSION.reset(binding)
    except ValueError:
        pass


@dataclass(slots=True, eq=False)
class _OpenJob:
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

    A key names one unit for as long as it is open; ending a job ends what is still
    open in it (tool waits, then sessions), so every job gets a terminal status.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._jobs: dict[Hashable, _OpenJob] = {}
        self._job_of: dict[Hashable, Hashable] = {}
        """The job key of each open session and tool wait."""

    @property
    def active(self) -> bool:
        """Whether the runtime is open (a closed one takes no new jobs)."""
        return self.rt._opened and not self.rt._closed

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
        """Start a job (``rt.job(name)`` without a block); None if the runtime is closed.
        ``thread``: the conversation it continues, whose sessions keep their ids from
        run to run (:func:`thread_session_id`)."""
        if not self.active:
            return None
        if key in self._jobs:
            raise ValueError(f"a job with key {key!r} is already open")
        job = self.rt._open_job(name, job_id=job_id, program_id=program_id, metadata=metadata)
        self._jobs[key] = _OpenJob(job, thread=thread or None)
        return job

    def job(self, key: Hashable) -> Job | None:
        """The open job with this key."""
        state = self._jobs.get(key)
        return None if state is None else state.job

    def end_job(self, key: Hashable, exc: BaseException | None = None) -> JobReport | None:
        """End the job: ``ok``, or ``cancelled`` / ``error`` for the exception that ended
        its work (as ``rt.job``'s block reports it). Tool waits and sessions still open
        in it end first (a tool wait as ``cancelled``, or ``error`` when ``exc`` is an
        error). None if no job with this key is open."""
        state = self._jobs.pop(key, None)
        if state is None:
            return None
        tool_status: CallStatus = "cancelled"
        if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
            tool_status = "error"
        for tool_key, (session, wait) in state.tools.items():
            self._job_of.pop(tool_key, None)
            session._end_tool(wait, tool_status, None if exc is None else type(exc).__name__)
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
        without a block); None if that job is not open."""
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
        """Begin a tool wait in the open session ``session_key`` (``session.tool(name)``
        without a block); nothing if that session is not open."""
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
        self, key: Hashable, status: CallStatus = "ok", error_type: str | None = None
    ) -> None:
        """End the tool wait: ``ok``, or ``error`` (``error_type`` names the exception) or
        ``cancelled``."""
        job_key = self._job_of.pop(key, None)
        state = None if job_key is None else self._jobs.get(job_key)
        if state is None or key not in state.tools:
            return
        session, wait = state.tools.pop(key)
        session._end_tool(wait, status, error_type)
