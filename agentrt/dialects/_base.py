"""The dialect contract: a small pure function from call metadata to wire fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from .._protocol import CallMetadata

__all__ = ["Dialect", "DialectOptions", "DialectSpec", "Encoding"]


@dataclass(frozen=True, slots=True)
class DialectOptions:
    """Switches that change what a dialect may send."""

    send_priority: bool = False
    """Send engine-level priority fields. Off by default: some servers reject them."""


@dataclass(slots=True)
class Encoding:
    """What a dialect adds to one request: headers, and fields merged into the JSON body."""

    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    """Merged into the request body; nested dicts are merged key by key, and a field
    the caller already set is never overwritten."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine family's way of reading who a call belongs to."""

    name: str
    encode: Callable[[CallMetadata, DialectOptions], Encoding]
    echo_headers: tuple[str, ...] = ()
    """Response headers to remember per session and hand back in ``CallMetadata.echo``
    on the session's later calls (lower case)."""
    doc: str = ""


DialectSpec: TypeAlias = str | Dialect | Sequence[str | Dialect]
"""A dialect by name, a :class:`Dialect`, or several of either (combined in order)."""
