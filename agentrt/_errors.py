"""agentrt's exceptions. Foreign exceptions are translated in one place (the transport)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentrtError",
    "EndpointError",
    "JobClosedError",
    "RuntimeClosedError",
    "SessionClosedError",
]


class AgentrtError(Exception):
    """Base class of agentrt's own errors."""


class EndpointError(AgentrtError):
    """An endpoint could not be reached, or did not answer like an OpenAI-compatible server.

    The message names the endpoint; ``endpoint`` holds its base URL and ``attempts`` the
    number of attempts made.
    """

    def __init__(self, message: str, *, endpoint: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.attempts = attempts

    def __reduce__(self) -> tuple[Any, ...]:  # keyword arguments: pickled by hand
        return (_endpoint_error, (str(self), self.endpoint, self.attempts))


def _endpoint_error(message: str, endpoint: str, attempts: int) -> EndpointError:
    return EndpointError(message, endpoint=endpoint, attempts=attempts)


class JobClosedError(AgentrtError):
    """A session or tool wait was used after its job ended."""


class RuntimeClosedError(AgentrtError):
    """A runtime, or a client it built (``rt.openai()``, ``rt.http_client()``, a framework
    adapter's model), was used after the runtime's block ended. Raised before anything is
    sent."""


class SessionClosedError(AgentrtError):
    """A session was used after its ``async with`` block ended."""


for _cls in (AgentrtError, EndpointError, JobClosedError, RuntimeClosedError, SessionClosedError):
    # Named by the public module, as httpx names its own: tracebacks and reprs say
    # ``agentrt.EndpointError``, and pickles find the class there (``agentrt.__all__``).
    _cls.__module__ = "agentrt"
