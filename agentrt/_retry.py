"""Retry: which outcomes of an attempt are retried, and how long to wait before the next.

Pure helpers, as openai-python's (``_should_retry``, ``_parse_retry_after_header``,
``_calculate_retry_timeout``); the loop over attempts is the call's own, a plain one
(``_attempts.Attempts.run``): the first attempt costs nothing extra, and a retried call skips
the tenacity machinery (tens of microseconds) that the loop used to go through.
"""

from __future__ import annotations

import email.utils
import random
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import httpx

if TYPE_CHECKING:
    from ._config import Retry

__all__ = [
    "RETRY_STATUS",
    "RetryableError",
    "RetryableStatus",
    "backoff",
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


class RetryableStatus(Exception):
    """An attempt answered with a status in :data:`RETRY_STATUS` (its reply read)."""

    def __init__(self, response: httpx.Response, retry_after: float | None) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after = retry_after


class RetryableError(Exception):
    """An attempt failed in the transport (no reply) at endpoint ``endpoint``."""

    def __init__(self, error: Exception, endpoint: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.endpoint = endpoint


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


def backoff(retry: Retry, n: int, exc: BaseException | None) -> float:
    """The wait after failed attempt ``n`` (from 1): exponential from ``wait_initial`` up
    to ``wait_max``, with jitter, and at least the reply's ``Retry-After`` (capped at
    ``retry_after_max``)."""
    delay = min(retry.wait_max, retry.wait_initial * 2 ** (n - 1))
    delay += random.uniform(0.0, retry.wait_jitter) if retry.wait_jitter else 0.0
    if isinstance(exc, RetryableStatus) and exc.retry_after is not None:
        delay = max(delay, min(exc.retry_after, retry.retry_after_max))
    return float(delay)


def refuses_priority(body: bytes) -> bool:
    """Whether the body of a 400 to a call that carried a priority refuses the priority
    itself: the attempt is then resent at once without it, not retried."""
    return _PRIORITY_REFUSED.search(body[:_MAX_ERROR_SCAN]) is not None
