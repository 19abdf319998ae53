"""agentrt: an agent-aware runtime for LLM calls.

Jobs, sessions and tool waits become first-class; every call is tagged for the engine it
goes to, routed by session, and reported by job completion time.
"""

from importlib.metadata import PackageNotFoundError, version

from ._config import DEFAULT_RETRY, Endpoint, Retry
from ._context import Job, Session
from ._errors import AgentrtError, EndpointError, JobClosedError, SessionClosedError
from ._notice import NoticeStatistics
from ._protocol import PROTOCOL_VERSION, CallMetadata
from ._runtime import DEFAULT_TIMEOUT_S, Runtime, SyncJob, SyncRuntime, SyncSession
from .telemetry import CallReport, JobReport, ToolReport

try:
    __version__ = version("agentrt")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT_S",
    "PROTOCOL_VERSION",
    "AgentrtError",
    "CallMetadata",
    "CallReport",
    "Endpoint",
    "EndpointError",
    "Job",
    "JobClosedError",
    "JobReport",
    "NoticeStatistics",
    "Retry",
    "Runtime",
    "Session",
    "SessionClosedError",
    "SyncJob",
    "SyncRuntime",
    "SyncSession",
    "ToolReport",
    "__version__",
]
