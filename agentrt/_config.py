"""Configuration value objects: endpoints and the retry policy."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from tenacity.retry import RetryBaseT as RetryStrategy
    from tenacity.stop import StopBaseT as StopStrategy
    from tenacity.wait import WaitBaseT as WaitStrategy

    from .dialects._base import DialectSpec

__all__ = [
    "DEFAULT_RETRY",
    "RETRY_KEYWORDS",
    "Endpoint",
    "Retry",
    "check_api_key",
    "redact_userinfo",
    "split_userinfo",
]


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#]*@")
"""The userinfo (``user:password@``) of every URL in a text: up to the netloc's last ``@``,
as ``urlsplit`` and httpx read it."""


def redact_userinfo(text: str) -> str:
    """``text`` with the userinfo (``user:password@``) of every URL in it removed:
    ``http://user:KEY@host/v1`` reads ``http://host/v1``.

    agentrt renders endpoint URLs through this (or through :class:`Endpoint`, which keeps
    its credentials apart from its ``url``), so that credentials never reach a repr, an
    error message, a report, a journal, a span or a metric label."""
    if "@" not in text:
        return text
    return _USERINFO.sub(r"\1", text)


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """A URL without its userinfo, and the credentials it held (percent-decoded, as httpx
    reads them for HTTP Basic auth), or None."""
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return url, None
    userinfo, _, hostport = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    start = url.index("//") + 2  # the netloc follows the scheme's "//", verbatim
    return url[:start] + hostport + url[start + len(netloc) :], (unquote(user), unquote(password))


def check_api_key(key: object, what: str = "api_key") -> str:
    """``key`` if it can go in an ``Authorization: Bearer`` header as it is: a str of
    visible ASCII characters (and spaces inside). The error says what is wrong and where,
    never the key itself, and comes before anything is sent (httpx would otherwise fail at
    the first call, with a ``UnicodeEncodeError`` far from the cause)."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__}")
    for i, c in enumerate(key):
        if " " <= c <= "~":
            continue
        if c in "\r\n":
            problem = "CR/LF"
        elif c > "\x7f":
            problem = "a non-ASCII character"
        else:
            problem = "a control character"
        raise ValueError(
            f"{what} contains {problem} (at position {i} of {len(key)}): an HTTP header "
            "takes visible ASCII only; check for a stray quote, newline or a pasted "
            "character (the key itself is not shown)"
        )
    if key != key.strip():
        raise ValueError(
            f"{what} starts or ends with whitespace (length {len(key)}): strip it "
            "(the key itself is not shown)"
        )
    return key


