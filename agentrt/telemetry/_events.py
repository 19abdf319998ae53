"""Events: a small, typed stream of what happens in a runtime, for hooks.

A hook is any callable that takes one :class:`Event` (the :class:`Hook` protocol).
``Runtime(hooks=[...])`` calls every hook, in order, synchronously, at the moment the event
happens; the exporters (journal, OpenTelemetry, Prometheus) are hooks too. Events are
frozen dataclasses. Every event carries ``t`` (the runtime's clock,
``anyio.current_time()``: monotonic, or virtual in simulations) and the job id; the
events of a session carry its id, those of a call its id.

When no hook is installed, no event object is built: the cost is one truth test per
emission point. A hook that raises does not disturb the call: its first error is a
:mod:`warnings` warning, and every error is counted (``rt.journal_statistics()``) and
logged on the ``agentrt`` logger, rate-limited.

Order of a call's events: ``CallStarted``, then per attempt ``CallQueued`` (only when it
waited for room; ``t`` is when it started waiting), ``CallSent``, and ``AttemptFailed``
when the attempt failed; ``FirstToken`` for a streamed reply; ``CallEnded`` once, whatever
the outcome. ``SessionMoved`` comes before the ``CallSent`` of the attempt that moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from ._report import CallReport, CallStatus, JobReport

__all__ = [
    "AttemptFailed",
    "CallEnded",
    "CallQueued",
    "CallSent",
    "CallStarted",
    "Event",
    "FirstToken",
    "Hook",
    "JobEnded",
    "JobStarted",
    "SessionClosed",
    "SessionMoved",
    "SessionOpened",
    "ToolEnded",
    "ToolStarted",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Something that happened. ``t``: the runtime clock (seconds)."""

    t: float
    job_id: str


class Hook(Protocol):
    """Receives every event of a runtime. Keep it fast: it runs on the call's path."""

    def __call__(self, event: Event, /) -> None: ...


# -- jobs and sessions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStarted(Event):
    """A job's block was entered (or a call outside any job opened an implicit one)."""

    name: str
    program_id: str
    started_at: datetime
    """Wall-clock start (UTC)."""
    implicit: bool = False
    """A one-call job opened for a call made outside any session."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnded(Event):
    """A job ended, whatever its status; ``report`` is final."""

    report: JobReport
    """The job's final report (status, JCT and its breakdown, every call and tool wait)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOpened(Event):
    """A session of the job was opened; ``parent_id`` names the session that spawned it."""

    session_id: str
    name: str | None
    parent_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed(Event):
    """A session's block ended."""

    session_id: str


# -- calls -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStarted(Event):
    """A call was made in a session, before admission and before any attempt; ``turn``
    counts the session's calls from 0."""

    session_id: str
    call_id: str
    turn: int
    path: str
    """The request path under the endpoint's base URL, e.g. ``/chat/completions``."""
    model: str | None
    stream: bool
    content: object = None
    """The request's ``messages`` (or ``prompt``), only with
    ``Runtime(capture_content=True)``."""
    max_tokens: int | None = None
    """The request's ``max_completion_tokens`` (else ``max_tokens``), when given."""
    temperature: float | None = None
    """The request's ``temperature``, when given."""
    session_name: str | None = None
    """The session's name, when it has one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallQueued(Event):
    """The call waited in agentrt's admission queue; ``t`` is when it began waiting."""

    session_id: str
    call_id: str
    endpoint: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSent(Event):
    """An attempt was admitted and is being sent."""

    session_id: str
    call_id: str
    endpoint: str
    attempt: int
    """1 for the first attempt."""
    queue_s: float
    """Time this call has spent in the admission queue so far."""
    held_s: float = 0.0
    """Time load control held this call at its session's tool boundary, before it was
    routed and queued (0.0: not held)."""
    priority: int | None
    headers: dict[str, str] = field(default_factory=dict)
    """Hooks may add headers to the attempt here (e.g. W3C ``traceparent``); names lower
    case. Values are checked like every header agentrt sends (no CR/LF, bounded)."""
    wire_session_id: str | None = None
    """The session id this attempt carries on the wire where the caller set its own in
    place of agentrt's (a header or body field the dialect would fill with the session
    id: the caller's wins); None when the wire carries ``session_id``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed(Event):
    """An attempt of a call failed; ``will_retry`` says whether another attempt follows."""

    session_id: str
    call_id: str
    endpoint: str
    attempt: int
    error: str
    will_retry: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstToken(Event):
    """The first token of a streamed reply arrived, ``ttft_s`` after the call started."""

    session_id: str
    call_id: str
    ttft_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEnded(Event):
    """A call ended, once, whatever the outcome; ``report`` is its final report."""

    session_id: str
    call_id: str
    status: CallStatus
    report: CallReport
    finish_reason: str | None = None
    """The first choice's ``finish_reason`` (``stop``, ``length``, ``tool_calls``...), when
    the reply had one."""
    output: str | None = None
    """The completion text (first choice), only with ``Runtime(capture_content=True)``."""
    response_id: str | None = None
    """The reply's ``id`` (``chatcmpl-...``), from the body or a stream's first chunk."""
    response_model: str | None = None
    """The model the server says answered (the reply's ``model``)."""
    finish_reasons: tuple[str, ...] = ()
    """Every choice's finish reason, in the order the reply gave them."""
    tool_calls: tuple[tuple[str, str], ...] = ()
    """``(id, function name)`` of each tool call the reply's first choice asks for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionMoved(Event):
    """A session's call went to another replica than its previous turn: the cached
    prefix there is not reused."""

    session_id: str
    call_id: str
    from_endpoint: str
    to_endpoint: str
    reason: str = "routing"
    """Why: ``"unavailable"`` (its replica failed or is down), ``"retention"`` (idle
    longer than its replica likely keeps a cache), ``"overload"``, or ``"routing"`` (the
    router's choice, with no reason given)."""


# -- tool waits -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStarted(Event):
    """A tool wait began (the session's ``tool(...)`` block was entered)."""

    session_id: str
    wait_id: int
    """Numbers the job's tool waits from 0; the matching ``ToolEnded`` has the same."""
    name: str
    expected_s: float | None
    expected_source: Literal["declared", "learned"] | None = None
    """Where ``expected_s`` came from: the caller, or the runtime's learned estimate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolEnded(Event):
    """A tool wait ended; ``status`` is ``error`` when the tool's block raised."""

    session_id: str
    wait_id: int
    name: str
    duration_s: float
    status: CallStatus
    error_type: str | None = None
    """The exception's class name when the tool's block raised."""
