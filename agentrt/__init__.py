"""agentrt: an agent-aware runtime for LLM calls.

Jobs, sessions and tool waits become first-class; every call is tagged for the engine it
goes to, routed by session, and reported by job completion time.

The public names are imported on first use (PEP 562), so that ``import agentrt`` and the
``agentrt`` command start fast: the runtime pulls in openai and httpx, which take a second
or more to import on a small machine.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import DEFAULT_RETRY, Endpoint, Retry
    from ._context import Job, Session
    from ._errors import (
        AgentrtError,
        AttemptError,
        EndpointError,
        JobClosedError,
        RuntimeClosedError,
        SessionClosedError,
        WrongLoopError,
    )
    from ._notice import NoticeStatistics
    from ._protocol import PROTOCOL_VERSION, CallMetadata
    from ._runtime import DEFAULT_TIMEOUT_S, Runtime
    from ._sync import SyncJob, SyncRuntime, SyncSession
    from .scheduling._loadcontrol import LoadControl, LoadStatistics
    from .telemetry import CallReport, JobReport, ToolReport
    from .telemetry._journal import JournalStatistics

from ._version import __version__

__all__ = [
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT_S",
    "PROTOCOL_VERSION",
    "AgentrtError",
    "AttemptError",
    "CallMetadata",
    "CallReport",
    "Endpoint",
    "EndpointError",
    "Job",
    "JobClosedError",
    "JobReport",
    "JournalStatistics",
    "LoadControl",
    "LoadStatistics",
    "NoticeStatistics",
    "Retry",
    "Runtime",
    "RuntimeClosedError",
    "Session",
    "SessionClosedError",
    "SyncJob",
    "SyncRuntime",
    "SyncSession",
    "ToolReport",
    "WrongLoopError",
    "__version__",
]

_HOMES: dict[str, str] = {
    "DEFAULT_RETRY": "._config",
    "Endpoint": "._config",
    "Retry": "._config",
    "Job": "._context",
    "Session": "._context",
    "AgentrtError": "._errors",
    "AttemptError": "._errors",
    "EndpointError": "._errors",
    "JobClosedError": "._errors",
    "RuntimeClosedError": "._errors",
    "SessionClosedError": "._errors",
    "WrongLoopError": "._errors",
    "NoticeStatistics": "._notice",
    "PROTOCOL_VERSION": "._protocol",
    "CallMetadata": "._protocol",
    "DEFAULT_TIMEOUT_S": "._runtime",
    "Runtime": "._runtime",
    "SyncJob": "._sync",
    "SyncRuntime": "._sync",
    "SyncSession": "._sync",
    "CallReport": ".telemetry",
    "JobReport": ".telemetry",
    "ToolReport": ".telemetry",
    "JournalStatistics": ".telemetry._journal",
    "LoadControl": ".scheduling._loadcontrol",
    "LoadStatistics": ".scheduling._loadcontrol",
}
"""Where each public name lives (tests/test_public_api.py checks it against ``__all__``)."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentrt' has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