def _check_url(url: str) -> str:
    if not isinstance(url, str):
        raise TypeError(f"endpoint URL must be a str, got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"endpoint URL {redact_userinfo(url)!r} needs an http:// or https:// scheme and "
            "a host, e.g. 'http://127.0.0.1:8000/v1'"
        )
    if any(c in url for c in "\r\n\t "):
        raise ValueError(f"endpoint URL {redact_userinfo(url)!r} contains whitespace")
    return url.rstrip("/")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One OpenAI-compatible server (a replica), by base URL.

    ``dialect`` overrides the runtime's dialect for this endpoint; ``api_key`` overrides
    the runtime's key (it never appears in ``repr``, logs or reports); ``weight`` scales
    the endpoint's share of new sessions under load-based routing; ``send_priority``
    overrides the runtime's ``send_priority``: True for a server started with priority
    scheduling (vLLM's ``--scheduling-policy priority``), False never, ``"auto"`` while
    its replies advertise ``x-agentrt-accept: priority``.

    ``kv_capacity`` is the tokens of KV cache the replica holds, for placement by
    working set (docs/routing.md): by default agentrt reads it from the engine's
    metrics (vLLM's ``vllm:cache_config_info``) where they are polled, else learns it
    from the evictions replies reveal. Given, it wins over the engine's figure: give it
    for a server that publishes none, or to place by a share of a replica that other
    clients use too.

    ``kv_events`` reads the replica's KV-cache events for exact residency (placement and
    load control then know which sessions' contexts it still caches, and its evictions as
    they happen): a ZMQ address its engine publishes on (vLLM's ``--kv-events-config``
    ``endpoint``, e.g. ``"tcp://host:5557"``; SGLang's), or ``"auto"``: the addresses its
    ``GET /kv_event_sources`` lists (vLLM). Needs the ``kv-events`` extra (pyzmq,
    msgspec); the embedded engine's are read in-process (docs/routing.md).

    ``basic_auth`` is a ``(user, password)`` pair sent as HTTP Basic auth (for a server
    behind a proxy that asks for it), in place of the runtime's ``api_key``. Credentials
    written in the URL (``http://user:KEY@host/v1``) are moved there: ``url`` keeps the
    rest (``http://host/v1``), so they never appear in a repr, an error, a report, a
    journal, a span or a metric label.
    """

    url: str
    dialect: DialectSpec | None = None
    api_key: str | None = field(default=None, repr=False)
    weight: float = 1.0
    send_priority: bool | Literal["auto"] | None = None
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    kv_capacity: int | None = None
    kv_events: str | None = None

    def __post_init__(self) -> None:
        url, credentials = split_userinfo(_check_url(self.url))
        object.__setattr__(self, "url", url.rstrip("/"))
        if credentials is not None:
            if self.basic_auth is not None:
                raise ValueError(
                    f"endpoint {url} has credentials in its URL and in basic_auth: give them once"
                )
            object.__setattr__(self, "basic_auth", credentials)
        if self.basic_auth is not None:
            auth = self.basic_auth
            if isinstance(auth, list):
                object.__setattr__(self, "basic_auth", auth := tuple(auth))
            if not (
                isinstance(auth, tuple) and len(auth) == 2 and all(isinstance(x, str) for x in auth)
            ):
                raise TypeError("endpoint basic_auth must be a (user, password) pair of str")
            if self.api_key is not None:
                raise ValueError(
                    f"endpoint {url} has both an api_key and Basic credentials (basic_auth or "
                    "user:password@ in its URL): they are both an Authorization header; "
                    "give one"
                )
        if not (self.send_priority is None or isinstance(self.send_priority, bool)) and (
            self.send_priority != "auto"
        ):
            raise ValueError(
                f"endpoint send_priority must be True, False, 'auto' or None, "
                f"got {self.send_priority!r}"
            )
        if self.kv_capacity is not None and (
            isinstance(self.kv_capacity, bool)
            or not isinstance(self.kv_capacity, int)
            or self.kv_capacity < 1
        ):
            raise ValueError(
                f"endpoint kv_capacity must be an int >= 1 (tokens) or None, "
                f"got {self.kv_capacity!r}"
            )
        if self.kv_events is not None and not (
            isinstance(self.kv_events, str)
            and (self.kv_events == "auto" or self.kv_events.startswith(KV_EVENT_SCHEMES))
        ):
            raise ValueError(
                "endpoint kv_events must be a ZMQ address (tcp://HOST:PORT, ipc://PATH) "
                f"or 'auto', got {self.kv_events!r}"
            )
        if isinstance(self.dialect, list):
            object.__setattr__(self, "dialect", tuple(self.dialect))
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)) or (
            self.weight <= 0
        ):
            raise ValueError(f"endpoint weight must be a finite number > 0, got {self.weight!r}")
        if self.api_key is not None:
            check_api_key(self.api_key, f"endpoint {url} api_key")


KV_EVENT_SCHEMES: Final = ("tcp://", "ipc://", "inproc://")
"""The ZMQ transports an ``Endpoint(kv_events=)`` address may name."""

RETRY_KEYWORDS: Final = ("attempts", "wait_initial", "wait_max", "wait_jitter", "retry_after_max")
""":class:`Retry`'s own keywords (numbers: a config file's ``retry`` table takes these)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """agentrt's one retry layer (there is no other: the openai client it builds has
    ``max_retries=0``).

    Retries connection errors, timeouts and HTTP 408/409/429/5xx, before a response
    body is handed to the caller. Waits ``wait_initial * 2**n`` plus up to
    ``wait_jitter`` seconds of jitter, at most ``wait_max``; a ``Retry-After`` header is
    honoured up to ``retry_after_max`` seconds.

    In tenacity's terms (as stamina's keywords are): ``attempts`` builds
    ``stop_after_attempt(attempts)``, the waits build ``wait_exponential(wait_initial,
    max=wait_max) + wait_random(0, wait_jitter)``, and every failed attempt is retried
    (``retry_if_exception_type(agentrt.AttemptError)``). tenacity's own strategies may be
    given instead: ``stop`` (say ``stop_after_attempt(5) | stop_after_delay(20)``) replaces
    ``attempts``, ``wait`` replaces the three waits, and ``retry`` chooses among the
    failed attempts (its outcome's exception is an :class:`~agentrt.AttemptError`: the
    status or the transport error). They are evaluated only when an attempt fails; a
    ``Retry-After`` still sets the least wait (up to ``retry_after_max``), and a job's
    deadline still ends the call.
    """

    attempts: int = 3
    wait_initial: float = 0.25
    wait_max: float = 8.0
    wait_jitter: float = 0.25
    retry_after_max: float = 30.0
    stop: StopStrategy | None = None
    """tenacity's stop strategy; None: ``stop_after_attempt(attempts)``."""
    wait: WaitStrategy | None = None
    """tenacity's wait strategy; None: built from ``wait_initial``, ``wait_max``,
    ``wait_jitter``."""
    retry: RetryStrategy | None = None
    """tenacity's retry strategy; None: every failed attempt."""
    _built: tuple[StopStrategy, WaitStrategy, RetryStrategy] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts must be an int >= 1, got {self.attempts!r}")
        for name in RETRY_KEYWORDS[1:]:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Retry.{name} must be a finite number >= 0, got {value!r}")
        for name in ("stop", "wait", "retry"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(
                    f"Retry.{name} must be a tenacity {name} strategy (a callable of "
                    f"tenacity.RetryCallState), got {value!r}"
                )

    def strategies(self) -> tuple[StopStrategy, WaitStrategy, RetryStrategy]:
        """The stop, wait and retry strategies, as given or built from the keywords
        (tenacity is imported here, at a call's first failed attempt, not before)."""
        built = self._built
        if built is None:
            import tenacity

            from ._errors import AttemptError

            wait: WaitStrategy = tenacity.wait_exponential(
                multiplier=self.wait_initial, max=self.wait_max
            )
            if self.wait_jitter:
                wait = wait + tenacity.wait_random(0.0, self.wait_jitter)
            built = (
                tenacity.stop_after_attempt(self.attempts) if self.stop is None else self.stop,
                wait if self.wait is None else self.wait,
                tenacity.retry_if_exception_type(AttemptError)
                if self.retry is None
                else self.retry,
            )
            object.__setattr__(self, "_built", built)
        return built


DEFAULT_RETRY: Final = Retry()
"""The retry settings a runtime uses unless given others: :class:`Retry` with its
defaults."""
