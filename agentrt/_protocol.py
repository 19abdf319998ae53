"""The agentrt metadata protocol: what every call carries, and how it is validated.

The spec lives in ``docs/protocol.md``. This module is its single source of truth in
code: the :class:`CallMetadata` model, the header names, and the validation of every
value that reaches a header. It depends on no HTTP library.
"""

from __future__ import annotations

import math
import re
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "HEADER_PREFIX",
    "MAX_ID_BYTES",
    "PROTOCOL_VERSION",
    "CallMetadata",
    "agentrt_headers",
    "validate_id",
    "validate_nonneg",
]

PROTOCOL_VERSION: Final = "1"
HEADER_PREFIX: Final = "x-agentrt-"
MAX_ID_BYTES: Final = 128

# Header names (lower case; HTTP header names are case-insensitive).
H_VERSION: Final = "x-agentrt-version"
H_JOB: Final = "x-agentrt-job-id"
H_SESSION: Final = "x-agentrt-session-id"
H_PROGRAM: Final = "x-agentrt-program-id"
H_PARENT: Final = "x-agentrt-parent-session-id"
H_CALL: Final = "x-agentrt-call-id"
H_TURN: Final = "x-agentrt-turn"
H_FIRST_TURN: Final = "x-agentrt-first-turn"
H_SERVICE_S: Final = "x-agentrt-service-s"
H_SERVICE_TOKENS: Final = "x-agentrt-service-tokens"
H_IDLE_EXPECTED: Final = "x-agentrt-idle-expected-s"
H_IDLE: Final = "x-agentrt-idle-s"
H_IDLE_DECLARED: Final = "x-agentrt-idle-declared-s"
H_PRIORITY: Final = "x-agentrt-priority"

# Printable ASCII except space-like control characters; ids go into headers verbatim.
_ID_RE: Final = re.compile(r"^[\x21-\x7e]+$")


def validate_id(value: str, what: str) -> str:
    """Check an id that will travel in a header: printable ASCII, no CR/LF, bounded."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    encoded = value.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_ID_BYTES:
        raise ValueError(f"{what} is {len(encoded)} bytes long; the limit is {MAX_ID_BYTES} bytes")
    if not _ID_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value[:40]!r} contains a space, CR/LF, a non-printable or a non-ASCII "
            "character; ids travel in HTTP headers and must be printable ASCII"
        )
    return value


def validate_nonneg(value: float | None, what: str) -> float | None:
    """Check a duration: a finite number >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


class CallMetadata(BaseModel):
    """Everything one call says about who it belongs to (protocol version 1).

    Dialects map these facts onto the fields each engine or router reads.
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    job_id: str
    session_id: str
    program_id: str
    parent_session_id: str | None = None
    turn: int
    """0-based index of this call within its session."""
    first_turn: bool
    service_s: float
    """LLM seconds the program had received before this call (attained service)."""
    service_tokens: int
    """Prompt + completion tokens the program had received before this call."""
    idle_expected_s: float | None = None
    """Idle time the session expects after this call's reply (a tool wait), if known."""
    idle_s: float | None = None
    """Actual idle time between the session's previous reply and this call."""
    idle_declared_s: float | None = None
    """What the tool waits of that idle period declared with ``expected_s`` (their sum),
    so a server can compare declared and actual idle."""
    priority: int | None = None
    """Scheduling class, lower runs first; None when priorities are not sent."""
    expected_output_tokens: int | None = None
    """``max_tokens`` / ``max_completion_tokens`` of the request, when given."""
    echo: dict[str, str] = Field(default_factory=dict)
    """Response headers the session's dialect asked to echo back (e.g. llm-d's token)."""


MAX_SECONDS: Final = 1e9
"""Durations in headers are clamped to [0, MAX_SECONDS]: at most 13 characters."""


def _fmt_s(value: float) -> str:
    return f"{min(max(value, 0.0), MAX_SECONDS):.3f}"


def agentrt_headers(meta: CallMetadata) -> dict[str, str]:
    """agentrt's own headers for one call: the ``generic`` dialect, sent by every dialect."""
    headers = {
        H_VERSION: PROTOCOL_VERSION,
        H_CALL: meta.call_id,
        H_JOB: meta.job_id,
        H_SESSION: meta.session_id,
        H_PROGRAM: meta.program_id,
        H_TURN: str(meta.turn),
        H_FIRST_TURN: "1" if meta.first_turn else "0",
        H_SERVICE_S: _fmt_s(meta.service_s),
        H_SERVICE_TOKENS: str(meta.service_tokens),
    }
    if meta.parent_session_id is not None:
        headers[H_PARENT] = meta.parent_session_id
    if meta.idle_expected_s is not None:
        headers[H_IDLE_EXPECTED] = _fmt_s(meta.idle_expected_s)
    if meta.idle_s is not None:
        headers[H_IDLE] = _fmt_s(meta.idle_s)
    if meta.idle_declared_s is not None:
        headers[H_IDLE_DECLARED] = _fmt_s(meta.idle_declared_s)
    if meta.priority is not None:
        headers[H_PRIORITY] = str(meta.priority)
    return headers
