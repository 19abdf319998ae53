"""The dialect contract: a small pure function from call metadata to wire fields."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from .._protocol import CallMetadata

__all__ = ["Dialect", "DialectOptions", "DialectSpec", "Encoding", "SessionEnd"]

_PATH_RE: Final = re.compile(r"/[A-Za-z0-9_./-]{0,127}")
_KEY_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


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
class SessionEnd:
    """A request a server wants when an agentrt session that called it ends:
    ``POST <endpoint root><path>`` (the endpoint's URL less a trailing ``/v1``), with the
    session id in the query parameter ``param`` or in a JSON body ``{json_key: id}``.

    A :class:`Dialect` lists the ones it wants in ``session_ends``; the runtime sends each
    to the endpoints of that dialect a session's calls went to, from a task of its own,
    when the session's block ends, and before its own block returns (a failed request is
    dropped: the server then expires the session itself)."""

    path: str
    param: str | None = None
    json_key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not _PATH_RE.fullmatch(self.path):
            raise ValueError(
                f"a session end's path must start with '/' and hold at most 128 letters, "
                f"digits, '_', '-', '.' or '/', got {self.path!r}"
            )
        if (self.param is None) == (self.json_key is None):
            raise ValueError("a session end carries the id in exactly one of param, json_key")
        key = self.param if self.param is not None else self.json_key
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(f"a session end's parameter or JSON key is not a name: {key!r}")

    def send_kwargs(self, session_id: str) -> dict[str, Any]:
        """The ``httpx`` keyword arguments that carry ``session_id``."""
        if self.param is not None:
            return {"params": {self.param: session_id}}
        return {"json": {self.json_key: session_id}}


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine family's way of reading who a call belongs to."""

    name: str
    encode: Callable[[CallMetadata, DialectOptions], Encoding]
    echo_headers: tuple[str, ...] = ()
    """Response headers to remember per session and hand back in ``CallMetadata.echo``
    on the session's later calls (lower case)."""
    doc: str = ""
    session_ends: tuple[SessionEnd, ...] = ()
    """Requests the runtime sends when a session that called an endpoint of this dialect
    ends (:class:`SessionEnd`)."""


DialectSpec: TypeAlias = str | Dialect | Sequence[str | Dialect]
"""A dialect by name, a :class:`Dialect`, or several of either (combined in order)."""
