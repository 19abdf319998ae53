"""The ``generic`` dialect (agentrt's own headers only) and the helpers every dialect uses.

Every dialect starts from :func:`base_encoding`, so agentrt's ``x-agentrt`` header
always travels, and adds its own fields on top. Header names are emitted in lower case
so that two dialects naming the same header in different cases merge into one entry.
"""

from __future__ import annotations

import re
from typing import Final

from .._protocol import HEADER, CallMetadata, agentrt_headers
from ._base import Dialect, DialectOptions, Encoding

__all__ = [
    "GENERIC",
    "INT32_MAX",
    "INT32_MIN",
    "MAX_HEADER_VALUE_BYTES",
    "base_encoding",
    "check_header_name",
    "check_header_value",
    "clamp",
    "echo_into",
]

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1

MAX_HEADER_VALUE_BYTES: Final = 1024
"""Bound on a header value that is not an agentrt id (e.g. an echoed server token)."""

MAX_HEADER_NAME_BYTES: Final = 64

# RFC 9110 token characters. Both patterns are used with fullmatch: "$" would accept a
# trailing "\n".
_TOKEN_RE: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII and inner spaces; no CR, LF, TAB or other control characters.
_VALUE_RE: Final = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")

# Headers a dialect must never set: transport framing, auth and agentrt's own namespace
# (``x-agentrt`` and ``x-agentrt-*``).
_AGENTRT_PREFIX: Final = HEADER + "-"
_RESERVED_NAMES: Final = frozenset(
    {
        "authorization",
        "connection",
        "content-length",
        "content-type",
        "cookie",
        "host",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def check_header_name(name: str, what: str = "header name") -> str:
    """Validate a header name chosen by the user; return it in lower case."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    if not name or len(name) > MAX_HEADER_NAME_BYTES or not _TOKEN_RE.fullmatch(name):
        raise ValueError(
            f"{what} {name[:40]!r} is not a valid HTTP header name (1 to "
            f"{MAX_HEADER_NAME_BYTES} token characters, no spaces, CR/LF or ':')"
        )
    lowered = name.lower()
    if lowered in _RESERVED_NAMES or lowered == HEADER or lowered.startswith(_AGENTRT_PREFIX):
        raise ValueError(f"{what} {name!r} is reserved and cannot carry agentrt metadata")
    return lowered


def check_header_value(
    value: str, what: str = "header value", max_bytes: int = MAX_HEADER_VALUE_BYTES
) -> str:
    """Validate a header value that did not pass through ``validate_id``.

    Printable ASCII only (inner spaces allowed), no CR/LF or other control characters,
    at most ``max_bytes`` bytes.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if len(value) > max_bytes:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {max_bytes}")
    if not _VALUE_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value[:40]!r} is empty or contains CR/LF, a control or a non-ASCII character"
        )
    return value


def clamp(value: int, low: int, high: int) -> int:
    """Bound an integer to ``[low, high]`` (engines parse priorities into fixed-width ints)."""
    return low if value < low else high if value > high else value


def echo_into(headers: dict[str, str], meta: CallMetadata, names: tuple[str, ...]) -> None:
    """Copy the session's remembered response headers ``names`` into ``headers``.

    The values came from a server, not from the user; one that is not a safe header
    value (CR/LF, control characters, over :data:`MAX_HEADER_VALUE_BYTES`) is dropped
    rather than failing the call.
    """
    if not meta.echo:
        return
    echo = {k.lower(): v for k, v in meta.echo.items()}
    for name in names:
        value = echo.get(name)
        if value is None:
            continue
        try:
            headers[name] = check_header_value(value, f"echoed header {name!r}")
        except (TypeError, ValueError):
            continue


def base_encoding(meta: CallMetadata) -> Encoding:
    """agentrt's own header for one call, as a fresh :class:`Encoding` to add to."""
    return Encoding(headers=agentrt_headers(meta))


def _encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
    return base_encoding(meta)


GENERIC: Final = Dialect(
    name="generic",
    encode=_encode,
    doc="agentrt's own x-agentrt header only; no engine-specific fields.",
)
"""The ``generic`` dialect: agentrt's own ``x-agentrt`` header and nothing else."""
