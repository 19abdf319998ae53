"""Retry: which outcomes of an attempt are retried, and how long to wait before the next.

Helpers, as openai-python's (``_should_retry``, ``_parse_retry_after_header``,
``_calculate_retry_timeout``), and :class:`Retrying`, the :class:`Retry`'s tenacity
strategies evaluated on a failed attempt. The loop over attempts is the call's own, a
plain one (``_attempts.Attempts.run``), not tenacity's ``AsyncRetrying`` (tens of
microseconds per call): a first attempt that succeeds costs nothing extra, and tenacity
is imported and its ``RetryCallState`` made only once an attempt has failed.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import httpx

from .._errors import AttemptError

if TYPE_CHECKING:
    from .._config import Retry

__all__ = [
    "RETRY_STATUS",
    "RetryableError",
    "RetryableStatus",
    "Retrying",
    "preempted",
    "refuses_priority",
    "retry_after",
]

RETRY_STATUS: Final = frozenset({408, 409, 429, 500, 502, 503, 504})
"""The statuses an attempt is retried on (openai-python's: timeout, conflict, rate limit,
server errors)."""
_PRIORITY_REFUSED = re.compile(rb"priority scheduling is not enabled", re.IGNORECASE)
"""In a 400 to a call that carried a priority: vLLM refuses a non-zero priority with
``Got priority {priority} but Priority scheduling is not enabled.`` when it was not
started with ``--scheduling-policy priority`` (``LLMEngine.add_request`` and the async
engine's ``add_request_async``); a proxy in front of it (LiteLLM) keeps that text."""
_MAX_ERROR_SCAN = 64 * 1024


class RetryableStatus(AttemptError):
    """An attempt answered with a status in :data:`RETRY_STATUS` (its reply read)."""

    def __init__(self, response: httpx.Response, retry_after: float | None, endpoint: str) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.status = response.status_code
        self.retry_after = retry_after
        self.error = None
        self.endpoint = endpoint


class RetryableError(AttemptError):
    """An attempt failed in the transport (no reply) at endpoint ``index``."""

    error: Exception

    def __init__(self, error: Exception, index: int, endpoint: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.index = index
        self.status = None
        self.retry_after = None
        self.endpoint = endpoint


class Retrying:
    """A call's retries in tenacity's terms, made at its first failed attempt (a call
    whose first attempt succeeds never makes one): the :class:`Retry`'s strategies and
    the ``tenacity.RetryCallState`` they read, on the call's clock (virtual time too)."""

    __slots__ = ("retry_after_max", "should", "state", "stop", "wait")

    def __init__(self, retry: Retry, started: float) -> None:
        from tenacity import RetryCallState

        self.stop, self.wait, self.should = retry.strategies()
        self.retry_after_max = retry.retry_after_max
        self.state = state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.start_time = started

    def failed(self, exc: AttemptError, n: int, now: float) -> float | None:
        """After failed attempt ``n`` (from 1) at ``now``: the wait before the next
        attempt, or None if there is none. In tenacity's order: ``retry`` (is this
        outcome retried?), then ``wait`` (at least the reply's ``Retry-After``, capped),
        then ``stop`` (which may read the upcoming wait)."""
        from tenacity import Future

        state = self.state
        state.attempt_number = n
        state.outcome = outcome = Future(n)
        outcome.set_exception(exc)
        state.outcome_timestamp = now
        state.next_action = None
        if not self.should(state):
            return None
        delay = float(self.wait(state))
        if exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self.retry_after_max))
        state.upcoming_sleep = delay
        if self.stop(state):
            return None
        state.idle_for += delay
        return delay


def retry_after(headers: httpx.Headers, now: datetime | None = None) -> float | None:
    """The wait a retryable reply asks for, in seconds: ``retry-after-ms`` (OpenAI's),
    else ``Retry-After`` as seconds or as an HTTP date (RFC 9110, section 10.2.3; a date
    in the past asks for no wait); None if absent or unreadable (then the backoff goes
    as usual). The caller caps it at ``Retry.retry_after_max``."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            return None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def preempted(response: httpx.Response) -> bool:
    """Whether a 503 is SGLang's gateway (smg) telling that it preempted the request for
    one of a higher priority class (``X-SMG-Preempted: true``, with ``Retry-After``): the
    attempt is retried after that wait, and the replica's health does not count it."""
    value: str = response.headers.get("x-smg-preempted", "")
    return value.strip().lower() == "true"


def refuses_priority(body: bytes) -> bool:
    """Whether the body of a 400 to a call that carried a priority refuses the priority
    itself: the attempt is then resent at once without it, not retried."""
    return _PRIORITY_REFUSED.search(body[:_MAX_ERROR_SCAN]) is not None
