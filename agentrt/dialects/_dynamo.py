"""The ``dynamo`` dialect: an NVIDIA Dynamo frontend.

- headers ``X-Dynamo-Session-ID`` (always) and ``X-Dynamo-Parent-Session-ID`` (sub-agent
  sessions only): Dynamo's canonical session identity, normalized into its
  ``agent_context``;
- body ``nvext.agent_hints``: ``osl`` (expected output tokens, here the request's
  ``max_tokens`` when given, so an upper bound) and, only with
  ``DialectOptions(send_priority=True)``, ``priority``. Dynamo's priority is
  higher = more important, the inverse of agentrt's lower-runs-first, so
  :func:`dynamo_priority` negates it (0 stays 0). No other hint is sent: some Dynamo
  versions reject unknown ``agent_hints`` fields.
"""

from __future__ import annotations

from typing import Any, Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import INT32_MAX, INT32_MIN, base_encoding, clamp

__all__ = ["DYNAMO", "dynamo_priority"]

_UINT32_MAX: Final = 2**32 - 1


def dynamo_priority(priority: int) -> int:
    """agentrt priority (lower runs first) to Dynamo's (higher = more important, i32)."""
    return clamp(-priority, INT32_MIN + 1, INT32_MAX)


def _encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
    enc = base_encoding(meta)
    enc.headers["x-dynamo-session-id"] = meta.session_id
    if meta.parent_session_id is not None:
        enc.headers["x-dynamo-parent-session-id"] = meta.parent_session_id
    hints: dict[str, Any] = {}
    if options.send_priority and meta.priority is not None:
        hints["priority"] = dynamo_priority(meta.priority)
    if meta.expected_output_tokens is not None and meta.expected_output_tokens >= 0:
        hints["osl"] = min(meta.expected_output_tokens, _UINT32_MAX)
    if hints:
        enc.body["nvext"] = {"agent_hints": hints}
    return enc


DYNAMO: Final = Dialect(
    name="dynamo",
    encode=_encode,
    doc="NVIDIA Dynamo: X-Dynamo-Session-ID, X-Dynamo-Parent-Session-ID, "
    "nvext.agent_hints.osl and (with send_priority) priority = -agentrt priority.",
)
