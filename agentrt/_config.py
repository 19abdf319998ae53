"""Configuration value objects: endpoints and the retry policy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .dialects import DialectSpec

__all__ = [
    "DEFAULT_RETRY",
    "Endpoint",
    "Retry",
]


def _check_url(url: str) -> str:
    if not isinstance(url, str):
        raise TypeError(f"endpoint URL must be a str, got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"endpoint URL {url!r} needs an http:// or https:// scheme and a host, "
            "e.g. 'http://127.0.0.1:8000/v1'"
        )
    if any(c in url for c in "\r\n\t "):
        raise ValueError(f"endpoint URL {url!r} contains whitespace")
    return url.rstrip("/")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One OpenAI-compatible server (a replica), by base URL.

    ``dialect`` overrides the runtime's dialect for this endpoint; ``api_key`` overrides
    the runtime's key (it never appears in ``repr``, logs or reports); ``weight`` scales
    the endpoint's share of new sessions under load-based routing; ``send_priority``
    overrides the runtime's ``send_priority`` (engine-level priorities, only for servers
    started with priority scheduling).
    """

    url: str
    dialect: DialectSpec | None = None
    api_key: str | None = field(default=None, repr=False)
    weight: float = 1.0
    send_priority: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", _check_url(self.url))
        if isinstance(self.dialect, list):
            object.__setattr__(self, "dialect", tuple(self.dialect))
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)) or (
            self.weight <= 0
        ):
            raise ValueError(f"endpoint weight must be a finite number > 0, got {self.weight!r}")
        if self.api_key is not None and any(c in self.api_key for c in "\r\n"):
            raise ValueError("endpoint api_key contains CR/LF")


@dataclass(frozen=True, slots=True)
class Retry:
    """agentrt's one retry layer (there is no other: the openai client it builds has
    ``max_retries=0``).

    Retries connection errors, timeouts and HTTP 408/409/429/5xx, before a response
    body is handed to the caller. Waits ``wait_initial * 2**n`` plus up to
    ``wait_jitter`` seconds of jitter, at most ``wait_max``; a ``Retry-After`` header is
    honoured up to ``retry_after_max`` seconds.
    """

    attempts: int = 3
    wait_initial: float = 0.25
    wait_max: float = 8.0
    wait_jitter: float = 0.25
    retry_after_max: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("wait_initial", "wait_max", "wait_jitter", "retry_after_max"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Retry.{name} must be a finite number >= 0, got {value!r}")


DEFAULT_RETRY: Final = Retry()
