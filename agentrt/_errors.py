"""agentrt's exceptions. Foreign exceptions are translated in one place (the transport)."""

from __future__ import annotations

from typing import Any

import openai

__all__ = [
    "AgentrtError",
    "AttemptError",
    "EndpointError",
    "JobClosedError",
    "RuntimeClosedError",
    "SessionClosedError",
]


class AgentrtError(Exception):
    """Base class of agentrt's own errors."""


class EndpointError(AgentrtError, openai.OpenAIError):
    """An endpoint could not be reached, or did not answer like an OpenAI-compatible server.

    The message names the endpoint; ``endpoint`` holds its base URL and ``attempts`` the
    number of attempts made. It is an ``openai.OpenAIError`` too, so openai's clients
    (2.x and 3.x) pass it on as it is, neither wrapped in ``APIConnectionError`` nor
    retried: agentrt has already retried it.

    ``error`` is the HTTP library's exception that ended the last attempt (a connection
    error, a timeout), where one did, else None. Its message is in this one's; it is kept
    here rather than chained as the cause, so that a traceback ends in this one line,
    not in the transport's internals (it does not survive pickling).
    """

    def __init__(
        self,
        message: str,
        *,
        endpoint: str,
        attempts: int = 1,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.attempts = attempts
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:  # keyword arguments: pickled by hand
        return (_endpoint_error, (str(self), self.endpoint, self.attempts))


def _endpoint_error(message: str, endpoint: str, attempts: int) -> EndpointError:
    return EndpointError(message, endpoint=endpoint, attempts=attempts)


class AttemptError(AgentrtError):
    """An attempt of a call that failed in a way agentrt retries: the server answered a
    retryable status (408, 409, 429, 5xx: ``status``, with the reply's ``retry_after``
    seconds if it asked), or no reply came (``error``: the HTTP library's connection
    error or timeout). ``endpoint`` is the attempt's endpoint URL.

    A caller never catches it: it is the exception a :class:`~agentrt.Retry`'s tenacity
    ``retry`` strategy sees in the failed attempt's outcome (say
    ``retry_if_exception(lambda e: e.status != 409)``). Out of attempts, the call hands
    on the last reply, or raises :class:`EndpointError`.
    """

    status: int | None
    retry_after: float | None
    error: Exception | None
    endpoint: str


class JobClosedError(AgentrtError):
    """A session or tool wait was used after its job ended."""


class RuntimeClosedError(AgentrtError):
    """A runtime, or a client it built (``rt.openai()``, ``rt.http_client()``, a framework
    adapter's model), was used after the runtime's block ended. Raised before anything is
    sent."""


class SessionClosedError(AgentrtError):
    """A session was used after its ``async with`` block ended."""


for _cls in (
    AgentrtError,
    AttemptError,
    EndpointError,
    JobClosedError,
    RuntimeClosedError,
    SessionClosedError,
):
    # Named by the public module, as httpx names its own: tracebacks and reprs say
    # ``agentrt.EndpointError``, and pickles find the class there (``agentrt.__all__``).
    _cls.__module__ = "agentrt"


CLOSED_MESSAGE = (
    "this Runtime is closed: its block has ended, and neither it nor the clients it built "
    "(rt.openai(), rt.http_client(), framework models) take new calls"
)


WRONG_LOOP_MESSAGE = (
    "this Runtime was used from another event loop than the one it was entered in (another "
    "thread's asyncio.run or trio.run, say): a Runtime, its jobs, sessions and clients live "
    "in that one loop. Use one Runtime per event loop, or a SyncRuntime to share one "
    "runtime between threads"
)


class WrongLoopError(AgentrtError, openai.OpenAIError):
    """A runtime (or a client it built) used from an event loop other than its own: an
    ``AgentrtError`` that openai's clients pass on as it is (see
    :class:`ClientClosedError`)."""


WrongLoopError.__module__ = "agentrt"  # public (agentrt.__all__), as the ones above


class ClientClosedError(RuntimeClosedError, openai.OpenAIError):
    """:class:`RuntimeClosedError` as a client agentrt built raises it. openai-python passes
    its own errors through as they are and (2.x) wraps any other one from the HTTP client
    in ``APIConnectionError``: as an ``OpenAIError`` too, the refusal reaches the caller
    unchanged, from openai's clients and from the frameworks built on them."""


class DeadlineExceeded(TimeoutError, openai.OpenAIError):
    """A call ran into its job's deadline (raised where the call was, as the job's own
    cancel scope makes ``rt.job(deadline_s=...)`` raise ``TimeoutError``). An
    ``OpenAIError`` too, so that openai 2.x passes it on instead of wrapping it in
    ``APIConnectionError``."""


def only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is the event loop's cancellation (``anyio.get_cancelled_exc_class()``),
    or an exception group of nothing else. trio delivers a cancellation so when it passes
    through a nursery (``trio.open_tcp_stream`` while connecting, a nursery in the
    caller's code), where asyncio's task groups raise ``CancelledError`` itself: either is
    ``cancelled``, never ``error``. (In an ``except`` only: it asks anyio for the loop.)"""
    if isinstance(exc, BaseExceptionGroup):
        return all(only_cancelled(e) for e in exc.exceptions)
    import anyio  # here: this module is imported by the command at start-up (stdlib only)

    return isinstance(exc, anyio.get_cancelled_exc_class())


def raise_own_error(exc: Exception) -> None:
    """openai 2.x wraps whatever the transport raised in APIConnectionError; surface
    agentrt's own errors (an endpoint that failed, bad input caught before sending) as
    they are, as openai 3.x does."""
    cause = exc.__cause__
    if isinstance(cause, EndpointError | ValueError | TypeError) and not isinstance(
        exc, ValueError | TypeError
    ):
        # Its own cause (the transport error) stays its cause, as under openai 3.x.
        raise cause from cause.__cause__
