"""A session between its calls: its tool waits in progress (:class:`ToolWait`), and what
its next call carries (:class:`NextTurn`): the caller's declarations since its last call
(``expect_idle``, ``expect_final``, tool waits' ``expected_s``) and the tools that ran,
consumed by the call as it claims its turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

from .telemetry._events import ToolEnded, ToolStarted
from .telemetry._report import ToolReport

if TYPE_CHECKING:
    from ._notice import SendNotice
    from ._protocol import IdleSource
    from ._waits import WaitEstimator
    from .telemetry._report import CallStatus

__all__ = ["MAX_TOOLS_KEPT", "NextTurn", "ToolWait", "TurnStart"]

MAX_TOOLS_KEPT = 16
"""Tool names a session remembers per idle period (and per reply's tool calls)."""


class TurnStart(NamedTuple):
    """What a session's call learns as it claims its turn (:meth:`NextTurn.begin`)."""

    turn: int
    idle_s: float | None
    """Since the session's last reply (None: its first call)."""
    idle_declared_s: float | None
    """The tool waits' ``expected_s`` declared since the session's last call, summed."""
    idle_expected_s: float | None
    """The idle expected after this call's reply."""
    idle_source: IdleSource | None
    """Where that came from: ``declared`` by ``expect_idle``, or ``predicted`` from the
    learned waits of the tools the session ran last."""
    final: bool
    """The caller said this call is the session's last."""
    after_tools: bool
    """Tool waits ran since the session's last call."""


@dataclass(slots=True, eq=False)
class NextTurn:
    """What a session's next call carries, gathered since its last one: the caller's
    declarations (``expect_idle``, ``expect_final``, tool waits' ``expected_s``) and the
    tools that ran. The call consumes them (:meth:`begin`)."""

    turns: int = 0
    final: bool = False
    idle_declared: float | None = None
    expect_idle: float | None = None
    period_tools: list[str] = field(default_factory=list)
    """Tool waits started since the last call (at most ``MAX_TOOLS_KEPT``)."""
    last_tools: tuple[str, ...] = ()
    """The tools the session ran since its last call: that idle period's tool waits,
    else the tool calls of its last reply. The next call is expected to be followed
    by the same tools again (agent loops repeat); that call consumes them."""

    def tool_started(self, name: str, declared_s: float | None) -> None:
        if declared_s is not None:
            self.idle_declared = (self.idle_declared or 0.0) + declared_s
        if len(self.period_tools) < MAX_TOOLS_KEPT:
            self.period_tools.append(name)

    def begin(
        self, now: float, last_reply_at: float | None, waits: WaitEstimator | None
    ) -> TurnStart:
        """Claim the next turn at ``now``, the session's last reply at ``last_reply_at``."""
        after_tools = bool(self.period_tools)
        turn = self.turns
        self.turns += 1
        final, self.final = self.final, False
        idle = None if last_reply_at is None else max(0.0, now - last_reply_at)
        declared, self.idle_declared = self.idle_declared, None
        expected, self.expect_idle = self.expect_idle, None
        source: IdleSource | None = None if expected is None else "declared"
        if self.period_tools:
            self.last_tools = tuple(self.period_tools)
            self.period_tools.clear()
        if self.last_tools:  # consumed, like the declarations
            if expected is None and waits is not None:
                expected = waits.estimate_many(self.last_tools)
                if expected is not None:
                    source = "predicted"
            self.last_tools = ()
        return TurnStart(turn, idle, declared, expected, source, final, after_tools)


@dataclass(slots=True, eq=False)
class ToolWait:
    """A tool wait in progress (between ``Session._start_tool`` and ``_end_tool``)."""

    wait_id: int
    name: str
    start: float
    expected_s: float | None
    source: Literal["declared", "learned"] | None
    notice: SendNotice | None = None
    """The tool-start notice to post while the wait lasts (its endpoint takes them)."""
    ended: bool = False

    def started(self, job_id: str, session_id: str) -> ToolStarted:
        return ToolStarted(
            t=self.start,
            job_id=job_id,
            session_id=session_id,
            wait_id=self.wait_id,
            name=self.name,
            expected_s=self.expected_s,
            expected_source=self.source,
        )

    def report(self, session_id: str, t0: float, end: float, status: CallStatus) -> ToolReport:
        """Its report, ended at ``end`` (clock time) in a job that started at ``t0``."""
        duration, expected = end - self.start, self.expected_s
        return ToolReport(
            session_id=session_id,
            name=self.name,
            start_s=self.start - t0,
            duration_s=duration,
            expected_s=expected,
            expected_source=self.source,
            error_s=None if expected is None else duration - expected,
            status=status,
        )

    def ended_event(
        self, job_id: str, session_id: str, end: float, status: CallStatus, error_type: str | None
    ) -> ToolEnded:
        return ToolEnded(
            t=end,
            job_id=job_id,
            session_id=session_id,
            wait_id=self.wait_id,
            name=self.name,
            duration_s=end - self.start,
            status=status,
            error_type=error_type,
        )
