"""Telemetry: per-job reports, the event stream and its hooks."""

from ._events import (
    AttemptFailed,
    CallEnded,
    CallQueued,
    CallSent,
    CallStarted,
    Event,
    FirstToken,
    Hook,
    JobEnded,
    JobStarted,
    SessionClosed,
    SessionMoved,
    SessionOpened,
    ToolEnded,
    ToolStarted,
)
from ._journal import Journal, JournalWarning, iter_journal, read_journal
from ._prometheus import PrometheusHook
from ._report import CallReport, CallStatus, JobReport, JobStatus, ToolReport

__all__ = [
    "AttemptFailed",
    "CallEnded",
    "CallQueued",
    "CallReport",
    "CallSent",
    "CallStarted",
    "CallStatus",
    "Event",
    "FirstToken",
    "Hook",
    "JobEnded",
    "JobReport",
    "JobStarted",
    "JobStatus",
    "Journal",
    "JournalWarning",
    "PrometheusHook",
    "SessionClosed",
    "SessionMoved",
    "SessionOpened",
    "ToolEnded",
    "ToolReport",
    "ToolStarted",
    "iter_journal",
    "read_journal",
]
